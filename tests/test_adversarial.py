"""Attacks a privacy researcher would try, one class per section, through the wire (psycopg, or raw protocol
messages where their order matters) and the DB-API, with the ledger saying what was charged. Grows with every
hole found (issue 15 started it)."""

from __future__ import annotations

import itertools
import math
import threading
import time
from decimal import Decimal

import psycopg
import pytest

import dpsql
from dpsql import errors
from dpsql.accounting.answers import decode_value, encode_value
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.server.auth import scram_verifier
from dpsql.server.protocol import Conversation
from dpsql.sql import check_query
from tests.conftest import DEMO_SCHEMA, PASSWORD, Running, in_threads
from tests.test_codec import SYNC, backend_messages, bind, describe, execute, parse
from tests.test_server import _login


def _charges(served: Running, analyst: str) -> int:
    with psycopg.connect(served.url) as conn:
        return conn.execute("SELECT count(*) FROM dpsql.charges WHERE analyst = %s", (analyst,)).fetchone()[0]


_numbers = itertools.count()


def _analyst(served: Running, prefix: str, epsilon: float = 100.0) -> str:
    """A new analyst, so that no test shares a budget or a stored answer with another."""
    name = f"{prefix}_{next(_numbers)}"
    served.engine.ledger.add_analyst(name, epsilon, 1e-3)
    served.engine.ledger.set_verifier(name, scram_verifier(PASSWORD))
    return name


@pytest.fixture
def dbapi(served: Running):
    name = _analyst(served, "dbapi")
    conn = dpsql.connect(served.url, str(DEMO_SCHEMA), name, epsilon=0.5)
    yield conn, name
    conn.close()


# --- averaging through equivalent spellings -------------------------------------------------------------------

SPELLINGS = [
    "SELECT count(*) FROM people",
    "SELECT /* c */ count(*) AS n FROM people AS p",
    "SELECT count(*) FROM public.people",
    'SELECT count(*) FROM "people"',
    "select COUNT(1) from PEOPLE -- again",
]


SAME = [
    ("SELECT count(*) FROM people p JOIN visits v ON p.person_id = v.person_id WHERE v.amount > 10",
     "SELECT COUNT(*) FROM people AS a JOIN visits AS b ON b.person_id = a.person_id WHERE 10 < b.amount"),
    ("SELECT sex, count(*) FROM people WHERE age >= 18 OR state = 'CA' GROUP BY sex",
     "SELECT sex AS x, count(*) AS y FROM people WHERE (state = 'CA' OR 18 <= age) GROUP BY 1"),
    ("SELECT sum(income) FROM people WHERE age > 30 AND sex = 'F' AND state = 'NY'",
     "SELECT sum(income) FROM people WHERE state = 'NY' AND (sex = 'F' AND age > 0030)"),
    ("SELECT avg(amount) FROM visits WHERE amount > 1.50", "SELECT avg(amount) FROM visits WHERE amount > 01.50"),
    ("SELECT avg(amount) FROM visits WHERE amount > 1.5", "SELECT avg(amount) FROM visits WHERE amount > 15e-1"),
]
DIFFERENT = [
    # a literal's scale is part of its value (CAST(1.50 AS text) is '1.50'): issue 35, item 3
    ("SELECT avg(amount) FROM visits WHERE amount > 1.50", "SELECT avg(amount) FROM visits WHERE amount > 1.5"),
    ("SELECT count(*) FROM people WHERE age > 30", "SELECT count(*) FROM people WHERE age < 30"),
    ("SELECT count(*) FROM people WHERE age > 30", "SELECT count(*) FROM people WHERE age >= 30"),
    ("SELECT sum(age / 2) FROM people", "SELECT sum(age / 2.0) FROM people"),
    ("SELECT sum(age - 1) FROM people", "SELECT sum(1 - age) FROM people"),
    ("SELECT count(*) FROM people WHERE state = 'ca'", "SELECT count(*) FROM people WHERE state = 'CA'"),
    ("SELECT count(DISTINCT person_id) FROM visits", "SELECT count(person_id) FROM visits"),
    ("SELECT sex, count(*) FROM people GROUP BY sex ORDER BY 2", "SELECT sex, count(*) FROM people GROUP BY sex"),
    ("SELECT count(*) FROM people p JOIN visits v ON p.person_id = v.person_id",
     "SELECT count(*) FROM people p LEFT JOIN visits v ON p.person_id = v.person_id"),
]


@pytest.mark.parametrize(("one", "other"), SAME)
def test_respellings_have_one_canonical_text(demo_schema, one: str, other: str):
    assert check_query(one, demo_schema).canonical == check_query(other, demo_schema).canonical


@pytest.mark.parametrize(("one", "other"), DIFFERENT)
def test_queries_that_differ_in_meaning_keep_their_own_texts(demo_schema, one: str, other: str):
    assert check_query(one, demo_schema).canonical != check_query(other, demo_schema).canonical


def test_equivalent_spellings_get_one_answer_and_one_charge_over_the_wire(served: Running):
    analyst = _analyst(served, "spell_wire")
    with psycopg.connect(served.dsn(analyst), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.5")
        answers = [conn.execute(sql) for sql in SPELLINGS]
        values = [cur.fetchone()[0] for cur in answers]
        names = [cur.description[0].name for cur in answers]
    assert len(set(values)) == 1 and _charges(served, analyst) == 1
    assert names == ["count", "n", "count", "count", "count"]  # each query's own output name


def test_equivalent_predicates_get_one_answer_through_the_dbapi(dbapi):
    conn, analyst = dbapi
    cursor = conn.cursor()
    spellings = ["SELECT sex, AVG(age) FROM people WHERE age > 30 AND income < 100000 GROUP BY sex ORDER BY sex",
                 "SELECT p.sex AS s, avg(p.age) FROM people p WHERE (100000 > p.income AND 030 < p.age) "
                 "GROUP BY p.sex ORDER BY 1"]
    results = []
    for sql in spellings:
        cursor.execute(sql)
        results.append(cursor.fetchall())
    assert results[0] == results[1]
    assert conn._engine.ledger.budget(analyst).epsilon_spent == pytest.approx(0.5)


def test_spellings_that_differ_in_meaning_get_their_own_answers(dbapi):
    conn, analyst = dbapi
    cursor = conn.cursor()
    for sql in ["SELECT count(*) FROM people WHERE age > 30", "SELECT count(*) FROM people WHERE age < 30",
                "SELECT count(*) FROM people WHERE age >= 30", "SELECT sum(age / 2) FROM people",
                "SELECT sum(age / 2.0) FROM people"]:
        cursor.execute(sql)
    assert conn._engine.ledger.budget(analyst).epsilon_spent == pytest.approx(2.5)


# --- strings of several statements run all or nothing ---------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM people; SELECT * FROM people",
    "SELECT count(*) FROM people; DROP TABLE visits",
    "SELECT setseed(0.5); SELECT count(*) FROM people",
    "SET dpsql.epsilon = 0.25; SELECT count(*) FROM people; SELECT person_id FROM people LIMIT 1",
])
def test_a_string_with_a_refused_statement_runs_none_of_it(served: Running, sql: str):
    analyst = _analyst(served, "multi")
    with psycopg.connect(served.dsn(analyst), autocommit=True) as conn:
        with pytest.raises(psycopg.Error):
            conn.execute(sql)
        assert conn.execute("SHOW dpsql.epsilon").fetchone()[0] != "0.25"  # not even the SET ran
    assert _charges(served, analyst) == 0
    with psycopg.connect(served.url) as conn:
        assert conn.execute("SELECT to_regclass('visits') IS NOT NULL").fetchone()[0]


def test_a_string_of_allowed_statements_runs_them_all(served: Running):
    analyst = _analyst(served, "multi_ok")
    with psycopg.connect(served.dsn(analyst), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.25; SELECT count(*) FROM people; SELECT 1")
        assert conn.execute("SHOW dpsql.epsilon").fetchone()[0] == "0.25"
    assert _charges(served, analyst) == 1


def test_the_dbapi_refuses_a_string_of_statements(dbapi):
    conn, analyst = dbapi
    with pytest.raises(errors.Error, match="exactly one statement"):
        conn.cursor().execute("SELECT count(*) FROM people; SELECT * FROM people")
    assert conn._engine.ledger.budget(analyst).epsilon_spent == 0


# --- no crash, and no charge without an answer, on odd values ---------------------------------------------------

POST_PROCESSED = [
    "SELECT COUNT(*) * 1.5 FROM people",
    "SELECT ROUND(100.0 * SUM(CASE WHEN amount > 200 THEN 1 ELSE 0 END) / COUNT(*), 1) AS pct FROM visits",
    "SELECT sum(income) / count(*) FROM people WHERE person_id = 42",
]


@pytest.mark.parametrize("sql", POST_PROCESSED)
def test_decimal_literals_and_near_zero_divisors_are_answered(served: Running, dbapi, sql: str):
    conn, _ = dbapi
    cursor = conn.cursor()
    for epsilon in (0.01, 0.02, 0.03):  # tiny ε: noisy counts near zero, NaN and infinite ratios
        cursor.execute(f"SET dpsql.epsilon = {epsilon}")
        cursor.execute(sql)
        (value,) = cursor.fetchone()
        assert value is None or isinstance(value, float | int | Decimal)  # COUNT(*) * 1.5 is numeric
    with psycopg.connect(served.dsn(), autocommit=True) as wire:
        wire.execute("SET dpsql.epsilon = 0.01")
        assert len(wire.execute(sql).fetchall()) == 1


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e308, -0.0])
def test_the_ledger_keeps_any_float(served: Running, value: float):
    assert math.isnan(decode_value(encode_value(value))) if math.isnan(value) else \
        decode_value(encode_value(value)) == value
    stored = served.engine.ledger.answers.keep("ana", f"float {value!r}", {"rows": [[encode_value(value)]]})
    again = served.engine.ledger.answers.get("ana", f"float {value!r}")
    assert stored == again and repr(decode_value(again["rows"][0][0])) == repr(value)


def test_a_placeholder_parameter_in_an_aggregate_is_described_and_answered(served: Running):
    conversation = Conversation(served.server.gateway, process_id=78, secret=b"abcd")
    _login(conversation)
    sql = "SELECT sum(income * $1) FROM people"
    out = backend_messages(conversation.receive(parse("s", sql, (701,)) + describe("S", "s") + SYNC).data)
    assert [kind for kind, _ in out] == ["1", "t", "T", "Z"]
    out = backend_messages(conversation.receive(bind("", "s", [b"2"]) + execute() + SYNC).data)
    assert [kind for kind, _ in out] == ["2", "D", "N", "C", "Z"]
    out = backend_messages(conversation.receive(bind("", "s", [b"0"]) + execute() + SYNC).data)
    assert out[1][0] == "E" and b"same on every database" in out[1][1] and out[-1] == ("Z", b"I")


# --- settings that change how later statements are read --------------------------------------------------------


@pytest.mark.parametrize("setting", [
    "SET standard_conforming_strings = off", "SET LOCAL standard_conforming_strings TO false",
    "SET backslash_quote = on", "SET escape_string_warning = off", "SET client_encoding = 'LATIN1'",
    "SET NAMES 'SJIS'",
])
def test_settings_that_change_lexing_are_refused(served: Running, setting: str):
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="how later statements are read"):
            conn.execute(setting)
        assert conn.execute("SHOW standard_conforming_strings").fetchone()[0] == "on"
        assert conn.info.parameter_status("client_encoding") == "UTF8"


def test_harmless_settings_still_pass(served: Running):
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.execute("SET standard_conforming_strings = on")
        conn.execute("SET client_encoding = 'UTF8'")
        conn.execute("SET search_path TO public")


# --- ε and δ on every interface -------------------------------------------------------------------------------

BAD_EPSILONS = ["5e-324", "1e-12", "0", "-1", "NaN", "Infinity", "1e308"]


@pytest.mark.parametrize("epsilon", BAD_EPSILONS)
def test_an_epsilon_out_of_range_is_refused_before_any_charge_over_the_wire(served: Running, epsilon: str):
    analyst = _analyst(served, "eps")
    with psycopg.connect(served.dsn(analyst), autocommit=True) as conn, \
            pytest.raises(psycopg.Error, match="epsilon"):
        conn.execute(f"SET dpsql.epsilon = {epsilon}")
        conn.execute("SELECT count(*) FROM people")
    assert _charges(served, analyst) == 0


@pytest.mark.parametrize("epsilon", [5e-324, 1e-12, 0.0, -1.0, math.nan, math.inf])
def test_an_epsilon_out_of_range_is_refused_by_the_dbapi(served: Running, epsilon: float):
    analyst = _analyst(served, "epsdb")
    with pytest.raises(errors.Error, match="epsilon"):
        conn = dpsql.connect(served.url, str(DEMO_SCHEMA), analyst, epsilon=epsilon)
        conn.cursor().execute("SELECT count(*) FROM people")
    assert _charges(served, analyst) == 0


# --- budget races ---------------------------------------------------------------------------------------------


def test_fifty_identical_concurrent_queries_are_charged_once(served: Running):
    analyst = _analyst(served, "race")
    barrier = threading.Barrier(50)

    def ask() -> float:
        with psycopg.connect(served.dsn(analyst), autocommit=True) as conn:
            barrier.wait(30)
            return conn.execute("SELECT AVG(income) FROM people").fetchone()[0]

    gateway = served.server.gateway
    cap, gateway.max_analyst_connections = gateway.max_analyst_connections, 50  # one analyst, fifty connections
    try:
        values, failures = in_threads(ask, 50)
    finally:
        gateway.max_analyst_connections = cap
    assert not failures and len(values) == 50 and len(set(values)) == 1
    assert _charges(served, analyst) == 1


# --- group keys -----------------------------------------------------------------------------------------------

DERIVED_KEYS = [
    ("upper(sex)", "people", "sex"),
    ("lower(sex) || '-x'", "people", "sex"),
    ("substring(category, 2, 3)", "visits", "category"),
    ("substring(category, -1, 4)", "visits", "category"),
    ("length(category)", "visits", "category"),
    ("upper(drug) || '!'", "prescriptions", "drug"),
]


@pytest.mark.parametrize(("key", "table", "column"), DERIVED_KEYS)
def test_a_function_of_a_public_key_has_the_values_postgresql_computes(served: Running, key: str, table: str,
                                                                        column: str):
    plan = served.engine.prepare(f"SELECT {key} AS k, COUNT(*) FROM {table} GROUP BY 1").plan
    declared = served.engine.schema.tables[table].columns[column].domain
    with psycopg.connect(served.url) as conn:
        computed = conn.execute(f"SELECT DISTINCT {key.replace(column, 'v')} FROM unnest(%s::text[]) AS v",
                                (list(declared),)).fetchall()
    assert plan.domain is not None and sorted(plan.domain) == sorted(computed)


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT person_id, COUNT(*) FROM visits GROUP BY person_id", "groups by the privacy unit"),
    ("SELECT p.person_id AS who, AVG(p.age) FROM people p GROUP BY 1", "groups by the privacy unit"),
    ("SELECT income, COUNT(*) FROM people GROUP BY income", "width_bucket"),
])
def test_keys_no_group_could_ever_be_released_for_are_refused_before_any_charge(served: Running, sql: str,
                                                                                 message: str):
    analyst = _analyst(served, "keys")
    with psycopg.connect(served.dsn(analyst), autocommit=True) as conn, \
            pytest.raises(psycopg.errors.FeatureNotSupported, match=message):
        conn.execute(sql)
    assert _charges(served, analyst) == 0


def test_count_distinct_over_rows_that_are_whole_units_has_sensitivity_one(served: Running):
    plan = served.engine.prepare("SELECT sex, COUNT(DISTINCT state) FROM people GROUP BY sex").plan
    assert [m.sensitivity for m in plan.measures] == [1]


# --- timing -----------------------------------------------------------------------------------------------------


def test_the_latency_floor_pads_fresh_answers_not_cached_or_refused_ones(served: Running):
    engine = Engine(Settings(database=served.url, schema=str(DEMO_SCHEMA), latency_floor_ms=300))
    analyst = _analyst(served, "floor")
    try:
        began = time.monotonic()
        engine.query("SELECT COUNT(*) FROM visits", analyst=analyst, epsilon=0.5)
        fresh = time.monotonic() - began
        began = time.monotonic()
        engine.query("SELECT COUNT(*) FROM visits", analyst=analyst, epsilon=0.5)
        cached = time.monotonic() - began
        began = time.monotonic()
        with pytest.raises(errors.Error):  # refused before it runs: nothing to hide, no wait
            engine.query("SELECT * FROM visits", analyst=analyst, epsilon=0.5)
        refused = time.monotonic() - began
    finally:
        engine.close()
    assert fresh >= 0.3 and cached < 0.3 and refused < 0.3


# --- a dpsql bug on the query path ------------------------------------------------------------------------------


def test_a_bug_after_the_charge_is_an_internal_error_and_the_retry_pays_again(served: Running, monkeypatch):
    """A crash whose occurrence could depend on the data (through the noisy value) must not be sampled for
    free: like a failure, it settles its charge."""
    import dpsql.engine

    def broken(*args, **kwargs):
        raise TypeError("a dpsql bug")

    analyst = _analyst(served, "bug")
    sql = "SELECT AVG(age) FROM people WHERE income > 12345"
    with monkeypatch.context() as patch:
        patch.setattr(dpsql.engine, "finish", broken)
        for _ in range(2):
            with pytest.raises(errors.InternalError, match="TypeError"):
                served.engine.query(sql, analyst=analyst, epsilon=0.5)
    assert _charges(served, analyst) == 2
    served.engine.query(sql, analyst=analyst, epsilon=0.5)
    assert _charges(served, analyst) == 3
