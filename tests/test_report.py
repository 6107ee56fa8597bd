"""`dpsql ledger report` from a seeded ledger: the spending per analyst, its queries, what is left."""

from __future__ import annotations

import contextlib
import json
import sys

import pytest

from dpsql import errors
from dpsql.accounting import Cost, Ledger
from dpsql.cli import main
from dpsql.report import ledger_report, render_html


@pytest.fixture
def seeded(base_url, engine):
    ledger = Ledger(base_url)
    for name in ("reporter", "idle"):
        with contextlib.suppress(errors.UnknownAnalyst):  # from an earlier test
            ledger.remove(name)
    ledger.add_analyst("reporter", 10.0, 1e-5)
    ledger.add_analyst("idle", 1.0, 0.0)
    for i in range(6):
        ledger.charge("reporter", Cost.pure(0.5), f"key{i}", f"SELECT COUNT(*) FROM people WHERE age > {i}")
    ledger.charge("reporter", Cost(1.0, 1e-6, 0.5, 1e-6), "keyg", "SELECT state, COUNT(*) FROM people GROUP BY state")
    yield ledger
    ledger.close()


def test_the_report_lists_spending_queries_and_what_is_left(seeded):
    report = ledger_report(seeded, "reporter")
    (entry,) = report["analysts"]
    assert [c["epsilon"] for c in entry["charges"]] == [0.5] * 6 + [1.0]
    assert entry["charges"][-1]["query"] == "SELECT state, COUNT(*) FROM people GROUP BY state"
    budget = entry["budget"]
    assert budget["epsilon_spent"] == pytest.approx(4.0) and budget["epsilon_left"] == pytest.approx(6.0)
    assert budget["account"] == "basic" and budget["delta_taken"] == pytest.approx(1e-6)
    assert entry["typical_epsilon"] == 0.5
    assert entry["queries_left_at_typical_epsilon"] >= 12  # 6 / 0.5 under basic composition, more under PLD
    assert "answer" not in json.dumps(report)
    everyone = ledger_report(seeded)
    idle = next(a for a in everyone["analysts"] if a["analyst"] == "idle")
    assert idle["charges"] == [] and idle["queries_left_at_typical_epsilon"] is None


def test_the_html_page_has_the_table_a_plot_and_escaped_queries(seeded):
    seeded.charge("reporter", Cost.pure(0.1), "keyx", "SELECT COUNT(*) FROM people WHERE state = '<b>'")
    page = render_html(ledger_report(seeded, "reporter"))
    assert page.startswith("<!doctype html>") and "data:image/png;base64," in page
    assert "&lt;b&gt;" in page and "<b>" not in page
    assert "4.1 of 10" in page


def test_the_command_writes_html_or_prints_json(seeded, base_url, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["ledger", "report", "--database", base_url, "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and "reporter" in out.read_text()
    assert main(["ledger", "report", "--database", base_url, "--analyst", "reporter", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["analysts"][0]["analyst"] == "reporter"


def test_without_matplotlib_the_page_is_written_without_plots_and_says_what_to_install(seeded, base_url, tmp_path,
                                                                                         capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "report.html"
    assert main(["ledger", "report", "--database", base_url, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "wrote" in captured.out and "pip install 'dpsql[report]'" in captured.err
    page = out.read_text()
    assert "reporter" in page and "data:image/png" not in page and "need matplotlib" in page
