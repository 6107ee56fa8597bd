"""`dpsql ledger report`: per analyst, what was spent when and by which queries, what is left, and how many more
queries that leaves at the analyst's typical ε; as JSON, or as one HTML page with plots for people.

The report reads only the ledger: budgets, and each charge's time, cost and the query's canonical text. No answer
and no value from the data is in it.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import statistics
from typing import Any

from dpsql.accounting import Budget, Cost, Ledger


def ledger_report(ledger: Ledger, analyst: str | None = None) -> dict[str, Any]:
    """The report as a JSON-able document."""
    budgets = [ledger.budget(analyst)] if analyst else ledger.analysts()
    charges = ledger.charges(analyst)
    analysts = []
    for budget in budgets:
        own = [c for c in charges if c[0] == budget.analyst]
        typical = statistics.median(c[2] for c in own) if own else None
        analysts.append({
            "analyst": budget.analyst,
            "budget": _budget(budget),
            "typical_epsilon": typical,
            "queries_left_at_typical_epsilon": None if typical is None else budget.answers_left(Cost.pure(typical)),
            "charges": [{"at": at.isoformat(), "epsilon": epsilon, "delta": delta, "query": text, "status": status}
                        for _, at, epsilon, delta, text, status in own],
        })
    return {"generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "analysts": analysts}


def _budget(budget: Budget) -> dict[str, Any]:
    return {"epsilon_total": budget.epsilon_total, "delta_total": budget.delta_total,
            "epsilon_spent": budget.epsilon_spent, "epsilon_left": budget.epsilon_left,
            "delta_taken": budget.delta_committed, "delta_left": budget.delta_left, "account": budget.account,
            "guarantee": [budget.epsilon_spent, budget.delta_spent],
            "accounts": {"basic": [budget.epsilon_basic, budget.delta_basic], "zCDP": budget.epsilon_zcdp}}


PLOTS_NEED = "the plots of ε over time need matplotlib: pip install 'dpsql[report]'"


def can_plot() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def render_html(report: dict[str, Any]) -> str:
    """One self-contained page: a table of budgets, then per analyst a plot of ε over time (where matplotlib is
    installed; the page says so otherwise) and the charges."""
    plots = can_plot()
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>dpsql ledger report</title>{STYLE}"
             f"</head><body><h1>dpsql ledger report</h1><p>Generated {html.escape(report['generated_at'])}. Queries "
             "appear as dpsql checked them (canonical text); no answer or data value is in this report.</p>",
             _budget_table(report["analysts"])]
    if not plots:
        parts.append(f"<p>{html.escape(PLOTS_NEED)}.</p>")
    for entry in report["analysts"]:
        parts.append(f"<h2>{html.escape(entry['analyst'])}</h2>")
        if entry["charges"] and plots:
            parts.append(f"<img alt='ε spent over time' src='data:image/png;base64,{_plot(entry)}'>")
        parts.append(_charges_table(entry["charges"]))
    parts.append("</body></html>")
    return "\n".join(parts)


STYLE = ("<style>body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}td.q{text-align:left;font-family:monospace}"
         "</style>")


def _budget_table(analysts: list[dict[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(a['analyst'])}</td><td>{b['epsilon_spent']:.4g} of {b['epsilon_total']:.4g}</td>"
        f"<td>{b['epsilon_left']:.4g}</td><td>{b['delta_taken']:.3g} of {b['delta_total']:.3g}</td>"
        f"<td>{b['account']}</td><td>({b['guarantee'][0]:.4g}, {b['guarantee'][1]:.3g})</td>"
        f"<td>{len(a['charges'])}</td><td>{_maybe(a['typical_epsilon'], '.3g')}</td>"
        f"<td>{_maybe(a['queries_left_at_typical_epsilon'], 'd')}</td></tr>"
        for a in analysts for b in [a["budget"]])
    return ("<table><tr><th>analyst</th><th>ε spent</th><th>ε left</th><th>δ taken</th><th>account</th>"
            "<th>guarantee (ε, δ)</th><th>charges</th><th>typical ε</th><th>queries left at it</th></tr>"
            f"{rows}</table>")


def _charges_table(charges: list[dict[str, Any]]) -> str:
    rows = "".join(f"<tr><td>{html.escape(c['at'][:19])}</td><td>{c['epsilon']:.4g}</td><td>{c['delta']:.3g}</td>"
                   f"<td>{STATUS[c['status']]}</td>"
                   f"<td class='q'>{html.escape(c['query'] or '(recorded before query texts were kept)')}</td></tr>"
                   for c in charges)
    return f"<table><tr><th>at (UTC)</th><th>ε</th><th>δ</th><th>outcome</th><th>query</th></tr>{rows}</table>"


STATUS = {"answered": "answered", "failed": "failed (charged: the outcome was released)",
          "undelivered": "not delivered (pays for the next attempt)"}


def _maybe(value: Any, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _plot(entry: dict[str, Any]) -> str:
    """ε charged, summed over time (basic composition) against the budget, as a base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    times = [datetime.datetime.fromisoformat(c["at"]) for c in entry["charges"]]
    spent, total = [], 0.0
    for charge in entry["charges"]:
        total += charge["epsilon"]
        spent.append(total)
    figure, axes = pyplot.subplots(figsize=(8, 3))
    axes.step(times, spent, where="post", label="ε charged (sum)")
    axes.axhline(entry["budget"]["epsilon_total"], color="grey", linestyle="--", label="ε budget")
    axes.axhline(entry["budget"]["epsilon_spent"], color="green", linestyle=":",
                 label=f"ε spent ({entry['budget']['account']} account)")
    axes.set_ylabel("ε")
    axes.legend(loc="upper left")
    figure.autofmt_xdate()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    pyplot.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()
