"""No behaviour change by accident: every query of the golden corpus still gets the same canonical form, plan,
rewritten SQL, mechanisms and costs, or the same error (see tests/golden.py; re-record with
`python -m tests.golden` after a deliberate change and review the diff)."""

from __future__ import annotations

import json

from tests import golden


def test_every_golden_query_is_answered_as_recorded() -> None:
    corpus = golden.load()
    assert len(corpus["entries"]) > 500
    changed = []
    for entry in corpus["entries"]:
        actual = golden.replay({**entry, "schema": corpus["schemas"][entry["schema"]]})
        if actual != entry["expected"]:
            changed.append((entry, actual))
    report = [f"{entry['sql']}\n  field(s) changed: "
              + ", ".join(sorted(k for k in {*actual, *entry["expected"]} if actual.get(k) != entry["expected"].get(k)))
              + "\n  was: " + json.dumps(entry["expected"])[:600] + "\n  now: " + json.dumps(actual)[:600]
              for entry, actual in changed[:5]]
    assert not changed, f"{len(changed)} of {len(corpus['entries'])} golden queries changed:\n" + "\n".join(report)
