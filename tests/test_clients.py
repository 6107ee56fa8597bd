"""Drivers and tools unchanged (issue 18): what psql, asyncpg, pgjdbc and node-postgres send in ordinary use,
each with the real client: cursors, COPY … TO STDOUT, size functions, set_config, the current user, text date
parameters, binary catalog results and PostgreSQL's own error codes."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess

import psycopg
import pytest

from tests.conftest import PASSWORD, Running


def psql(served: Running, script: str, *options: str) -> subprocess.CompletedProcess:
    binary = shutil.which("psql")
    if binary is None:
        pytest.skip("psql is not installed")
    env = {**os.environ, "PGPASSWORD": PASSWORD}
    return subprocess.run([binary, "-X", "-h", "127.0.0.1", "-p", str(served.port), "-U", "ana", "-d", "demo",
                           *options], input=script, capture_output=True, text=True, env=env, timeout=60)


def test_psql_with_fetch_count_reads_through_a_cursor(served: Running):
    done = psql(served, "\\set FETCH_COUNT 2\nSELECT category, COUNT(*) FROM visits GROUP BY category "
                        "ORDER BY category;\nSELECT relname FROM pg_class WHERE relname IN ('people', 'visits') "
                        "ORDER BY 1;\n")
    assert done.returncode == 0, done.stderr
    assert "(8 rows)" in done.stdout and "checkup" in done.stdout and "vaccination" in done.stdout
    assert " people\n visits\n(2 rows)" in done.stdout
    assert "NOTICE:  dpsql: spent" in done.stderr and "ERROR" not in done.stderr


def test_cursors_declare_fetch_move_close(served: Running):
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            conn.execute("DECLARE c CURSOR FOR SELECT category, COUNT(*) FROM visits GROUP BY 1")
        conn.execute("BEGIN")
        conn.execute("DECLARE c NO SCROLL CURSOR FOR SELECT category, COUNT(*) FROM visits GROUP BY 1 ORDER BY 1")
        first = conn.execute("FETCH 3 FROM c").fetchall()
        assert [r[0] for r in first] == ["checkup", "dental", "emergency"]
        cursor = conn.execute("MOVE FORWARD 2 IN c")
        assert cursor.statusmessage == "MOVE 2"
        assert [r[0] for r in conn.execute("FETCH NEXT FROM c").fetchall()] == ["physio"]
        assert len(conn.execute("FETCH ALL FROM c").fetchall()) == 2
        assert conn.execute("FETCH c").fetchall() == []
        with pytest.raises(psycopg.errors.FeatureNotSupported):  # prepared (extended protocol), the session goes on
            conn.execute("FETCH BACKWARD 1 FROM c", prepare=True)
        conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        conn.execute("DECLARE c CURSOR FOR SELECT 1 AS one")
        assert conn.execute("FETCH 1 FROM c", prepare=True).fetchall() == [(1,)]
        with pytest.raises(psycopg.errors.DuplicateCursor):
            conn.execute("DECLARE c CURSOR FOR SELECT 1")
        conn.execute("ROLLBACK")
        conn.execute("DECLARE h CURSOR WITH HOLD FOR SELECT 1 AS one")
        assert conn.execute("FETCH ALL h").fetchall() == [(1,)]
        assert conn.execute("CLOSE h").statusmessage == "CLOSE CURSOR"
        with pytest.raises(psycopg.errors.InvalidCursorName):
            conn.execute("FETCH h")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the query inside is checked as any other
            conn.execute("DECLARE r CURSOR WITH HOLD FOR SELECT age FROM people")


def test_psycopg_server_side_cursor(served: Running):
    with psycopg.connect(served.dsn()) as conn, conn.cursor(name="big") as cursor:
        cursor.itersize = 3
        cursor.execute("SELECT category, COUNT(*) FROM visits GROUP BY 1 ORDER BY 1")
        assert len(list(cursor)) == 8


def test_copy_to_stdout_of_an_answer(served: Running, tmp_path):
    target = tmp_path / "out.csv"
    done = psql(served, f"\\copy (SELECT category, COUNT(*) AS n FROM visits GROUP BY 1 ORDER BY 1) TO '{target}' "
                        "WITH (FORMAT csv, HEADER)\n\\copy states TO STDOUT\n")
    assert done.returncode == 0, done.stderr
    lines = target.read_text().splitlines()
    assert lines[0] == "category,n" and len(lines) == 9 and lines[1].startswith("checkup,")
    assert "CA\tCalifornia\tWest" in done.stdout
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        with conn.cursor().copy("COPY (SELECT 'a,b' AS x, NULL AS y, '' AS z) TO STDOUT CSV") as copy:
            assert b"".join(copy) == b'"a,b",,""\n'
        with conn.cursor().copy("COPY (SELECT E'tab\\there' AS x, NULL AS y) TO STDOUT") as copy:
            assert b"".join(copy) == b"tab\\there\t\\N\n"
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.cursor().copy("COPY people TO STDOUT"):
            pass
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.cursor().copy("COPY people FROM STDIN"):
            pass


def test_psql_sizes_users_and_errors_as_postgresql_gives_them(served: Running):
    done = psql(served, "\\dt+\n\\l+\nSELECT current_user, session_user AS s;\nSELEC 1;\n"
                        "SELECT COUNT(nosuch) FROM people;\nSELECT COUNT(*) FROM nosuch;\n"
                        "SELECT COUNT(*) FROM people WHERE;\n", "-v", "VERBOSITY=verbose")
    assert done.returncode == 0, done.stderr
    assert "people" in done.stdout and "bytes" in done.stdout  # \dt+ sizes of the empty copies
    assert " ana          | ana\n" in done.stdout
    assert 'ERROR:  42601: syntax error at or near "SELEC"' in done.stderr
    assert 'ERROR:  42703: column "nosuch" does not exist' in done.stderr
    assert 'ERROR:  42P01: relation "nosuch" does not exist' in done.stderr
    assert "ERROR:  42601: syntax error at end of input" in done.stderr
    assert "sqlglot" not in done.stderr and "<class" not in done.stderr


def test_database_sizes_are_null(served: Running):
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        sizes = conn.execute("SELECT datname, pg_catalog.pg_database_size(datname), pg_size_pretty("
                             "pg_database_size(d.oid)) FROM pg_database d").fetchall()
        assert sizes and all(size is None and pretty is None for _, size, pretty in sizes)
        assert conn.execute("SELECT pg_total_relation_size('people')").fetchone()[0] < 100_000
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pg_stat_get_live_tuples('people'::regclass)")


def test_set_config_is_set(served: Running):
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT current_setting('jit') AS cur, set_config('jit', 'off', false) AS new"
                            ).fetchone()[1] == "off"
        conn.execute("SELECT set_config('TimeZone', 'Europe/Paris', false)")
        conn.execute("SELECT set_config('jit', %s, false)", ("on",))  # asyncpg's reset, with a parameter
        assert conn.info.parameter_status("TimeZone") == "Europe/Paris"
        for refused in ("SELECT set_config('role', 'postgres', false)",
                        "SELECT set_config('standard_conforming_strings', 'off', false)",
                        "SELECT set_config('client_encoding', 'UTF8' || 'x', false)",
                        "SELECT set_config(name, 'x', false) FROM pg_settings"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(refused)


def test_asyncpg_introspection_and_sqlalchemy_over_asyncpg(served: Running):
    asyncpg = pytest.importorskip("asyncpg")
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import create_async_engine

    async def session():
        conn = await asyncpg.connect(host="127.0.0.1", port=served.port, user="ana", password=PASSWORD,
                                     database="demo", ssl=False)
        # binary results of catalog types dpsql never encodes itself: PostgreSQL's own bytes pass through
        row = await conn.fetchrow("SELECT 'r'::\"char\" AS c, ARRAY[1, 2] AS a, interval '1 day' AS i, "
                                  "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS u, '{\"k\": 1}'::jsonb AS j, "
                                  "time '10:00' AS t, inet '10.0.0.1' AS n, '\\x01'::bytea AS b")
        assert row["c"] == b"r" and row["a"] == [1, 2] and row["i"].days == 1 and row["u"].hex.startswith("a0ee")
        assert row["j"] == '{"k": 1}' and str(row["n"]) == "10.0.0.1" and row["b"] == b"\x01"
        # a domain array makes asyncpg introspect the type, with set_config('jit', 'off', false) first
        await conn.fetch("SELECT $1::information_schema.sql_identifier[]", ["a", "b"])
        await conn.close()
        engine = create_async_engine(f"postgresql+asyncpg://ana:{PASSWORD.replace(' ', '%20')}@127.0.0.1:"
                                     f"{served.port}/demo")
        try:
            async with engine.connect() as connection:
                columns = await connection.run_sync(lambda c: sqlalchemy.inspect(c).get_columns("people"))
                assert [c["name"] for c in columns] == ["person_id", "age", "sex", "state", "income"]
        finally:
            await engine.dispose()

    asyncio.run(session())


def test_text_dates_and_timestamps_are_read_as_postgresql_reads_them(served: Running):
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        for text in ("2024-06-01 +00", "2024-06-01", "June 1, 2024", "2024-06-01 00:00:00+02"):
            count = conn.execute("SELECT COUNT(*) FROM visits WHERE day >= %s::date", (text,)).fetchone()[0]
            assert count >= 0
        assert conn.execute("SELECT %s::timestamptz = '2024-06-01 08:00:00+00'::timestamptz",
                            ("2024-06-01 10:00:00+02",)).fetchone()[0] is True
        with pytest.raises(psycopg.errors.InvalidDatetimeFormat):
            conn.execute("SELECT COUNT(*) FROM visits WHERE day >= %s::date", ("not a date",))


JDBC_DATES = r"""
import java.sql.*;
import java.util.Properties;
public class DpsqlDates {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.setProperty("user", "ana"); p.setProperty("password", args[1]); p.setProperty("sslmode", "disable");
        try (Connection c = DriverManager.getConnection(args[0], p);
             PreparedStatement s = c.prepareStatement("SELECT COUNT(*) FROM visits WHERE day >= ? AND day < ?")) {
            s.setDate(1, Date.valueOf("2024-01-01"));
            s.setTimestamp(2, Timestamp.valueOf("2024-06-01 00:00:00"));
            try (ResultSet r = s.executeQuery()) { r.next(); System.out.println("count=" + r.getLong(1)); }
        }
    }
}
"""


def test_pgjdbc_date_and_timestamp_parameters(served: Running, tmp_path):
    from tests.test_server import run_jdbc
    assert run_jdbc(served, tmp_path, "DpsqlDates", JDBC_DATES).stdout.startswith("count=")


NODE_DATES = r"""
const { Client } = require('pg');
(async () => {
  const c = new Client({ host: '127.0.0.1', port: +process.argv[2], user: 'ana', password: process.argv[3],
                         database: 'demo' });
  await c.connect();
  const r = await c.query('SELECT COUNT(*) AS n FROM visits WHERE day >= $1', [new Date('2024-06-01T10:00:00Z')]);
  console.log('count=' + r.rows[0].n);
  await c.end();
})().catch(e => { console.error(e); process.exit(1); });
"""


def test_node_postgres_date_parameter(served: Running, node_pg):
    (node_pg / "dates.js").write_text(NODE_DATES)
    done = subprocess.run(["node", "dates.js", str(served.port), PASSWORD], cwd=node_pg, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("count=")
