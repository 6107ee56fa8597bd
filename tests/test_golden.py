"""No behaviour change by accident: every query of the golden corpus still gets the same canonical form, plan,
rewritten SQL, mechanisms and costs, or the same error (see tests/golden.py; the corpus is tests/golden/*.sql;
re-record with `python -m tests.golden` after a deliberate change and review the diff)."""

from __future__ import annotations

import difflib

from tests import golden


def test_every_golden_query_is_answered_as_recorded() -> None:
    corpus = golden.load()
    assert len(corpus["entries"]) > 500
    changed = []
    for entry in corpus["entries"]:
        inputs = {k: entry[k] for k in golden.INPUTS if k in entry}
        expected = golden.replay({**inputs, "schema": corpus["schemas"][entry["schema"]]})
        actual = golden.block({**inputs, "expected": expected})
        if actual != entry["text"]:
            changed.append((entry, actual))
    report = [f"tests/golden/{entry['file']}.sql: {entry['sql']}\n" + "\n".join(
        line[:300] for line in difflib.unified_diff(entry["text"].split("\n"), actual.split("\n"), "was", "now",
                                                     lineterm="", n=0)) for entry, actual in changed[:5]]
    assert not changed, f"{len(changed)} of {len(corpus['entries'])} golden queries changed:\n" + "\n".join(report)
