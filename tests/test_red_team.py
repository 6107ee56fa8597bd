"""Regression tests for the holes a red team found (issue 12), one or more per item, each on a base database and a
neighbour that differs by one unit (or one row), with the exact pre-noise values and the claimed sensitivity.

Most use the neighbour fuzzer's worlds (tests/fuzzing.py): a unit-level one (people, visits, prescriptions) and a
row-level one whose events table is LIST-partitioned.
"""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest

from dpsql import errors
from dpsql.backends import PostgresBackend
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.schema import parse_schema
from tests import fuzzing
from tests.conftest import copy_database


def _world(fuzz_world, name: str):
    with fuzzing.open_world(name, *fuzz_world(name)) as opened:
        yield opened


@pytest.fixture(scope="module")
def unit(fuzz_world):
    yield from _world(fuzz_world, "unit")


@pytest.fixture(scope="module")
def row(fuzz_world):
    yield from _world(fuzz_world, "row")


def _within_claims_everywhere(engine: Engine, backends: dict[str, PostgresBackend], sql: str) -> fuzzing.Exact:
    """Runs `sql` on the base and every neighbour: none fails, and every move is within the claims."""
    prepared = engine.prepare(sql)
    before = fuzzing.run_exact(prepared, backends["base"])
    for name, backend in backends.items():
        assert fuzzing.claim_violations(prepared, before, fuzzing.run_exact(prepared, backend)) == [], (sql, name)
    return before


# --- 1. errors that depend on one unit's data ------------------------------------------------------------------

REFUSED = [
    ("SELECT COUNT(*) FROM people WHERE state = 'ZZ' AND substring(state, 1, -1) = 'x'", "substring's length"),
    ("SELECT COUNT(*) FROM people WHERE state = 'ZZ' AND substring(state FROM '(') = 'x'", "regular expression"),
    ("SELECT COUNT(*) FROM people WHERE state LIKE 'Z\\'", "ends with its escape"),
    ("SELECT COUNT(*) FROM people WHERE state ILIKE 'Z\\'", "ends with its escape"),
    ("SELECT COUNT(*) FROM visits WHERE category = 'zz' AND date_trunc('fortnight', day) IS NULL", "date_trunc unit"),
    ("SELECT COUNT(*) FROM people WHERE CAST(balance AS double precision) > 0", "could overflow"),
    ("SELECT COUNT(*) FROM people WHERE CAST(score AS real) > 0", "could overflow"),
    ("SELECT COUNT(*) FROM people WHERE CAST(income AS numeric(3, 1)) > 0", "could overflow"),
    ("SELECT COUNT(*) FROM visits WHERE EXTRACT(HOUR FROM day) = 1", "a date, which has no hour"),
    ("SELECT COUNT(*) FROM people WHERE width_bucket(score, 0, 10, 2147483647) = 1", "bucket count"),
    ("SELECT SUM(round(income::numeric, 100000)) FROM people", "number of digits"),
    ("SELECT COUNT(*) FROM people WHERE state = 'ZZ' AND state ~ '(a'", "has an unmatched"),
    ("SELECT COUNT(*) FROM people WHERE state = 'ZZ' AND state SIMILAR TO '(a%'", "has an unmatched"),
    ("SELECT COUNT(*) FROM people WHERE state = 'ZZ' AND state ~* '[[:alpha:]]'", "POSIX classes"),
]


@pytest.mark.parametrize(("sql", "reason"), REFUSED)
def test_partial_constant_arguments_are_refused_before_anything_runs(unit, sql, reason):
    engine, _ = unit
    with pytest.raises(errors.UnsupportedQuery, match=reason):
        engine.prepare(sql)


TOTAL = [
    "SELECT day, COUNT(*) FROM visits GROUP BY day",  # keys at ±infinity and in year 1000000
    "SELECT date_trunc('month', day), COUNT(*) FROM visits GROUP BY 1",
    "SELECT born, seen, COUNT(*) FROM people GROUP BY born, seen",
    "SELECT COUNT(*) FROM visits WHERE CAST(day AS timestamp) > '2024-01-01'",
    "SELECT COUNT(*) FROM visits WHERE date_trunc('millennium', day) IS NULL",
    "SELECT COUNT(*) FROM people WHERE state ~* '^z' OR state SIMILAR TO '(Z|C)%' OR state !~ '\\w{2}'",
    "SELECT COUNT(*) FROM people WHERE date_trunc('month', born) + INTERVAL '90000 months' > DATE '9000-06-01'",
    "SELECT date_trunc('week', born + INTERVAL '1 day') - INTERVAL '1 day' AS w, COUNT(*) FROM people GROUP BY 1",
    "SELECT SUM(CAST(EXTRACT(YEAR FROM day) AS integer) - 2000) FROM visits",
    "SELECT COUNT(*) FROM people WHERE width_bucket(score, 0, 10, 5) = 1",  # NaN and ±Infinity scores
    "SELECT width_bucket(balance, 0, 1000, 4), COUNT(*) FROM people GROUP BY 1",
    "SELECT COUNT(*) FROM visits WHERE note LIKE 'back\\\\%'",
    "SELECT MIN(born), MAX(seen), percentile_disc(0.5) WITHIN GROUP (ORDER BY seen) FROM people",  # declared bounds
    "SELECT sex, MAX(born), MIN(seen) FROM people GROUP BY sex",
    "SELECT to_char(day, 'YYYY-MM'), COUNT(*) FROM visits GROUP BY 1",  # year 1000000 would fail a cast
    "SELECT floor(extract(epoch from day) / 86400) * 86400, COUNT(*) FROM visits GROUP BY 1",  # ±infinity
    "SELECT to_char(seen, 'YYYY-\"Q\"Q HH24'), COUNT(*) FROM people GROUP BY 1",
    "SELECT to_timestamp(floor(extract(epoch from day) / 86400) * 86400), COUNT(*) FROM visits GROUP BY 1",
    "SELECT to_timestamp(score), COUNT(*) FROM people GROUP BY 1",  # NaN, ±Infinity and 1e300 seconds
    "SELECT COUNT(ROUND(balance, 1)), COUNT(score * 2 + balance) FROM people",  # 1e400 would overflow
]


@pytest.mark.parametrize("sql", TOTAL)
def test_accepted_queries_run_on_every_neighbour(unit, sql):
    """The neighbours hold ±infinity, years 1000000 and 4713 BC, NaN and ±Infinity numbers, 1e400 numerics and
    backslashes: an accepted query runs on each, and moves within its claims."""
    engine, backends = unit
    _within_claims_everywhere(engine, backends, sql)


def test_keys_python_cannot_hold_come_back_as_postgresql_text(unit):
    engine, backends = unit
    # amount < 3: the extreme unit's first three visits, one on each day (fewer than k: none is truncated away)
    sql = ("SELECT day, COUNT(*) FROM visits WHERE day IN ('infinity', '-infinity', '1000000-01-01') AND amount < 3 "
           "GROUP BY day")
    before = fuzzing.run_exact(engine.prepare(sql), backends["extreme_dates"])
    assert before.rows.keys() == {("infinity",), ("-infinity",), ("1000000-01-01",)}


def test_a_failure_and_a_timeout_look_the_same(base_url):
    """A residual backend failure and a timeout give one error, one message: neither tells the database apart."""
    backend = PostgresBackend(base_url, statement_timeout_ms=50, max_connections=1)
    try:
        with pytest.raises(errors.BackendError) as failed:
            backend.execute("SELECT 1 / (SELECT COUNT(*) - COUNT(*) FROM people)")
        with pytest.raises(errors.BackendError) as timed_out:
            backend.execute("SELECT pg_sleep(1)")
    finally:
        backend.close()
    assert str(failed.value) == str(timed_out.value)
    assert failed.value.code == timed_out.value.code == "DP008"


# --- 2. NOT IN with a NULL outer value ---------------------------------------------------------------------------

def test_not_in_with_a_null_outer_value_does_not_flip_with_the_subquery(engine, server, template, base_url):
    """`NULL NOT IN (empty)` is TRUE and `NULL NOT IN (non-empty)` is NULL: one person with one visit over 999
    used to flip every person without visits (the LEFT JOIN's NULLs)."""
    sql = ("SELECT COUNT(*) FROM people p LEFT JOIN visits v ON v.person_id = p.person_id WHERE v.person_id NOT IN "
           "(SELECT w.person_id FROM visits w WHERE w.amount > 999)")
    url = copy_database(server, template, "dpsql_not_in_neighbour")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE visits SET amount = 999 WHERE amount > 999")
        conn.execute("INSERT INTO people VALUES (2000000000, 40, 'F', 'CA', 1000)")
        conn.execute("INSERT INTO visits VALUES (2000000000, 2000000000, '2024-01-01', 'lab', 1000)")
    base = copy_database(server, template, "dpsql_not_in_base")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute("UPDATE visits SET amount = 999 WHERE amount > 999")
    prepared = engine.prepare(sql)
    backends = [PostgresBackend(u, max_connections=1) for u in (base, url)]
    try:
        before, after = (fuzzing.run_exact(prepared, b) for b in backends)
    finally:
        for b in backends:
            b.close()
    assert fuzzing.claim_violations(prepared, before, after) == []
    moved = abs(after.rows[()][0] - before.rows[()][0])
    assert moved <= prepared.plan.measures[0].sensitivity == 10
    with psycopg.connect(base) as b, psycopg.connect(url) as n:  # PostgreSQL's own reading moves far more
        raw = b.execute(sql).fetchone()[0] - n.execute(sql).fetchone()[0]
    assert abs(raw) > 10


def test_not_in_at_row_level_with_null_keys(row):
    """Events without an account (NULL keys) no longer flip when one account row makes the subquery non-empty."""
    engine, backends = row
    sql = "SELECT COUNT(*) FROM events e WHERE e.account_id NOT IN (SELECT b.account_id FROM accounts b " \
          "WHERE b.balance > 999)"
    _within_claims_everywhere(engine, backends, sql)


# --- 3. row level: subqueries in WHERE next to a grouped subquery in FROM --------------------------------------

def test_grouped_subquery_does_not_skip_the_semijoins(row):
    engine, backends = row
    sql = ("SELECT COUNT(*), SUM(n) FROM (SELECT e.account_id, COUNT(*) AS n FROM events e GROUP BY e.account_id) t "
           "WHERE NOT EXISTS (SELECT 1 FROM accounts b WHERE b.balance > 999)")
    with pytest.raises(errors.UnsupportedQuery, match="next to a grouped subquery"):
        engine.prepare(sql)
    base, neighbour = (psycopg.connect(backends[n]._pool.conninfo) for n in ("base", "account_duplicated"))
    with base, neighbour:  # why: one account row empties the whole answer
        raw = "SELECT COUNT(*) FROM (SELECT account_id FROM events GROUP BY 1) t WHERE NOT EXISTS " \
              "(SELECT 1 FROM accounts b WHERE b.balance > 999)"
        assert base.execute(raw).fetchone()[0] > 30 and neighbour.execute(raw).fetchone()[0] == 0
    public = sql.replace("accounts b WHERE b.balance > 999", "regions g WHERE g.area = 'Z'")
    _within_claims_everywhere(engine, backends, public)


# --- 4. integer-valuedness follows PostgreSQL's types ------------------------------------------------------------

@pytest.mark.parametrize(("expression", "integer"), [
    ("floor(income / 250000) / (floor(age / 50) + 1)", False),  # floats of integer value divide exactly
    ("round(income) / 2", False),
    ("CAST(age AS double precision) / 3", False),
    ("age / 3", True),  # integer division truncates
    ("age % 7", True),
    ("floor(income / 1000)", True),
])
def test_integer_valued_only_where_postgresql_computes_integers(engine, expression, integer):
    plan = engine.prepare(f"SELECT SUM({expression}) FROM people").plan
    assert plan.measures[0].integer_valued is integer


def test_fractional_values_are_what_postgresql_computes(engine, base_url):
    """The case the red team ran: values like 0.5, which an integer grid would round by a whole unit."""
    expression = "floor(income / 100000) / (floor(age / 50) + 1)"
    assert not engine.prepare(f"SELECT SUM({expression}) FROM people").plan.measures[0].integer_valued
    with psycopg.connect(base_url) as conn:
        fractions = conn.execute(f"SELECT COUNT(*) FROM people WHERE {expression} <> floor({expression})").fetchone()
    assert fractions[0] > 0


# --- 5. ctid repeats across partitions -------------------------------------------------------------------------

def test_truncation_on_a_partitioned_table_drops_only_the_rows_over_the_limit(row):
    """Account 1 has 12 events over eight partitions and a declared frequency of 6: exactly 6 are kept, the other
    accounts' rows all are (ctid alone removed the same positions in every partition)."""
    engine, backends = row
    sql = "SELECT COUNT(*) FROM events e JOIN accounts a ON a.account_id = e.account_id"
    counted = fuzzing.run_exact(engine.prepare(sql), backends["base"]).rows[()][0]
    with psycopg.connect(backends["base"]._pool.conninfo) as conn:
        expected = conn.execute("SELECT SUM(LEAST(n, 6)) FROM (SELECT account_id, COUNT(*) AS n FROM events "
                                "WHERE account_id IN (SELECT account_id FROM accounts) GROUP BY 1) t").fetchone()[0]
    assert counted == expected
    _within_claims_everywhere(engine, backends, sql)


def test_rows_of_different_partitions_are_different_units(row):
    """Each row is its own unit: on the per-unit path (an outer join) rows at the same ctid in two partitions are
    two units, not one clamped to k rows."""
    engine, backends = row
    prepared = engine.prepare("SELECT COUNT(*) FROM events e LEFT JOIN regions g ON g.code = e.kind")
    assert prepared.plan.unit is not None  # the per-unit path
    assert fuzzing.run_exact(prepared, backends["base"]).rows[()][0] == 400


# --- 6. ties in the keyed hash ---------------------------------------------------------------------------------

def test_group_cap_does_not_depend_on_the_plan(unit):
    """('lab', NULL) and (NULL, 'lab') hashed alike under concat_ws, so the plan chose which group a unit kept."""
    engine, backends = unit
    capped = Engine(replace(engine.settings, max_groups_per_unit=1), engine.schema)  # 5 rows reach > 4 × 1 group
    try:
        prepared = capped.prepare("SELECT category, note, COUNT(*), SUM(amount) FROM visits GROUP BY category, note")
    finally:
        capped.close()
    assert prepared.plan.cap_groups
    results = []
    for plan_setting in ("SET enable_hashagg = off", "SET enable_sort = off"):
        with psycopg.connect(backends["heavy_ties"]._pool.conninfo) as conn:
            conn.execute(plan_setting)
            rows = conn.execute(prepared.rewritten.sql).fetchall()  # float sums may differ in their last bits
            results.append(sorted(repr(tuple(round(v, 6) if isinstance(v, float) else v for v in r)) for r in rows))
    assert results[0] == results[1]


# --- suspected items ---------------------------------------------------------------------------------------------

def test_integer_bounds_holding_no_integer_are_refused():
    schema = {"privacy": {"unit": "row"},
              "tables": {"t": {"columns": {"x": {"type": "integer", "lower": 0.2, "upper": 0.8}}}}}
    with pytest.raises(errors.SchemaError, match="hold no integer"):
        parse_schema(schema)


def test_integer_bounds_are_the_integers_inside(base_url):
    schema = parse_schema({"privacy": {"unit": "row"}, "tables": {"people": {"columns": {
        "person_id": "bigint", "age": {"type": "integer", "lower": 0.5, "upper": 10.5}}}}})
    engine = Engine(Settings(database=base_url), schema)
    try:
        measure = engine.prepare("SELECT SUM(age) FROM people").plan.measures[0]
        with psycopg.connect(base_url) as conn:
            top = conn.execute(engine.prepare("SELECT MAX(age) FROM people").rewritten.histograms["h0"]).fetchall()
    finally:
        engine.close()
    assert (measure.row_range.lo, measure.row_range.hi) == (1, 10)
    assert max(cell for cell, _ in top) == 9  # ten cells, 1 .. 10


def test_identical_rows_truncated_on_two_keys_keep_one_order(server, template):
    """Four identical rows, two keys each allowing 2: both truncations follow one total order (hash, text, then
    physical identity), so the same 2 rows survive, and the self-join counts 2 × 2."""
    url = copy_database(server, template, "dpsql_twin_rows")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a bigint, b bigint, x double precision); CREATE TABLE u (b bigint); "
                     "INSERT INTO t SELECT 1, 1, 1 FROM generate_series(1, 4); INSERT INTO u VALUES (1)")
    schema = parse_schema({"privacy": {"unit": "row"}, "tables": {
        "t": {"columns": {"a": {"type": "bigint", "max_frequency": 2}, "b": {"type": "bigint", "max_frequency": 2},
                          "x": {"type": "double precision", "lower": 0, "upper": 1}}},
        "u": {"columns": {"b": {"type": "bigint", "unique": True}}}}})
    engine = Engine(Settings(database=url), schema)
    try:
        prepared = engine.prepare("SELECT COUNT(*) FROM t t1 JOIN t t2 ON t1.a = t2.a "
                                  "WHERE EXISTS (SELECT 1 FROM u WHERE u.b = t1.b)")
        assert dict(prepared.plan.truncate)["t"] == (("a", 2), ("b", 2))
        with psycopg.connect(url) as conn:
            for setting in ("SET enable_hashagg = off", "SET enable_sort = off"):
                conn.execute(setting)
                assert conn.execute(prepared.rewritten.sql).fetchone()[0] == 4
    finally:
        engine.close()


def test_an_invalid_unique_index_guarantees_nothing(server, template):
    url = copy_database(server, template, "dpsql_invalid_index")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE dup (k bigint); INSERT INTO dup VALUES (1), (1)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY dup_k ON dup (k)")
        assert conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = 'dup_k'::regclass").fetchone() \
            == (False,)
    backend = PostgresBackend(url, max_connections=1)
    try:
        unique = backend.catalog().unique
    finally:
        backend.close()
    assert ("dup", "k") not in unique and ("people", "person_id") in unique


def test_the_keyed_hash_tells_null_from_position(base_url):
    """The tie itself: concat_ws('|', 'lab', NULL) = concat_ws('|', NULL, 'lab') = 'lab'; so did their hashes."""
    from dpsql.rewrite.fragments import keyed_hash
    from dpsql.sql.dialect import Statement

    pairs = [(["'lab'::text", "NULL::text"], ["NULL::text", "'lab'::text"]),
             (["''::text", "NULL::text"], ["NULL::text", "NULL::text"]), (["'a|b'::text", "'c'::text"],
                                                                       ["'a'::text", "'b|c'::text"])]
    with psycopg.connect(base_url) as conn:
        for left, right in pairs:
            compared = Statement.parse(f"SELECT {keyed_hash(left, 7)} = {keyed_hash(right, 7)}")
            same = conn.execute(compared.sql).fetchone()[0]
            assert not same, (left, right)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM people WHERE dpsql_strict_bound(age, 0, 'integer', TRUE) > 3",
    "SELECT dpsql_row_id(people), COUNT(*) FROM people GROUP BY 1",
    "SELECT COUNT(*) FROM dpsql_truncated(people, 1, person_id, 1) AS p",
    "SELECT dpsql_keyed_hash(1, age) AS h, COUNT(*) FROM people GROUP BY 1",
    'SELECT COUNT(*) FROM people WHERE age BETWEEN "dpsql_earliest"() AND dpsql_latest()',
])
def test_an_analyst_cannot_write_the_rewrite_s_dialect_nodes(engine, sql):
    """The rewrite's dialect nodes are calls of reserved names that each backend spells its own way (a row's
    physical identity, the keyed hash with the stored seed): written by an analyst, they are refused as any
    function off the allowlist, before anything runs."""
    from dpsql.errors import UnsupportedQuery
    with pytest.raises(UnsupportedQuery, match="is not supported by dpsql"):
        engine.prepare(sql)
