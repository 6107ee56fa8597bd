"""How the command line prints results: psql-like tables, CSV and JSON.

Tables are for people (numbers right-aligned as psql does, each noisy column followed by its accuracy);
CSV and JSON are for scripts: one column per value and per accuracy measure (`<name>_ci_low`, `<name>_ci_high`,
and `<name>_rank_error` or `<name>_count_gap` where the value has one), and nothing else on stdout.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from dpsql.accounting.budget import Budget, Cost, group_guarantee
from dpsql.answer import Answer
from dpsql.postprocess import Accuracy, describe_bounds_effect, format_value

FORMATS = ("table", "csv", "json")
ACCURACY_HEADERS = {"interval": "95% CI", "rank_error": "±ranks (95%)", "count_gap": "count gap (95%)"}
ACCURACY_NOTES = {
    "rank_error": "±ranks (95%): with probability 95% the value is at most this many ranks from the asked quantile",
    "count_gap": "count gap (95%): with probability 95% the chosen key's count is within this of the largest count "
                 "left to choose from",
}


def render_answer(answer: Answer, fmt: str, precision: str = "noise") -> str:
    """The answer in `fmt`; a table ends with the row count, what the intervals mean and the cost. A table shows
    each noisy number to the digits its interval allows (`precision = "noise"`) or in full ("full"); CSV and JSON
    always carry full precision."""
    if fmt != "table":
        return render_rows(*_measured(answer), fmt, cost=answer.cost())
    headers, columns, kinds_seen = [], [], []
    for i, name in enumerate(answer.names):
        headers.append(name)
        accuracy = [acc[i] for acc in answer.accuracy]
        digits = [_decimals(acc) if precision == "noise" else None for acc in accuracy]
        columns.append([_rounded(row[i], d) for row, d in zip(answer.rows, digits, strict=True)])
        kind = _accuracy_kind(accuracy)
        if kind is not None:
            headers.append(ACCURACY_HEADERS[kind])
            columns.append([_accuracy_cell(acc, kind, d) for acc, d in zip(accuracy, digits, strict=True)])
            kinds_seen.append(kind)
    rows = [tuple(column[r] for column in columns) for r in range(len(answer.rows))]
    lines = [table(headers, rows)]
    lines += [f"95% CI: {answer.intervals_cover}" if kind == "interval" else ACCURACY_NOTES[kind]
              for kind in dict.fromkeys(kinds_seen)]
    if answer.bounds_effect is not None:
        lines += describe_bounds_effect(answer.bounds_effect)
    lines += [f"Note: {note}" for note in answer.notes]
    lines.append(cost_line(answer))
    return "\n".join(lines)


def render_rows(names: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, cost: dict | None = None) -> str:
    """Rows in `fmt`: a psql table with its row count, CSV with a header line, or one JSON object."""
    if fmt == "table":
        return table(names, rows)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([["" if v is None else format_value(v) if isinstance(v, list) else v for v in row]
                          for row in rows])
        return out.getvalue().rstrip("\n")
    document = {"columns": list(names), "rows": [dict(zip(names, row, strict=True)) for row in rows]}
    if cost is not None:
        document.update(cost)
    return json.dumps(document, default=_json_value, ensure_ascii=False, indent=1)


def _json_value(value: Any) -> Any:
    """A numeric as a JSON number (as PostgreSQL's row_to_json writes it), anything else JSON lacks as its text."""
    if isinstance(value, Decimal) and value.is_finite():
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """psql's aligned format: headers centred, numbers right-aligned, text left-aligned, then `(n rows)`."""
    cells = [[format_value(v) for v in row] for row in rows]
    numeric = [bool(rows) and all(isinstance(row[i], int | float | Decimal) and not isinstance(row[i], bool)
                                  for row in rows if row[i] is not None) for i in range(len(headers))]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str], align) -> str:
        return "|".join(f" {align(i, v, w)} " for i, (v, w) in enumerate(zip(values, widths, strict=True))).rstrip()

    lines = [line(headers, _centre), "+".join("-" * (w + 2) for w in widths)]
    lines += [line(row, lambda i, v, w: v.rjust(w) if numeric[i] else v.ljust(w)) for row in cells]
    lines.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return "\n".join(lines)


def budget_rows(budgets: Sequence[Budget], next_epsilon: float | None = None,
                group_size: int = 1) -> tuple[list[str], list[tuple]]:
    """One row per analyst: spent and left, the account in use and both accounts' totals, (with `next_epsilon`)
    what one more query at that ε would spend, and (with `group_size` > 1) the guarantee to such groups."""
    names = ["analyst", "epsilon_total", "epsilon_spent", "epsilon_left", "delta_total", "delta_taken",
             "delta_left", "account", "guarantee_delta", "rho", "basic_epsilon", "basic_delta"]
    if next_epsilon is not None:
        names.append(f"next_query_at_{next_epsilon:g}")
    if group_size > 1:
        names += [f"group_{group_size}_epsilon", f"group_{group_size}_delta"]
    rows = []
    for b in budgets:
        row = (b.analyst, b.epsilon_total, _six(b.epsilon_spent), _six(b.epsilon_left), b.delta_total,
               b.delta_committed, b.delta_left, b.account,
               b.delta_spent, _six(b.rho), _six(b.epsilon_basic), b.delta_basic)
        if next_epsilon is not None:
            row += (_six(b.epsilon_after(Cost.pure(next_epsilon))),)
        if group_size > 1:
            group_epsilon, group_delta = group_guarantee(b.epsilon_spent, b.delta_spent, group_size)
            row += (_six(group_epsilon), group_delta)
        rows.append(row)
    return names, rows


def _six(value: float) -> float:
    return round(value, 6)


def _centre(i: int, value: str, width: int) -> str:
    return value.center(width)


def _measured(answer: Answer) -> tuple[list[str], list[tuple]]:
    measured = answer.with_intervals(every_measure=True)
    return measured.names, measured.rows


def _accuracy_kind(accuracies: Sequence[Accuracy | None]) -> str | None:
    present = [a for a in accuracies if a is not None]
    if not present:
        return None
    if any(a.rank_error is not None for a in present):
        return "rank_error"
    if any(a.count_gap is not None for a in present):
        return "count_gap"
    return "interval"


def _accuracy_cell(accuracy: Accuracy | None, kind: str, decimals: int | None = None) -> str:
    if accuracy is None:
        return ""
    if kind == "rank_error":
        return "" if accuracy.rank_error is None else f"±{accuracy.rank_error:.3g}"
    if kind == "count_gap":
        return "" if accuracy.count_gap is None else f"{accuracy.count_gap:.3g}"
    if accuracy.ci_low is None:
        return ""
    low, high = (format_value(_rounded(v, decimals)) for v in (accuracy.ci_low, accuracy.ci_high))
    return f"[{low}, {high}]"


SHOWN_DIGITS = 2  # of the interval's half-width: a value is shown to the digits its noise leaves meaningful


def _decimals(accuracy: Accuracy | None) -> int | None:
    """The decimals that show a noisy value to the precision of its 95% interval: two significant digits of the
    interval's half-width (±1,234 rounds to hundreds, ±0.042 to thousandths); None where there is no interval."""
    if accuracy is None or accuracy.ci_low is None or accuracy.ci_high is None:
        return None
    half = (accuracy.ci_high - accuracy.ci_low) / 2
    if not math.isfinite(half) or half <= 0:
        return None
    return SHOWN_DIGITS - 1 - math.floor(math.log10(half))


def shown(value: Any, accuracy: Accuracy | None) -> str:
    """A noisy value as the CLI shows it: to the precision its 95% interval allows (`_decimals`)."""
    return format_value(_rounded(value, _decimals(accuracy)))


def _rounded(value: Any, decimals: int | None) -> Any:
    """A float or numeric rounded to `decimals` (an integer when they are not positive); anything else as it
    is."""
    if decimals is None or not isinstance(value, float | Decimal) or not math.isfinite(value):
        return value
    rounded = round(value, decimals)
    return int(rounded) if decimals <= 0 else rounded


def cost_line(answer: Answer) -> str:
    """What the answer cost and what is left, in one line (on stderr when stdout carries CSV or JSON)."""
    line = ("cached answer: no budget spent" if answer.cached
            else f"spent ε = {answer.epsilon:.4g}, δ = {answer.delta:.3g}")
    if answer.budget is not None:
        line += f"; budget left: ε = {answer.budget.epsilon_left:.4g}, δ = {answer.budget.delta_left:.3g}"
    return line
