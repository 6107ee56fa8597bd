"""The neighbour fuzzer in CI: a few hundred seeded query and neighbour pairs per world (see tests/fuzzing.py;
`benchmarks/fuzz_neighbours.py` runs longer). A violation names its seed and query number to reproduce it."""

from __future__ import annotations

import pytest

from dpsql.backends import PostgresBackend
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.schema import parse_schema
from tests import fuzzing

QUERIES = {"unit": 300, "row": 150}


@pytest.fixture(scope="module", params=sorted(fuzzing.WORLDS))
def world(request, fuzz_world):
    name = request.param
    base, neighbours = fuzz_world(name)
    engine = Engine(Settings(database=base), parse_schema(fuzzing.WORLDS[name].schema))
    backends = {n: PostgresBackend(url, max_connections=1) for n, url in neighbours.items()}
    base_backend = PostgresBackend(base, max_connections=1)
    yield name, engine, base_backend, backends
    for backend in [base_backend, *backends.values()]:
        backend.close()
    engine.close()


def test_fuzzed_queries_move_within_their_claims(world):
    name, engine, base, neighbours = world
    report = fuzzing.fuzz(engine, fuzzing.WORLDS[name].generate, base, neighbours, QUERIES[name], seed=2026)
    print(name, report.summary())
    assert not report.violations, "\n".join(report.violations[:20])
    assert report.pairs >= 100, report.summary()  # the grammar mostly writes what dpsql answers
