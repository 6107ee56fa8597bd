"""No behaviour change by accident: every query of the golden corpus still gets the same canonical form, plan,
rewritten SQL, mechanisms and costs, or the same error (see tests/golden.py; the corpus is tests/golden/*.sql;
re-record with `python -m tests.golden` after a deliberate change and review the diff).

The replay is pure computation (no database), split over one process per core, and it starts as soon as the
test is collected (tests/conftest.py), so it runs beside the tests before it instead of after them: on CI's two
cores this keeps `pytest -m unit` under a minute. Under pytest-xdist it starts in the worker sent this file, one
process beside the other worker."""

from __future__ import annotations

import difflib
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor

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


_started: dict[str, object] = {}  # the pool, the entries and their shares' futures, once started


def start_replay(alone: bool = True) -> None:
    """Start replaying the corpus in the background (once); the test below waits for it. Beside other tests it
    leaves one core to them."""
    if _started:
        return
    corpus = golden.load()
    entries, schemas = corpus["entries"], corpus["schemas"]
    workers = max(1, min((os.cpu_count() or 1) - (not alone), 4))
    shares = [entries[i::workers] for i in range(workers)]  # interleaved: each share holds every construct
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    _started.update(pool=pool, entries=entries, futures=[pool.submit(_changed, share, schemas) for share in shares])


def stop_replay() -> None:
    """End the workers, also when the test never ran (a failure before it, or -x)."""
    if _started:
        _started.pop("pool").shutdown(wait=False, cancel_futures=True)
        _started.clear()


def test_every_golden_query_is_answered_as_recorded() -> None:
    start_replay(alone="PYTEST_XDIST_WORKER" not in os.environ)  # under xdist another worker runs beside it
    entries: list[dict] = _started["entries"]
    futures: list[Future] = _started["futures"]
    assert len(entries) > 500
    try:
        changed = [c for future in futures for c in future.result()]
    finally:
        stop_replay()
    report = [f"tests/golden/{entry['file']}.sql: {entry['sql']}\n" + "\n".join(
        line[:300] for line in difflib.unified_diff(entry["text"].split("\n"), actual.split("\n"), "was", "now",
                                                     lineterm="", n=0)) for entry, actual in changed[:5]]
    assert not changed, f"{len(changed)} of {len(entries)} golden queries changed:\n" + "\n".join(report)
