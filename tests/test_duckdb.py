"""The DuckDB backend: the same rewritten statement means the same on DuckDB as on PostgreSQL, the bounds hold on
DuckDB's neighbours, and a query goes through the engine with the ledger in PostgreSQL.

DuckDB runs in this process (the `duckdb` extra, installed with the test extra): nothing is skipped."""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import duckdb
import psycopg
import pytest
import sqlglot

from dpsql.backends import Cancellation
from dpsql.backends.duckdb import DuckDBBackend, to_duckdb
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.errors import Error, QueryCancelled, SchemaError, UnsupportedQuery
from dpsql.sql.dialect import Statement
from tests.conftest import EXTREME_ID
from tests.engines import (
    ALL_TABLES,
    QUERIES,
    assert_bounds_chosen_alike,
    assert_same_rows,
    equal_rows,
    export,
    schema_reading,
)
from tests.test_neighbours import QUERIES as NEIGHBOUR_QUERIES

# a parent link needs a key DuckDB's backend does not trust; people's key is not trusted either, nor states' (a
# region joined to a person's row in a per-unit subquery)
REFUSED_ON_DUCKDB = ("reaches the unit through visits.visit_id", "COUNT(DISTINCT ...) is answered only for the "
                     "privacy unit", "or with columns of a table that holds one row per unit")


def _database_file(paths: dict[str, Path], folder: Path) -> Path:
    """A DuckDB file holding the demo tables, loaded from their Parquet files."""
    path = folder / "demo.duckdb"
    with duckdb.connect(str(path)) as conn:
        for name, file in paths.items():
            conn.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet(?)", [str(file)])
    return path


@pytest.fixture(scope="module")
def duck_engine(within_bounds, tmp_path_factory):
    """An engine on a DuckDB file (opened read-only) holding the demo data within its bounds."""
    folder = tmp_path_factory.mktemp("duckdb_base")
    paths = export(within_bounds, folder, ALL_TABLES)
    database = _database_file(paths, folder)
    engine = Engine(Settings(database=f"duckdb:///{database}", ledger=within_bounds),
                    schema_reading(dict.fromkeys(ALL_TABLES)))
    yield engine
    engine.close()


CONSTRUCTS = [  # spellings that reach the backend as PostgreSQL wrote them
    "SELECT COUNT(*) FROM visits WHERE day < date_trunc('month', DATE '2024-03-15') - INTERVAL '1 day'",
    "SELECT COUNT(*), SUM((amount > 100)::int) FROM visits WHERE category IS DISTINCT FROM 'lab'",
    "SELECT to_char(day, 'YYYY-MM') AS m, to_char(day, 'YYYY/MM/DD HH24:MI:SS') AS t, COUNT(*) FROM visits "
    "GROUP BY 1, 2",
]


@pytest.mark.parametrize("written", ["Day", "FMMonth YYYY", "Mon DD", "IYYY-IW", "DDth", 'YYYY"Q"Q'])
def test_a_to_char_duckdb_would_print_otherwise_is_refused_before_its_charge(duck_engine, written):
    """sqlglot spells names, FM, TH, ISO fields and quoted letters wrongly for DuckDB's strftime: to_char(day,
    'Day') came back '7ay', a key no PostgreSQL would print. Such templates are refused when the query is
    prepared; the numeric fields with separators are printed alike (CONSTRUCTS)."""
    with pytest.raises(UnsupportedQuery, match="printed differently by this backend"):
        duck_engine.prepare(f"SELECT to_char(day, '{written}') AS k, COUNT(*) FROM visits GROUP BY 1")


def test_a_row_sample_is_refused_on_duckdb_before_its_charge(duck_engine):
    """DuckDB's sample is not known to meet the same rows at every read of a table in one statement, which the
    bounds rely on (PostgreSQL's BERNOULLI with a seed does)."""
    with pytest.raises(UnsupportedQuery, match="on the PostgreSQL backend only"):
        duck_engine.prepare("SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (10)")


@pytest.mark.parametrize("sql", QUERIES + [q for q in NEIGHBOUR_QUERIES if q not in QUERIES] + CONSTRUCTS)
def test_pre_noise_answers_on_duckdb_equal_postgresql_s(duck_engine, within_bounds, sql):
    """Every query class of the neighbour tests: the rewritten statements give the same rows on DuckDB as on
    PostgreSQL; the few DuckDB's backend refuses, it refuses for a known reason."""
    try:
        prepared = duck_engine.prepare(sql)
    except Error as exc:
        assert any(reason in str(exc) for reason in REFUSED_ON_DUCKDB), exc
        return
    assert_same_rows(duck_engine, prepared, within_bounds, sql)


def test_a_public_table_s_values_are_read_as_keys_on_duckdb_as_on_postgresql(duck_engine, engine):
    sql = "SELECT s.region, COUNT(*) FROM people p JOIN states s ON s.code = p.state GROUP BY s.region"
    domain = duck_engine.prepare(sql).plan.domain
    assert domain is not None and sorted(domain) == sorted(engine.prepare(sql).plan.domain)


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM visits", "SELECT SUM(amount) FROM visits",
                                 "SELECT category, AVG(amount) FROM visits GROUP BY category",
                                 "SELECT category, COUNT(DISTINCT day) FROM visits GROUP BY category"])
def test_bounds_chosen_from_the_data_read_and_answer_alike_on_duckdb(duck_engine, within_bounds, sql):
    assert_bounds_chosen_alike(duck_engine, within_bounds, sql)


def test_neighbour_moves_duckdb_s_answers_within_the_sensitivity(neighbour_url, base_url, within_bounds,
                                                                 tmp_path_factory):
    """The base data and its neighbour with one extreme unit (thousands of visits in every category, out-of-bound
    and NaN values), each in a DuckDB database read from Parquet files: every exact answer of every query class
    moves by at most its measure's sensitivity."""
    engines = []
    for name, url in (("base", base_url), ("neighbour", neighbour_url)):
        paths = export(url, tmp_path_factory.mktemp(f"duckdb_n_{name}"), ALL_TABLES)
        engines.append(Engine(Settings(database="duckdb:///:memory:", ledger=within_bounds), schema_reading(paths)))
    try:
        checked = 0
        for sql in QUERIES + [q for q in NEIGHBOUR_QUERIES if q not in QUERIES]:
            try:
                prepared = engines[0].prepare(sql)
            except Error:
                continue
            if prepared.plan is None or not prepared.plan.aggregates:
                continue
            answers = []
            for engine in engines:
                with engine.backend.session() as session:
                    answers.append(session.run(prepared.rewritten.statement))
            plan, n_keys = prepared.plan, len(prepared.plan.group_keys)
            before, after = ({tuple(r[:n_keys]): r[n_keys:] for r in rows} for rows in answers)
            released = before.keys() | after.keys() if plan.domain is None else set(map(tuple, plan.domain))
            for i, measure in enumerate(plan.measures):
                moved = sum(abs(float(after.get(k, [0] * 9)[i] or 0) - float(before.get(k, [0] * 9)[i] or 0))
                            for k in released)
                assert moved <= measure.sensitivity * (1 + 1e-9), (sql, measure.label, moved, measure.sensitivity)
            checked += 1
        assert checked > 40 and EXTREME_ID
    finally:
        for engine in engines:
            engine.close()


@pytest.mark.parametrize("world", ["row", "unit"])
def test_fuzzed_queries_on_duckdb_move_within_their_claims(world, fuzz_world, tmp_path):
    """The neighbour fuzzer on DuckDB, both worlds: one unit (or, under row-level privacy, one row: truncated
    tables and row ids) added or removed where it harms most moves no pre-noise answer past its claim."""
    from tests import fuzzing
    with fuzzing.duckdb_world(world, *fuzz_world(world), tmp_path) as (engine, databases):
        neighbours = {n: d for n, d in databases.items() if n != "base"}
        report = fuzzing.fuzz(engine, fuzzing.WORLDS[world].generate, databases["base"], neighbours, 60, seed=2026)
    assert not report.violations, "\n".join(report.violations[:20])
    assert report.pairs >= 60, report.summary()


@pytest.fixture(scope="module")
def shipped_on_duckdb(server, tmp_path_factory):
    """The accuracy suite's data (tests/test_accuracy.py: 20,000 people) in DuckDB, under the shipped schema
    (bounds chosen from the data), with its PostgreSQL copy for the exact answers and the ledger."""
    from dpsql.demo import load_demo_data
    from tests.conftest import SHIPPED_SCHEMA, database_url
    from tests.test_accuracy import PEOPLE

    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS dpsql_accuracy_duckdb")
        conn.execute("CREATE DATABASE dpsql_accuracy_duckdb")
    url = database_url(server, "dpsql_accuracy_duckdb")
    load_demo_data(url, people=PEOPLE, seed=3)
    paths = export(url, tmp_path_factory.mktemp("duckdb_accuracy"))
    engine = Engine(Settings(database="duckdb:///:memory:", ledger=url), schema_reading(paths, SHIPPED_SCHEMA))
    yield engine, url
    engine.close()


@pytest.mark.parametrize("label", ["visits by quarter", "visits by category", "SUM(amount) by quarter",
                                   "AVG(amount)", "AVG(amount) by category"])
def test_on_duckdb_answers_are_unbiased_and_their_intervals_cover_the_truth(shipped_on_duckdb, label):
    """The accuracy suite's check on DuckDB: no bias beyond 1% and 95% intervals that cover the exact answer (read
    on PostgreSQL) at least 93% of the time, with bounds chosen from the data by DuckDB's own race."""
    from tests.test_accuracy import _assert_unbiased_and_covered

    engine, url = shipped_on_duckdb
    _assert_unbiased_and_covered(engine, url, label, 1.0)


def test_a_noisy_answer_through_duckdb_is_charged_in_the_postgresql_ledger(duck_engine):
    duck_engine.ledger.add_analyst("duck", 5.0, 1e-6)
    answer = duck_engine.query("SELECT category, COUNT(*) FROM visits GROUP BY category", analyst="duck",
                               epsilon=0.5)
    assert len(answer.rows) == 8 and duck_engine.budget("duck").epsilon_basic == pytest.approx(0.5)
    again = duck_engine.query("SELECT category, COUNT(*) FROM visits GROUP BY category", analyst="duck",
                              epsilon=0.5)
    assert again.cached and again.rows == answer.rows


def test_sessions_in_several_threads_each_read_on_their_own_connection(duck_engine, within_bounds):
    """The engine's sessions run in the server's threads at once: each has its own DuckDB connection, and every
    thread reads the same rows as PostgreSQL gives."""
    from tests.conftest import in_threads

    statement = duck_engine.prepare("SELECT category, COUNT(*), SUM(amount) FROM visits GROUP BY category") \
        .rewritten.statement
    with psycopg.connect(within_bounds) as conn:
        expected = conn.execute(statement.sql).fetchall()

    def read() -> list[tuple]:
        with duck_engine.backend.session() as session:
            return session.run(statement)

    results, failures = in_threads(read, 8)
    assert not failures and len(results) == 8
    assert all(equal_rows(expected, rows) for rows in results)


def test_health_is_none_while_duckdb_answers_and_a_reason_once_it_is_closed(duck_engine):
    assert duck_engine.health() == {"backend": None, "ledger": None}
    backend = DuckDBBackend("duckdb:///:memory:", duck_engine.schema)
    assert backend.health() is None
    backend.close()
    assert backend.health().startswith("DuckDB does not answer")


def test_a_file_of_plain_tables_has_no_key_to_trust(duck_engine):
    catalog = duck_engine.backend.catalog()
    assert not catalog.unique and not catalog.references and not catalog.keys_known
    assert catalog.columns["visits"]["amount"] == "double" and catalog.columns["people"]["person_id"] == "bigint"
    assert re.search(r"\bdpsql_unit\b", duck_engine.prepare("SELECT COUNT(*) FROM people").rewritten.sql)
    with pytest.raises(UnsupportedQuery, match="visits.visit_id"):
        duck_engine.prepare("SELECT drug, COUNT(*) FROM prescriptions GROUP BY drug")


@pytest.fixture(scope="module")
def keyed_file(within_bounds, tmp_path_factory) -> Path:
    """The demo tables in a DuckDB file with the demo's keys (PRIMARY KEY, FOREIGN KEY, NOT NULL)."""
    from dpsql.demo import duckdb_file

    return duckdb_file(within_bounds, tmp_path_factory.mktemp("duckdb_keyed"))


def test_a_file_s_keys_are_trusted_as_postgresql_s(keyed_file, within_bounds):
    """A table that reaches its unit through its parent's key is answered as on PostgreSQL, and a primary key
    bounds the unit's rows without a truncation."""
    engine = Engine(Settings(database=f"duckdb:///{keyed_file}", ledger=within_bounds),
                    schema_reading(dict.fromkeys(ALL_TABLES)))
    try:
        catalog = engine.backend.catalog()
        assert catalog.keys_known and ("people", "person_id") in catalog.unique
        assert catalog.references[("prescriptions", "visit_id")] == ("visits", "visit_id")
        assert ("visits", "person_id") in catalog.not_null
        assert not re.search(r"\bdpsql_unit\b", engine.prepare("SELECT COUNT(*) FROM people").rewritten.sql)
        for sql in ("SELECT drug, COUNT(*) FROM prescriptions GROUP BY drug",
                    "SELECT COUNT(*), SUM(cost) FROM prescriptions"):
            assert_same_rows(engine, engine.prepare(sql), within_bounds, sql)
    finally:
        engine.close()


def test_a_schema_that_does_not_match_the_file_stops_the_engine_at_start(keyed_file, within_bounds):
    schema = schema_reading(dict.fromkeys(ALL_TABLES))
    visits = schema.tables["visits"]
    renamed = {("duration" if name == "amount" else name): replace(column, name="duration" if name == "amount"
                                                                   else name)
               for name, column in visits.columns.items()}
    broken = replace(schema, tables={**schema.tables, "visits": replace(visits, columns=renamed)})
    with pytest.raises(SchemaError, match=r"column visits.duration: the table has no column duration"):
        Engine(Settings(database=f"duckdb:///{keyed_file}", ledger=within_bounds), broken)


@pytest.mark.integration  # a subprocess with its own embedded PostgreSQL
def test_demo_on_duckdb():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "dpsql.cli", "demo", "--people", "1000", "--backend", "duckdb"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Smokers among survey respondents" in done.stdout and "(2 rows)" in done.stdout
    assert "prescriptions" in done.stdout and "not on" not in done.stdout  # the parent path is answered


def _duck(sql: str, schema: dict) -> str:
    return to_duckdb(Statement.parse(sql).tree, schema)


def test_postgresql_s_meaning_of_division_rounding_buckets_and_clamps_on_duckdb():
    """Integer division truncates toward zero, round() of a double rounds halves to even, width_bucket is
    PostgreSQL's (its edges included), strict clamps keep NULL NULL and NaN at the upper bound: each computed on
    DuckDB and compared with PostgreSQL's own values."""
    values = [-7.5, -0.0, 0.0, 2.5, 3.5, 24.999999999999996, 25.0, 99.99999999999999, 100.0, 1e300, None,
              float("nan")]
    conn = duckdb.connect()
    conn.execute("CREATE TABLE t (a BIGINT, x DOUBLE)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(a, x) for a, x in zip([-7, 7, 0, 5, 9, 2, 1, 3, 4, 6, None, 8],
                                                                             values, strict=True)])
    schema = {"t": {"a": "bigint", "x": "double precision"}}
    sql = ("SELECT a, a / 2 AS q, round(x) AS r, width_bucket(x, 0, 100, 4) AS w, "
           "dpsql_strict_bound(dpsql_strict_bound(x, 0, 'float', TRUE), 10, 'float', FALSE) AS c FROM t ORDER BY a")
    got = conn.execute(_duck(sql, schema)).fetchall()
    expected = [(-7, -3, -8.0, 0, 0.0), (0, 0, 0.0, 1, 0.0), (1, 0, 25.0, 2, 10.0), (2, 1, 25.0, 1, 10.0),
                (3, 1, 100.0, 4, 10.0), (4, 2, 100.0, 5, 10.0), (5, 2, 2.0, 1, 2.5), (6, 3, 1e300, 5, 10.0),
                (7, 3, -0.0, 1, 0.0), (8, 4, math.nan, None, 10.0), (9, 4, 4.0, 1, 3.5), (None, None, None, None, None)]
    for row, want in zip(got, expected, strict=True):
        # (PostgreSQL's width_bucket raises on NaN; the rewrite never hands it one: a clamp makes NaN a bound)
        assert row[:2] == want[:2] and (row[3] == want[3] or row[0] == 8), (row, want)
        for u, v in ((row[2], want[2]), (row[4], want[4])):
            assert (u is None and v is None) or u == v or (math.isnan(u) and math.isnan(v)), (row, want)


def test_width_bucket_on_duckdb_is_postgresql_s_at_every_edge(base_url):
    """Values at and next to each bucket's edges, where a formula computed in another order would disagree (each
    read from its text, which both engines round to the nearest double)."""
    edges = [0.0, 0.1, 0.2, 0.30000000000000004, 1 / 3, 0.7, 0.9999999999999999, 1.0]
    values = sorted({v for e in edges for v in (e, math.nextafter(e, -1), math.nextafter(e, 2))})
    sql = "SELECT x, width_bucket(x, 0, 1, 10) FROM (SELECT CAST(v AS DOUBLE PRECISION) AS x FROM (VALUES {}) AS " \
          "l(v)) AS t ORDER BY x".format(
        ", ".join(f"('{v!r}')" for v in values))
    with psycopg.connect(base_url) as conn:
        expected = conn.execute(sql).fetchall()
    tree = sqlglot.parse_one(sql, read="postgres")
    got = duckdb.connect().execute(to_duckdb(tree, {})).fetchall()
    assert got == expected


def test_a_truncated_table_on_duckdb_keeps_each_key_within_its_limit():
    """`dialect.truncated` in DuckDB: at most the limit per key value, identical rows told apart by row id, NULL
    keys never dropped."""
    conn = duckdb.connect()
    conn.execute("CREATE TABLE cut (k BIGINT, j TEXT, x DOUBLE)")
    conn.execute("INSERT INTO cut SELECT 1, 'a', 0.0 FROM range(6)")
    conn.execute("INSERT INTO cut SELECT 1, 'b', -0.0 FROM range(2)")
    conn.execute("INSERT INTO cut SELECT NULL, 'a', 1.0 FROM range(4)")
    conn.execute("INSERT INTO cut SELECT 2, NULL, 2.0 FROM range(5)")
    sql = "SELECT k, j, x FROM dpsql_truncated(cut, 7, k, 3, j, 3) AS c"
    rows = conn.execute(_duck(sql, {"cut": {"k": "bigint", "j": "text", "x": "double precision"}})).fetchall()
    for column in (0, 1):
        counts: dict = {}
        for row in rows:
            if row[column] is not None:
                counts[row[column]] = counts.get(row[column], 0) + 1
        assert all(n <= 3 for n in counts.values()), (column, counts)
    assert sum(1 for r in rows if r[0] is None) <= 3  # NULL k rows count against j = 'a' only


@pytest.mark.integration  # a DuckDB database, if one in memory
def test_the_statement_timeout_and_a_cancel_stop_a_duckdb_statement():
    slow = Statement.parse("SELECT COUNT(*) FROM range(100000000000) AS a(x) WHERE x % 7 = 3")
    backend = DuckDBBackend("duckdb:///:memory:", schema_reading(dict.fromkeys(ALL_TABLES)), statement_timeout_ms=300)
    try:
        started = time.monotonic()
        with pytest.raises(Error, match="DP008"), backend.session() as session:
            session.run(slow)
        assert time.monotonic() - started < 10
        cancel = Cancellation()
        threading.Timer(0.2, cancel.cancel).start()
        backend._timeout_s = 60
        with pytest.raises(QueryCancelled), backend.session(cancel) as session:
            session.run(slow)
    finally:
        backend.close()


def test_a_duckdb_url_without_a_postgresql_ledger_is_refused_with_how_to_fix_it():
    from dpsql.errors import ConfigError
    with pytest.raises(ConfigError, match="DuckDB backend keeps its ledger in PostgreSQL"):
        Engine(Settings(database="duckdb:///:memory:"), schema_reading(dict.fromkeys(ALL_TABLES)))

