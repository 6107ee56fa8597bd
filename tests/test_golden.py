"""No behaviour change by accident: every query of the golden corpus still gets the same canonical form, plan,
rewritten SQL, mechanisms and costs, or the same error (see tests/golden.py; the corpus is tests/golden/*.sql;
re-record with `python -m tests.golden` after a deliberate change and review the diff).

The replay is pure computation (no database), split by construct over one process per core: on CI's two cores
it takes half the time, which keeps `pytest -m unit` under a minute."""

from __future__ import annotations

import difflib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from tests import golden


def _changed(entries: list[dict], schemas: dict) -> list[tuple[dict, str]]:
    """The entries whose replay differs from their recorded block, with the new block."""
    changed = []
    for entry in entries:
        inputs = {k: entry[k] for k in golden.INPUTS if k in entry}
        expected = golden.replay({**inputs, "schema": schemas[entry["schema"]]})
        actual = golden.block({**inputs, "expected": expected})
        if actual != entry["text"]:
            changed.append((entry, actual))
    return changed


def test_every_golden_query_is_answered_as_recorded() -> None:
    corpus = golden.load()
    entries, schemas = corpus["entries"], corpus["schemas"]
    assert len(entries) > 500
    workers = min(os.cpu_count() or 1, 4)
    shares = [entries[i::workers] for i in range(workers)]  # interleaved: each share holds every construct
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        changed = [c for found in pool.map(_changed, shares, [schemas] * workers) for c in found]
    report = [f"tests/golden/{entry['file']}.sql: {entry['sql']}\n" + "\n".join(
        line[:300] for line in difflib.unified_diff(entry["text"].split("\n"), actual.split("\n"), "was", "now",
                                                     lineterm="", n=0)) for entry, actual in changed[:5]]
    assert not changed, f"{len(changed)} of {len(entries)} golden queries changed:\n" + "\n".join(report)
