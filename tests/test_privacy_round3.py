"""Regression tests for the third privacy review (issue 35), each on a database and a neighbour that differs by one
unit, checking what the client receives; and the statistical auditor's CI set (tests/auditor.py), which bounds
from below the ε each query class spends, from many answers on both databases.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

import psycopg
import pytest

import dpsql
import dpsql.noise
import dpsql.releases
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.releases.synth import synthesize
from dpsql.schema import parse_schema
from tests import auditor
from tests.conftest import database_url

SCHEMA = {
    "privacy": {"unit": "people.person_id", "max_groups_per_unit": 2},
    "tables": {"people": {"columns": {
        "person_id": "bigint", "balance": "numeric", "state": {"type": "text", "domain": ["East", "West"]},
        "score": {"type": "double precision", "lower": -5, "upper": 5}, "code": "text",
        "visits": {"type": "integer", "lower": 0, "upper": 10}}}},
}
PEOPLE = 400
_names = itertools.count()


def _load(url: str, first: tuple | None) -> None:
    """PEOPLE people whose balance is 5.0, score 0.02 and code 'a' (char without length: equality ignores trailing
    spaces); the neighbour has one more person, stored first, spelling the same values otherwise."""
    rows = [(i, "5.0", "West" if i % 3 else "East", 0.02 + (i % 3) / 100, "a", i % 11) for i in range(1, PEOPLE + 1)]
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE people (person_id bigint PRIMARY KEY, balance numeric, state text, "
                    "score double precision, code bpchar, visits integer)")
        cur.executemany("INSERT INTO people VALUES (%s, %s::numeric, %s, %s, %s, %s)", [first] if first else [])
        cur.executemany("INSERT INTO people VALUES (%s, %s::numeric, %s, %s, %s, %s)", rows)
        cur.execute("ANALYZE")


@pytest.fixture(scope="module")
def spelled(server, tmp_path_factory) -> Iterator[dict[str, str]]:
    """URLs of the base ("base") and its spelling neighbour ("neighbour")."""
    urls = {}
    with psycopg.connect(server.url, autocommit=True) as conn:
        for side, first in (("base", None), ("neighbour", (0, "5.00", "West", -0.02, "a  ", 3))):
            name = f"dpsql_spelled_{side}"
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
            urls[side] = database_url(server, name)
            _load(urls[side], first)
    yield urls


@pytest.fixture(scope="module")
def engines(spelled) -> Iterator[dict[str, Engine]]:
    schema = parse_schema(SCHEMA)
    opened = {side: Engine(Settings(database=url), schema) for side, url in spelled.items()}
    for engine in opened.values():
        engine.ledger.add_analyst("auditor", 1e9, 0.5)
    yield opened
    for engine in opened.values():
        engine.close()


KEYED = [
    ("SELECT balance, COUNT(*) FROM people GROUP BY balance", "5"),
    ("SELECT round(score * 10) / 10 AS s, COUNT(*) FROM people GROUP BY 1", "0.0"),
    ("SELECT code, COUNT(*) FROM people GROUP BY code", "a"),
]


@pytest.mark.parametrize(("sql", "text"), KEYED)
def test_a_released_key_reads_the_same_whichever_row_spelled_it_first(engines, spelled, sql, text):
    """Item 1: the exact group (5.0 and 5.00, 0 and -0, 'a' and 'a  ' in a bpchar column) is released on both sides
    by partition selection; its text must not tell them apart (the engine's answer, which every door sends on)."""
    for side, engine in engines.items():
        prepared = engine.prepare(sql)
        with psycopg.connect(spelled[side]) as conn:  # the backend alone would spell it as the first row does
            raw = conn.execute(prepared.rewritten.sql).fetchall()
        assert len(raw) == 1
        answer = engine.query(sql, analyst="auditor")
        assert [str(row[0]) for row in answer.rows] == [text], (side, raw)


def _draw(engines: dict[str, Engine], sql: str, epsilon: float) -> Callable[[str], auditor.Output]:
    """One fresh answer per call, as the client receives it: each from a new analyst, whose answer cache is empty
    (as an adversary with many accounts would ask)."""
    def draw(side: str) -> auditor.Output:
        analyst = f"auditor_{next(_names)}"
        engines[side].ledger.add_analyst(analyst, 100.0, 1e-3)
        return auditor.as_text(engines[side].query(sql, analyst=analyst, epsilon=epsilon).rows)
    return draw


def test_the_auditor_flags_key_spelling_without_the_canonical_form_and_passes_with_it(engines, monkeypatch):
    sql = "SELECT balance, COUNT(*) FROM people GROUP BY balance"
    fixed = auditor.audit("GROUP BY numeric key", _draw(engines, sql, 1.0), 60, keys=1, claimed_epsilon=1.0,
                          claimed_delta=1e-6)
    assert not fixed.violated, fixed
    monkeypatch.setattr(dpsql.noise, "released_key", tuple)  # the engine as it was: the backend's spelling
    broken = auditor.audit("GROUP BY numeric key (no canonical form)", _draw(engines, sql, 1.0), 60, keys=1,
                           claimed_epsilon=1.0, claimed_delta=1e-6)
    assert broken.violated and broken.epsilon_lower_bound > 1.5, broken  # 30 of 30 against 0 of 30: about 1.85


# The CI set: one query per class of mechanism and post-processing, at ε = 1 (a long run: benchmarks/audit.py)
AUDITED = [
    ("count, Laplace", "SELECT COUNT(*) FROM people", 0),
    ("sum and avg, clamped", "SELECT SUM(visits), AVG(score) FROM people", 0),
    ("declared domain", "SELECT state, COUNT(*) FROM people GROUP BY state", 1),
    ("partition selection", "SELECT visits, COUNT(*) FROM people GROUP BY visits HAVING COUNT(*) > 30", 1),
    ("negative counts clamped, rounded", "SELECT GREATEST(ROUND(COUNT(*) / 2.0), 0) FROM people WHERE score > 4", 0),
    ("top-k", "SELECT visits, COUNT(*) FROM people GROUP BY visits ORDER BY COUNT(*) DESC LIMIT 2", 1),
    ("median", "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY score) FROM people", 0),
]


@pytest.mark.parametrize(("name", "sql", "keys"), AUDITED, ids=[a[0] for a in AUDITED])
def test_audited_query_classes_spend_no_more_than_they_claim(engines, name, sql, keys):
    result = auditor.audit(name, _draw(engines, sql, 1.0), 80, keys=keys, claimed_epsilon=1.0, claimed_delta=1e-6)
    print(auditor.HEADER, result.row(), sep="\n")
    assert not result.violated, result


# --- 2, 4, 6: releases are charged on every path, keyed by every parameter, and padded like answers ------------


@contextlib.contextmanager
def _locked(engine: Engine, table: str) -> Iterator[None]:
    """Another session holds `table` locked: every statement reading it waits until the statement timeout, a
    failure on a live connection that the data's size does not decide."""
    with psycopg.connect(engine.settings.database) as conn:
        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def _charges(engine: Engine, analyst: str) -> tuple[int, float]:
    with psycopg.connect(engine.settings.database) as conn:
        return conn.execute("SELECT COUNT(*), COALESCE(SUM(epsilon), 0) FROM dpsql.charges WHERE analyst = %s",
                            (analyst,)).fetchone()


@pytest.fixture
def demo(base_url) -> Iterator[Callable[..., Engine]]:
    from dpsql.backends import PostgresBackend
    from tests.conftest import DEMO_SCHEMA

    opened = []

    def open_engine(timeout_ms: int | None = None, **settings) -> Engine:
        engine = Engine(Settings(database=base_url, schema=str(DEMO_SCHEMA), **settings))
        if timeout_ms is not None:
            engine.backend.close()
            engine.backend = PostgresBackend(base_url, statement_timeout_ms=timeout_ms)
        opened.append(engine)
        return engine
    yield open_engine
    for engine in opened:
        engine.close()


RELEASES = {
    "synth": lambda e, a: synthesize(e, a, "people", ["sex", "age"], 1.0),
    "tree": lambda e, a: dpsql.releases.decision_tree(e, a, "people", "sex", ["age", "income"], 1.0, depth=2),
    "density": lambda e, a: dpsql.releases.density(e, a, "people", "income", 1.0, 1e-6, points=16),
}


@pytest.mark.parametrize("kind", sorted(RELEASES))
def test_a_release_that_times_out_is_charged_and_so_is_every_retry(demo, kind):
    """Item 2: three attempts that time out cost three times the release's ε, as three queries would."""

    from dpsql import errors

    engine = demo(timeout_ms=200)
    analyst = f"timed_{next(_names)}"
    engine.ledger.add_analyst(analyst, 10.0, 1e-3)
    with _locked(engine, "people"):
        for _ in range(3):
            with pytest.raises(errors.BackendError):
                RELEASES[kind](engine, analyst)
    count, epsilon = _charges(engine, analyst)
    assert count == 3 and epsilon == pytest.approx(3.0)
    assert engine.budget(analyst).epsilon_basic == pytest.approx(3.0)


def test_a_bounds_effect_estimate_that_times_out_is_charged_again(demo):
    from dpsql import errors

    engine = demo(timeout_ms=200)
    analyst = f"timed_{next(_names)}"
    engine.ledger.add_analyst(analyst, 10.0, 1e-3)
    prepared = engine.prepare("SELECT category, COUNT(*) FROM visits GROUP BY category")
    with _locked(engine, "visits"):
        for _ in range(2):
            with pytest.raises(errors.BackendError):
                engine.bounds_effect(analyst, prepared, 0.1)
    assert _charges(engine, analyst) == (2, pytest.approx(0.2))


RELEASE_PARAMETERS = [
    (lambda e, a, p: dpsql.releases.decision_tree(e, a, "people", "sex", ["age", "income"], 1.0, depth=p), 1, 2,
     "depth"),
    (lambda e, a, p: dpsql.releases.density(e, a, "people", "income", 1.0, 1e-6, points=p), 16, 24, "points"),
    (lambda e, a, p: dpsql.releases.density(e, a, "people", "income", 1.0, 1e-6, bandwidth=p), 5000.0, 9000.0,
     "bandwidth"),
    (lambda e, a, p: synthesize(e, a, "people", ["sex", "age"], 1.0, rounds=p, method="mwem"), 1, 2,
     "rounds"),
]


@pytest.mark.parametrize(("release", "first", "second", "name"), RELEASE_PARAMETERS,
                         ids=[p[-1] for p in RELEASE_PARAMETERS])
def test_a_release_with_other_parameters_is_another_release(demo, release, first, second, name):
    """Item 4: the cache key holds every parameter of the mechanism, so another depth, bandwidth, grid or number of
    rounds at the same ε is released (and charged) anew, labelled with its own parameters."""

    engine = demo()
    analyst = f"params_{next(_names)}"
    engine.ledger.add_analyst(analyst, 10.0, 1e-3)
    one, other, again = release(engine, analyst, first), release(engine, analyst, second), \
        release(engine, analyst, first)
    assert not one["cached"] and not other["cached"] and again["cached"]
    label = {"points": lambda r: len(r["points"])}.get(name, lambda r: r[name])
    assert label(one) == first and label(other) == second
    assert _charges(engine, analyst)[0] == 2


def test_a_release_waits_for_the_latency_floor_as_an_answer_does(demo):
    """Item 6: a fresh release, and its failure, come no sooner than the floor; a kept one comes at once."""
    import time


    engine = demo(latency_floor_ms=300)
    analyst = f"floor_{next(_names)}"
    engine.ledger.add_analyst(analyst, 10.0, 1e-3)
    began = time.monotonic()
    RELEASES["tree"](engine, analyst)
    fresh = time.monotonic() - began
    began = time.monotonic()
    RELEASES["tree"](engine, analyst)
    kept = time.monotonic() - began
    prepared = engine.prepare("SELECT category, COUNT(*) FROM visits GROUP BY category")
    began = time.monotonic()
    engine.bounds_effect(analyst, prepared, 0.1)
    estimate = time.monotonic() - began
    assert fresh >= 0.3 and estimate >= 0.3 and kept < 0.3


# --- 3: the answer cache keeps apart what PostgreSQL keeps apart ------------------------------------------------


def test_literals_of_another_scale_are_another_question(engine, analyst):
    """Item 3: 1.50 and 1.5 are one value but not one literal (its text, and the precision of a division, follow
    its scale): one query counts every person, the other none, and each gets its own answer."""
    every = "SELECT COUNT(*) FROM people WHERE CAST(1.50 AS text) = '1.50'"
    none = "SELECT COUNT(*) FROM people WHERE CAST(1.5 AS text) = '1.50'"
    assert engine.prepare(every).key != engine.prepare(none).key
    assert engine.prepare(every).key == engine.prepare("SELECT COUNT(*) FROM people WHERE "
                                                       "CAST(01.50 AS text) = '1.50'").key
    assert engine.prepare(none).key == engine.prepare("SELECT COUNT(*) FROM people WHERE "
                                                      "CAST(15e-1 AS text) = '1.50'").key
    counted = engine.query(every, analyst=analyst, epsilon=1.0).rows[0][0]
    empty = engine.query(none, analyst=analyst, epsilon=1.0).rows[0][0]
    assert counted > 2500 and empty < 500  # 3,000 people; Laplace noise of scale 1


# --- 7: the density's Gaussian-process noise is never less than its proof assumes --------------------------------


@pytest.mark.parametrize(("points", "bandwidth"), [(64, 0.05), (200, 0.05), (16, 0.3), (1000, 0.01)])
def test_the_gaussian_process_draws_at_least_the_covariance_of_its_proof(points, bandwidth):
    """Item 7: on a grid finer than the bandwidth the Gram matrix is numerically singular (some eigenvalues come
    out negative). The covariance drawn, σ²·R·Rᵀ, minus the proof's σ²·K must be positive semidefinite, so the
    release is the proof's mechanism plus independent noise; the clip alone (the earlier code) fails this."""
    import numpy as np

    from dpsql.mechanisms.gaussian_process import GaussianProcessMechanism, gaussian_kernel

    gp = GaussianProcessMechanism.calibrate(sensitivity=1.0, bandwidth=bandwidth, rho=0.5)
    grid = np.linspace(0, 1, points)
    root = gp.root(grid)
    excess = root @ root.T - gaussian_kernel(grid, grid, bandwidth)
    assert np.linalg.eigvalsh(excess).min() > 0
    values, vectors = np.linalg.eigh(gaussian_kernel(grid, grid, bandwidth))
    clipped = vectors * np.sqrt(np.clip(values, 0.0, None))
    assert values.min() < 0 or points < 100  # the fine grids are numerically singular
    if values.min() < 0:
        assert np.linalg.eigvalsh(clipped @ clipped.T - gaussian_kernel(grid, grid, bandwidth)).min() < 0
    assert np.abs(excess).max() < 1e-8  # the extra noise is negligible
