"""The Spark backend: the same rewritten query means the same on Spark as on PostgreSQL, the bounds hold on
Spark's neighbours, and a query goes through every door's engine with the ledger in PostgreSQL.

Runs on a local Spark session (pyspark and Java 17); skipped, saying why, where Java is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest

from dpsql.config import Settings
from dpsql.schema import parse_schema
from tests.conftest import EXTREME_ID, copy_database
from tests.engines import (
    QUERIES,
    assert_bounds_chosen_alike,
    assert_same_rows,
    equal_rows,
    export,
    free_port,
    schema_reading,
    standalone_cluster,
    wait_for,
)
from tests.test_neighbours import QUERIES as NEIGHBOUR_QUERIES

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'dpsql[spark]')")
if shutil.which("java") is None:
    pytest.skip("the Spark backend needs Java 17, which is not installed", allow_module_level=True)

from dpsql.backends.spark import to_spark  # noqa: E402
from dpsql.demo import export_parquet  # noqa: E402
from dpsql.engine import Engine  # noqa: E402
from dpsql.sql.dialect import Statement  # noqa: E402


@pytest.fixture(scope="module")
def spark_engine(within_bounds, tmp_path_factory):
    paths = export(within_bounds, tmp_path_factory.mktemp("spark_base"))
    engine = Engine(Settings(database="spark://local[2]", ledger=within_bounds), schema_reading(paths))
    yield engine
    engine.close()


REFUSED_ON_SPARK = ("reaches the unit through visits.visit_id",  # a parent link: Spark verifies no key
                    'relation "screenings" does not exist',  # not among the tables these tests put on Spark
                    "or with columns of a table that holds one row per unit")  # states' key, in a per-unit subquery


@pytest.mark.parametrize("sql", QUERIES + [q for q in NEIGHBOUR_QUERIES if q not in QUERIES])
def test_pre_noise_answers_on_spark_equal_postgresql_s(spark_engine, within_bounds, sql):
    """The rewritten SQL (bounded as Spark needs: no key trusted) run on both backends gives the same rows, for
    this module's queries and every query class of the neighbour tests; the few Spark refuses, it refuses for a
    known reason."""
    from dpsql.errors import Error
    try:
        prepared = spark_engine.prepare(sql)
    except Error as exc:
        assert any(reason in str(exc) for reason in REFUSED_ON_SPARK), exc
        return
    assert_same_rows(spark_engine, prepared, within_bounds, sql)


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM visits", "SELECT SUM(amount) FROM visits",
                                 "SELECT category, AVG(amount) FROM visits GROUP BY category",
                                 "SELECT category, COUNT(DISTINCT day) FROM visits GROUP BY category"])
def test_bounds_chosen_from_the_data_read_and_answer_alike_on_spark(spark_engine, within_bounds, sql):
    assert_bounds_chosen_alike(spark_engine, within_bounds, sql)


@pytest.mark.parametrize("sql", ["SELECT CAST(day AS text) AS d, COUNT(*) FROM visits GROUP BY 1",
                                 "SELECT CAST(day AS text) AS d, COUNT(*), AVG(amount) FROM visits GROUP BY 1"])
def test_weighted_selection_reads_alike_on_spark(spark_engine, within_bounds, sql):
    """Partition selection over each unit's kept rows, weighed (`Plan.selects_on_weights`): the answer's statement
    releases the same groups with the same selection counts on Spark as on PostgreSQL (the data is within its
    bounds: no unit has more rows than it keeps, so no keyed hash decides which rows count)."""
    from dpsql.session import Options

    prepared = spark_engine.prepare(sql, options=Options(rows_per_unit="auto"))
    bound, rows = (4096, 10) if prepared.race_totals else (10, None)
    bounded = spark_engine._bounded_at(prepared, bound, 0.0, rows, True)  # k = the cap, as chosen
    assert bounded.plan.selects_on_weights and bounded.plan.rows_per_unit == 10
    with psycopg.connect(within_bounds) as conn:
        expected = {row[0]: int(row[-1]) for row in conn.execute(bounded.rewritten.sql).fetchall()}
    with spark_engine.backend.session() as session:
        got = {row[0]: int(row[-1]) for row in session.run(bounded.rewritten.statement)}
    assert got == expected and len(got) > 300, sql  # 366 days


def test_a_parent_link_needs_a_key_spark_cannot_verify(spark_engine):
    """prescriptions reach a person through visits.visit_id, which must be unique; Spark verifies no key, so the
    query is refused rather than trusted."""
    from dpsql.errors import UnsupportedQuery
    with pytest.raises(UnsupportedQuery, match="visits.visit_id"):
        spark_engine.prepare("SELECT drug, COUNT(*) FROM prescriptions GROUP BY drug")


def test_no_constraint_is_trusted_on_spark(spark_engine):
    assert spark_engine.backend.catalog() is None
    explain = spark_engine.prepare("SELECT COUNT(*) FROM people").rewritten.sql
    assert "dpsql_unit" in explain  # people's one row per person is enforced, not read from a primary key


def _spark(sql: str, schema: dict) -> str:
    """Spark's rendering of a statement written as the rewrite writes it (PostgreSQL's syntax, dialect nodes)."""
    return to_spark(Statement.parse(sql).tree, schema)


def test_integer_division_sums_and_rounding_keep_postgresql_s_meaning():
    schema = {"t": {"a": "int", "b": "bigint", "x": "double"}}
    spark_sql = _spark("SELECT a / 3 AS q, SUM(b) AS s, x / 2 AS h FROM t GROUP BY 1, 3", schema)
    assert "CAST(`t`.`a` / 3 AS BIGINT)" in spark_sql or "CAST(t.a / 3 AS BIGINT)" in spark_sql
    assert "DECIMAL(38, 0)" in spark_sql
    assert "BROUND(" in _spark("SELECT round(x) FROM t", schema).upper()  # halves to even, as PostgreSQL
    keyed = _spark("SELECT dpsql_keyed_hash(7, a, b) FROM t", schema)
    assert "XXHASH64(7," in keyed.upper()
    clamp = _spark("SELECT dpsql_strict_bound(dpsql_strict_bound(CAST(x AS DECIMAL), 0, 'numeric', TRUE), 10, "
                   "'numeric', FALSE) FROM t", schema)
    assert "DECIMAL(38, 10)" in clamp and "IS NULL THEN NULL ELSE LEAST(" in clamp
    # PostgreSQL reads 250e-2 as the numeric 2.50 and 1.5e1 as the numeric 15; Spark would read doubles
    numbers = _spark("SELECT CAST(250e-2 AS text), 1.5e1 / 2 FROM t", schema)
    assert "CAST(2.50 AS STRING)" in numbers and "CAST(15 AS DECIMAL(38, 0)) / 2" in numbers
    assert "COLLATE" not in _spark('SELECT CAST(a AS TEXT) COLLATE "C" FROM t', schema)  # bytewise already


def test_strict_clamps_keep_null_and_nan_on_spark(spark_engine):
    """PostgreSQL's strict smaller/larger keep NULL NULL and move NaN to the upper bound; so must Spark's."""
    sql = ("SELECT dpsql_strict_bound(dpsql_strict_bound(x, 0, 'float', TRUE), 10, 'float', FALSE) AS f, "
           "dpsql_strict_bound(dpsql_strict_bound(CAST(d AS DECIMAL), 0, 'numeric', TRUE), 10, 'numeric', FALSE) AS n "
           "FROM (SELECT CAST(NULL AS DOUBLE PRECISION) AS x, CAST(NULL AS NUMERIC) AS d UNION ALL "
           "SELECT CAST('NaN' AS DOUBLE PRECISION), 12.345 UNION ALL SELECT -3.5, 4.125) AS t")
    with spark_engine.backend.session() as session:
        rows = sorted(session.run(Statement.parse(sql)), key=repr)
    assert rows == sorted([(None, None), (10.0, 10), (0.0, 4.125)], key=repr)


def test_neighbour_moves_spark_s_answers_within_the_sensitivity(spark_engine, neighbour_url, base_url,
                                                                 tmp_path_factory):
    """On Spark, the base data and its neighbour with one extreme unit (thousands of visits in every category,
    out-of-bound and NaN values), for every fourth query class the neighbour tests have (for CI's time: the
    pre-noise test above checks every class's rows against PostgreSQL's, and `fuzz_neighbours.py --backend spark`
    runs longer): every exact answer moves by at most its measure's sensitivity."""
    base = export(base_url, tmp_path_factory.mktemp("spark_n_base"))
    neighbour = export(neighbour_url, tmp_path_factory.mktemp("spark_n_neighbour"))
    from dpsql.errors import Error
    spark = spark_engine.backend.spark
    checked = []
    for sql in (QUERIES + [q for q in NEIGHBOUR_QUERIES if q not in QUERIES])[::4]:
        try:
            prepared = spark_engine.prepare(sql)
        except Error:
            continue  # refused on Spark (test_pre_noise_answers_on_spark_equal_postgresql_s says why)
        if prepared.plan is not None and prepared.plan.aggregates:
            checked.append((sql, prepared))
    answers: list[list] = [[], []]  # each query's rows on the base data, then on the neighbour's (the views
    for answered, paths in zip(answers, (base, neighbour), strict=True):  # switched once: half the test's time)
        for name, path in paths.items():
            spark.read.parquet(str(path)).createOrReplaceTempView(name)
        with spark_engine.backend.session() as session:
            answered.extend(session.run(prepared.rewritten.statement) for _, prepared in checked)
    for (sql, prepared), base_rows, neighbour_rows in zip(checked, *answers, strict=True):
        plan = prepared.plan
        n_keys = len(plan.group_keys)
        before, after = ({tuple(r[:n_keys]): r[n_keys:] for r in rows} for rows in (base_rows, neighbour_rows))
        # a declared domain's keys are all that is released (rows of other keys are computed, never noised)
        released = before.keys() | after.keys() if plan.domain is None else set(map(tuple, plan.domain))
        assert released & (before.keys() | after.keys()) or not (before or after), (sql, 'domain keys unmatched')
        for i, measure in enumerate(plan.measures):
            moved = sum(abs(float(after.get(k, [0] * 9)[i] or 0) - float(before.get(k, [0] * 9)[i] or 0))
                        for k in released)
            assert moved <= measure.sensitivity * (1 + 1e-9), (sql, measure.label, moved, measure.sensitivity)
    _restore_views(spark_engine)
    assert EXTREME_ID  # the neighbour's unit is the conftest's


def test_row_ids_on_spark_tell_every_row_apart_and_stay_put(spark_engine):
    """Spark has no ctid: a row's id is its content and its copy number. Identical rows, rows that differ only
    in -0.0 and 0.0, a microsecond or a byte, and strings that would run together in a plain text join, all get
    different ids; two reads of the table pair every id one to one (so a query reading the table twice sees
    the same rows)."""
    spark = spark_engine.backend.spark
    spark.sql("SELECT * FROM VALUES (1, 'a,b', 'c', 0.0D, TIMESTAMP'2024-01-01 00:00:00.000001', X'00'), "
              "(1, 'a,b', 'c', 0.0D, TIMESTAMP'2024-01-01 00:00:00.000001', X'00'), "
              "(1, 'a,b', 'c', -0.0D, TIMESTAMP'2024-01-01 00:00:00.000001', X'00'), "
              "(1, 'a', 'b,c', 0.0D, TIMESTAMP'2024-01-01 00:00:00.000001', X'00'), "
              "(1, 'a,b', 'c', 0.0D, TIMESTAMP'2024-01-01 00:00:00.000002', X'00'), "
              "(1, 'a,b', 'c', 0.0D, TIMESTAMP'2024-01-01 00:00:00.000001', X'01'), "
              "(NULL, NULL, NULL, CAST('NaN' AS DOUBLE), NULL, NULL), "
              "(NULL, NULL, NULL, CAST('NaN' AS DOUBLE), NULL, NULL) AS t(n, s, u, x, at, b)"
              ).createOrReplaceTempView("dpsql_ids_test")
    types = {"dpsql_ids_test": {"n": "bigint", "s": "text", "u": "text", "x": "double precision",
                                "at": "timestamptz", "b": "bytea"}}
    ids = [r[0] for r in spark.sql(_spark("SELECT dpsql_row_id(t) FROM dpsql_ids_test AS t", types)).collect()]
    assert len(set(ids)) == len(ids) == 8, ids
    pairs = spark.sql(_spark("SELECT COUNT(*) FROM dpsql_ids_test AS t JOIN dpsql_ids_test AS w "
                             "ON dpsql_row_id(t) = dpsql_row_id(w)", types)).collect()[0][0]
    assert pairs == 8


@pytest.fixture(scope="module")
def row_world_within_bounds(fuzz_world, server, spark_engine, tmp_path_factory):
    """A Spark engine over the fuzzer's row-level world (LIST partitions, no keys) with every declared frequency
    and unique column within its bound, so truncation keeps the same rows on both backends."""
    from tests import fuzzing
    fuzz_world("row")
    url = copy_database(server, "dpsql_fuzz_row", "dpsql_spark_row_within")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM events WHERE (tableoid, ctid) IN (SELECT tableoid, ctid FROM (SELECT tableoid, "
                     "ctid, ROW_NUMBER() OVER (PARTITION BY account_id ORDER BY event_id) AS n FROM events "
                     "WHERE account_id IS NOT NULL) e WHERE n > 6)")
        conn.execute("DELETE FROM events WHERE event_id = 8")  # the world's one repeated event_id
    schema = fuzzing.WORLDS["row"].schema
    paths = export_parquet(url, tmp_path_factory.mktemp("spark_rows"), tuple(schema["tables"]))
    engine = Engine(Settings(database="spark://local[2]", ledger=url), parse_schema(
        {**schema, "tables": {t: {**spec, "path": str(paths[t])} for t, spec in schema["tables"].items()}}))
    yield engine, url
    engine.close()


def test_row_level_answers_on_spark_equal_postgresql_s(row_world_within_bounds):
    """Row-level privacy on Spark: for the fuzzer's row-level queries (joins truncated by key frequency, outer
    joins bounded per row, semijoins, grouped subqueries), the rewritten SQL gives PostgreSQL's rows."""
    import random

    from dpsql.errors import Error
    from tests import fuzzing
    engine, url = row_world_within_bounds
    rng, compared = random.Random(2026), 0
    for _ in range(25):
        sql = fuzzing.WORLDS["row"].generate(rng)
        try:
            prepared = engine.prepare(sql)
        except Error:
            continue
        assert_same_rows(engine, prepared, url, sql)
        compared += 1
    assert compared >= 15


SPARK_FUZZ_QUERIES = {"unit": 6, "row": 6}  # a few: each runs on five databases, about 3 s a query (most
# of the unit world's are refused on Spark, which trusts no parent key); `fuzz_neighbours.py --backend spark` more


@pytest.mark.parametrize("world", sorted(SPARK_FUZZ_QUERIES))
def test_fuzzed_queries_on_spark_move_within_their_claims(world, fuzz_world, spark_engine, tmp_path):
    """The neighbour fuzzer on Spark, both worlds: one unit (or, under row-level privacy, one row) added or
    removed where it harms most moves no pre-noise answer past its claim (benchmarks/fuzz_neighbours.py
    --backend spark runs more)."""
    from tests import fuzzing
    try:
        with fuzzing.spark_world(world, *fuzz_world(world), tmp_path) as (engine, databases):
            neighbours = {n: d for n, d in databases.items() if n != "base"}
            report = fuzzing.fuzz(engine, fuzzing.WORLDS[world].generate, databases["base"], neighbours,
                                  SPARK_FUZZ_QUERIES[world], seed=2026)
    finally:
        _restore_views(spark_engine)  # the unit world's tables share the demo's names
    assert not report.violations, "\n".join(report.violations[:20])
    assert report.pairs >= 15, report.summary()


def _restore_views(engine) -> None:
    """The engine's tables as its own Parquet files again, after a test pointed their views elsewhere."""
    for table in engine.schema.tables.values():
        if table.path:
            engine.backend.spark.read.parquet(table.path).createOrReplaceTempView(table.name)


def test_a_noisy_answer_through_spark_is_charged_in_the_postgresql_ledger(spark_engine):
    spark_engine.ledger.add_analyst("spark_analyst", 5.0, 1e-5)
    answer = spark_engine.query("SELECT sex, COUNT(*) FROM people GROUP BY sex", analyst="spark_analyst",
                                epsilon=0.5)
    assert {r[0] for r in answer.rows} == {"F", "M"} and answer.epsilon == pytest.approx(0.5)
    assert spark_engine.budget("spark_analyst").epsilon_basic == pytest.approx(0.5)
    assert spark_engine.health() == {"backend": None, "ledger": None}


def test_demo_on_spark(spark_engine, capsys):
    """`dpsql demo --backend spark`, in this process: its session is the module's (one JVM a process, as
    `SparkBackend` shares it), whose views it points at the demo's tables until they are restored."""
    from dpsql.cli import main
    try:
        assert main(["demo", "--people", "1000", "--backend", "spark"]) == 0
    finally:
        _restore_views(spark_engine)
    out = capsys.readouterr().out
    assert "Smokers among survey respondents" in out and "(2 rows)" in out
    assert "not on Spark: prescriptions reaches the unit through visits.visit_id" in out
    assert "give prescriptions the unit column" in out
    assert spark_engine.backend.spark.sql("SELECT 1").collect()  # the demo closed its backend, not the session


# --- Spark Connect (sc://): how a cluster is reached -----------------------------------------------------------


@pytest.fixture(scope="module", params=["standalone"])  # "local[2]" too reaches the same door; CI's time is short
def connect_url(request, tmp_path_factory):
    """A Spark Connect server (pyspark's own) on a free port, for the sc:// door, on a standalone cluster of a
    master and two workers (or on `local[2]`, the same door without the cluster)."""
    import os
    import subprocess

    pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect] (grpcio): pip install 'dpsql[spark]'")
    home = Path(pyspark.__file__).parent
    folder = tmp_path_factory.mktemp("spark_connect")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOG_DIR": str(folder), "SPARK_PID_DIR": str(folder),
           "SPARK_IDENT_STRING": f"dpsql{folder.name}", "SPARK_LOCAL_IP": "127.0.0.1"}
    master, daemons = (request.param, []) if request.param != "standalone" else standalone_cluster(
        home, folder, {**env, "SPARK_DAEMON_MEMORY": "256m"})  # the master's and workers' own heaps
    # chosen once the cluster is up: a worker's web UI, bound meanwhile, once took it (CI: an HTTP/1.1 answer)
    port = free_port()
    subprocess.run(["bash", str(home / "sbin" / "start-connect-server.sh"), "--master", master, "--conf",
                    f"spark.connect.grpc.binding.port={port}", "--conf", "spark.ui.enabled=false", "--conf",
                    "spark.executor.memory=512m", "--conf", "spark.cores.max=2", "--conf",
                    "spark.sql.shuffle.partitions=4"], env=env, check=True, capture_output=True)
    try:
        wait_for(port, folder, "the Spark Connect server")
        yield f"sc://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", str(home / "sbin" / "stop-connect-server.sh")], env=env, capture_output=True)
        for daemon in daemons:
            daemon.terminate()
            daemon.wait(timeout=30)


def test_spark_connect_answers_as_the_local_session_does(connect_url, spark_engine, within_bounds):
    """Through sc:// (a Spark Connect server on a standalone cluster whose executors are their own JVMs), the same
    schema gives the same pre-noise rows as PostgreSQL (as the local session does), the session keeps the rules the
    rewrite rests on (ANSI arithmetic, UTC), and an answer is charged in the PostgreSQL ledger."""
    engine = Engine(Settings(database=connect_url, ledger=within_bounds), spark_engine.schema)
    try:
        assert engine.backend.spark.conf.get("spark.sql.ansi.enabled") == "true"
        assert engine.backend.spark.conf.get("spark.sql.session.timeZone") == "UTC"
        master = engine.backend.spark.conf.get("spark.master")
        assert master == "local[2]" or master.startswith("spark://127.0.0.1:"), master  # the cluster's own master
        for sql in QUERIES[:4] + QUERIES[6:8]:
            p = engine.prepare(sql)
            statements = [p.rewritten.statement, *p.rewritten.histogram_statements.values()]
            with psycopg.connect(within_bounds) as conn, engine.backend.session() as remote:
                for statement in statements:
                    assert equal_rows(conn.execute(statement.sql).fetchall(), remote.run(statement)), sql
        analyst = f"connect{connect_url.rsplit(':', 1)[-1]}"  # one per server: the ledger is the session's
        engine.ledger.add_analyst(analyst, 5.0, 1e-6)
        answer = engine.query("SELECT category, COUNT(*) FROM visits GROUP BY category", analyst=analyst,
                              epsilon=0.5)
        assert len(answer.rows) == 8 and engine.budget(analyst).epsilon_basic == pytest.approx(0.5)
    finally:
        engine.close()


def test_spark_sql_for_what_postgresql_has_and_spark_lacks(spark_engine):
    """What the neighbour fuzzer on Spark found: EXTRACT(EPOCH ...), isfinite and a date minus a date mean on
    Spark what they mean on PostgreSQL; to_char's ISO week fields, which Spark has no pattern for, are refused
    when the query is prepared (before any charge), not when it runs."""
    from dpsql.errors import UnsupportedQuery

    types = {"t": {"d": "date", "ts": "timestamptz"}}
    sql = _spark("SELECT EXTRACT(EPOCH FROM t.d), EXTRACT(EPOCH FROM t.ts), isfinite(t.d), "
                 "width_bucket(t.d - CAST('1970-01-01' AS DATE), 0, 100, 4) FROM t", types)
    assert "UNIX_DATE" in sql and "UNIX_MICROS" in sql and "DATEDIFF" in sql and "ISFINITE" not in sql.upper()
    spark = spark_engine.backend.spark
    (row,) = spark.sql("SELECT " + _spark("SELECT EXTRACT(EPOCH FROM CAST('2024-03-01' AS DATE)), "
                                           "EXTRACT(EPOCH FROM CAST('2024-03-01 12:00:00.5+00' AS TIMESTAMPTZ)), "
                                           "CAST('2024-03-01' AS DATE) - CAST('2024-01-01' AS DATE)",
                                           {})[len("SELECT "):]).collect()
    assert [float(v) for v in row] == [1709251200.0, 1709294400.5, 60.0]
    with pytest.raises(UnsupportedQuery, match="printed differently by this backend"):
        spark_engine.prepare("SELECT to_char(day, 'IYYY-IW') AS w, COUNT(*) FROM visits GROUP BY w")


def test_instants_at_the_first_day_spark_holds_come_back(spark_engine):
    """pyspark cannot turn the TIMESTAMP 0001-01-01 00:00 into a datetime (its conversion goes through local
    time); the backend fetches instants as microseconds, so date_trunc of the earliest day is an answer, not a
    failure after the charge (the Spark fuzzer's extreme dates found it)."""
    import datetime

    with spark_engine.backend.session() as session:
        rows = session.run(Statement.parse("SELECT date_trunc('month', CAST('0001-01-09' AS DATE)) AS m, 1 AS m, "
                                           "CAST('2024-05-01 10:00:00.000123+00' AS TIMESTAMPTZ), "
                                           "CAST(NULL AS TIMESTAMPTZ)"))
    utc = datetime.UTC
    assert rows == [(datetime.datetime(1, 1, 1, tzinfo=utc), 1,
                     datetime.datetime(2024, 5, 1, 10, 0, 0, 123, tzinfo=utc), None)]


def test_a_truncation_on_spark_keeps_each_key_within_its_limit(spark_engine):
    """rewrite/truncation.py's SQL, as Spark runs it (every row ranked within each key, no row ids): each key
    value keeps at most its limit, NULL keys are never cut, and identical rows, which tie, are ordered alike by
    both keys, so six copies under limits of 3 and 3 keep 3, not fewer."""
    from types import SimpleNamespace

    import sqlglot

    from dpsql.rewrite.truncation import from_where
    spark = spark_engine.backend.spark
    plan = SimpleNamespace(from_=sqlglot.exp.From(this=sqlglot.exp.to_table("dpsql_cut_test")), joins=[], where=None,
                           truncate={"dpsql_cut_test": [("k", 3), ("j", 3)]})
    sql = f"SELECT k, j, x {from_where(plan, hash_seed=7)}"
    types = {"dpsql_cut_test": {"k": "bigint", "j": "text", "x": "double precision"}}
    # small inputs happen to tie alike without it: that both keys order by one position is checked in the SQL
    assert _spark(sql, types).count("`dpsql_tie` NULLS LAST") == 2
    cases = {"VALUES " + ", ".join(["(1, 'a', 0.0D)"] * 6): 3,
             "VALUES " + ", ".join(["(1, 'a', 0.0D)"] * 5 + ["(1, 'b', -0.0D)"] * 2 + ["(NULL, 'a', 1.0D)"] * 4
                                   + ["(2, NULL, 2.0D)"] * 5 + ["(NULL, NULL, 3.0D)"] * 9): None}
    for values, expected in cases.items():
        spark.sql(f"SELECT * FROM {values} AS t(k, j, x)").createOrReplaceTempView("dpsql_cut_test")
        rows = [tuple(r) for r in spark.sql(_spark(sql, types)).collect()]
        if expected is not None:
            assert len(rows) == expected, rows
        for column in (0, 1):
            counts = {}
            for row in rows:
                counts[row[column]] = counts.get(row[column], 0) + 1
            assert all(n <= 3 for key, n in counts.items() if key is not None), counts
        if expected is None:  # NULL keys are never cut
            assert sum(1 for r in rows if r[0] is None and r[1] is None) == 9, rows
