"""Regression tests for the third privacy review (issue 35), each on a database and a neighbour that differs by one
unit, checking what the client receives; and the statistical auditor's CI set (tests/auditor.py), which bounds
from below the ε each query class spends, from many answers on both databases.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import psycopg
import pytest

import dpsql
import dpsql.noise
from dpsql.config import Settings
from dpsql.engine import Engine
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
