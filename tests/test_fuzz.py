"""The neighbour fuzzer in CI: a few hundred seeded query and neighbour pairs per world (see tests/fuzzing.py;
`benchmarks/fuzz_neighbours.py` runs longer). A violation names its seed and query number to reproduce it."""

from __future__ import annotations

import pytest

from tests import fuzzing

QUERIES = {"unit": 220, "row": 150}  # (CI's 20 minutes: each stop runs 1,000 a world in benchmarks)


@pytest.fixture(scope="module", params=sorted(fuzzing.WORLDS))
def world(request, fuzz_world):
    with fuzzing.open_world(request.param, *fuzz_world(request.param)) as (engine, backends):
        yield request.param, engine, backends


def test_fuzzed_queries_move_within_their_claims(world):
    name, engine, backends = world
    neighbours = {n: b for n, b in backends.items() if n != "base"}
    report = fuzzing.fuzz(engine, fuzzing.WORLDS[name].generate, backends["base"], neighbours, QUERIES[name],
                          seed=2026)
    print(name, report.summary())
    assert not report.violations, "\n".join(report.violations[:20])
    assert report.pairs >= 100, report.summary()  # the grammar mostly writes what dpsql answers
