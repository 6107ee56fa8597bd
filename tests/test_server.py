"""`dpsql serve` with real clients over real sockets: psql, psycopg 3, asyncpg, pg8000, SQLAlchemy, pandas, and
pgjdbc and node-postgres where the machine has them.

Every client logs in with a password, runs SELECT 1, a parameterised DP aggregate and its own introspection,
survives an error, cancels a running query and closes cleanly.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from dpsql.config import Settings
from dpsql.server import codec, values
from dpsql.server.protocol import Conversation
from tests.conftest import DEMO_SCHEMA, PASSWORD, PEOPLE, Running, copy_database
from tests.test_codec import (
    FLUSH,
    SYNC,
    TERMINATE,
    backend_messages,
    bind,
    cstr,
    describe,
    execute,
    frontend,
    parse,
    startup,
)

DEMO_TABLES = ["checkins", "people", "prescriptions", "screenings", "states", "survey", "visits"]  # sorted
SLOW_CATALOG_QUERY = "SELECT count(*) FROM generate_series(1, 2000000000)"  # no data, just long


def _cancel_soon(cancel, delay: float = 0.5) -> threading.Timer:
    timer = threading.Timer(delay, cancel)
    timer.start()
    return timer


# --- psycopg 3 ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prepare", [False, True], ids=["unprepared", "prepared"])
def test_psycopg(served: Running, prepare: bool):
    notices = []
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_detail)))
        assert conn.execute("SELECT 1", prepare=prepare).fetchone() == (1,)
        for _ in range(3):  # prepare=True makes psycopg keep a named statement across calls
            cur = conn.execute("SELECT sex, COUNT(*), AVG(income) FROM people WHERE age >= %s GROUP BY sex "
                               "ORDER BY sex", (18 + prepare,), prepare=prepare)
            rows = cur.fetchall()
        assert [r[0] for r in rows] == ["F", "M"]
        assert 0.5 * PEOPLE < sum(r[1] for r in rows) < 1.1 * PEOPLE
        assert [d.type_code for d in cur.description] == [25, 20, 701]  # text, int8, float8
        assert notices[0][0].startswith("dpsql: spent ε") and "95%" in notices[0][1]
        assert notices[-1][0].startswith("dpsql: cached answer")  # the same query again costs nothing
        with conn.cursor(binary=True) as binary:
            (count, total), = binary.execute("SELECT COUNT(*), SUM(amount) FROM visits WHERE amount > %s",
                                             (10.5,), prepare=prepare).fetchall()
            assert isinstance(count, int) and isinstance(total, float)
        tables = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
                              "ORDER BY 1").fetchall()
        assert tables == [(t,) for t in DEMO_TABLES]
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute("SELECT * FROM people LIMIT 200")
        assert refused.value.diag.message_hint
        assert conn.execute("SELECT 2").fetchone() == (2,)  # still usable
        _cancel_soon(conn.cancel_safe)  # cancel() holds the GIL while it waits: fine for a server elsewhere
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute(SLOW_CATALOG_QUERY)
        assert conn.execute("SELECT 3").fetchone() == (3,)
    assert conn.closed


def test_bounds_effect_comes_as_a_second_notice(served: Running):
    notices = []
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_detail)))
        conn.execute("SET dpsql.bounds_epsilon = 0.05")
        conn.execute("SELECT category, SUM(amount) FROM visits WHERE amount > 1 GROUP BY category").fetchall()
    heading, detail = notices[-1]
    assert heading == "dpsql: bounds' effect (noisy counts of units, ε = 0.05 spent)"
    assert "units read" in detail and "with more than 10 rows (the rest left out)" in detail


def test_psycopg_transaction_status_follows_postgresql(served: Running):
    with psycopg.connect(served.dsn()) as conn:  # not autocommit: psycopg sends BEGIN
        info = conn.info
        conn.execute("SELECT COUNT(*) FROM people")
        assert info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT age FROM people")
        assert info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.rollback()
        assert info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        conn.execute("SAVEPOINT s1")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT age FROM people")
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.commit()
        assert info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_parameter_status_is_that_of_a_real_server_and_follows_set(served: Running):
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        status = conn.info.parameter_status
        assert status("server_version").split(".")[0].isdigit()
        assert status("client_encoding") == "UTF8" and status("DateStyle").startswith("ISO")
        assert status("session_authorization") == "ana" and status("is_superuser") == "off"
        conn.execute("SET application_name = 'dashboards'")
        assert status("application_name") == "dashboards"
        assert conn.execute("SHOW application_name").fetchone() == ("dashboards",)


def test_session_options_budget_and_interval_columns(served: Running):
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.25")
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == ("0.25",)
        before = served.engine.budget("ana").epsilon_basic
        conn.execute("SELECT COUNT(*) FROM visits WHERE category = 'lab'")
        assert served.engine.budget("ana").epsilon_basic == pytest.approx(before + 0.25)
        assert "spent" in conn.execute("SHOW dpsql.budget").fetchone()[0]
        conn.execute("SET dpsql.intervals = on")
        cur = conn.execute("SELECT sex, COUNT(*) AS n FROM people GROUP BY sex")
        assert [d.name for d in cur.description] == ["sex", "n", "n_ci_low", "n_ci_high"]
        for _, n, low, high in cur.fetchall():
            assert low <= n <= high
        # the extended protocol describes the same columns before it runs anything
        cur = conn.execute("SELECT COUNT(*) AS n FROM people WHERE age > %s", (40,), prepare=True)
        assert [d.name for d in cur.description] == ["n", "n_ci_low", "n_ci_high"]
        conn.execute("RESET dpsql.intervals")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SET dpsql.epsilon = -1")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SET dpsql.nonsense = 1")


def test_refusals_carry_postgresql_sqlstates(served: Running):
    refused = {
        "SELECT * FROM people LIMIT 200": psycopg.errors.InsufficientPrivilege,  # raw rows (Metabase scans)
        "EXPLAIN SELECT COUNT(*) FROM people": psycopg.errors.InsufficientPrivilege,
        "SELEC 1": psycopg.errors.SyntaxError,  # (database sizes are NULL: test_clients)
        "SELECT * FROM pg_stat_activity": psycopg.errors.InsufficientPrivilege,
        "SELECT relname, n_live_tup FROM pg_catalog.pg_stat_user_tables": psycopg.errors.InsufficientPrivilege,
        "SELECT txid_current()": psycopg.errors.InsufficientPrivilege,
        "INSERT INTO people VALUES (1, 2, 'F', 'CA', 3)": psycopg.errors.InsufficientPrivilege,
        "SET ROLE postgres": psycopg.errors.InsufficientPrivilege,
        "SET statement_timeout = 0": psycopg.errors.InsufficientPrivilege,
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE": psycopg.errors.InsufficientPrivilege,
        "LISTEN channel": psycopg.errors.FeatureNotSupported,
        "SELECT COUNT(*) FROM people EXCEPT SELECT COUNT(*) FROM visits": psycopg.errors.FeatureNotSupported,
        "SELECT COUNT(*) FROM nowhere": psycopg.errors.UndefinedTable,
    }
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        for sql, error in refused.items():
            with pytest.raises(error) as caught:
                conn.execute(sql)
            assert caught.value.diag.severity == "ERROR" and caught.value.diag.message_primary, sql
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_budget_exhausted_is_53400(served: Running):
    with psycopg.connect(served.dsn("poor"), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.4")
        conn.execute("SELECT COUNT(*) FROM people")
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as caught:
            conn.execute("SELECT COUNT(*) FROM visits")
        assert caught.value.sqlstate == "53400"
        assert "budget" in caught.value.diag.message_primary


def test_catalog_probes_and_comments_go_to_the_data_free_shadow(served: Running):
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("ana",)  # the analyst, as PostgreSQL would say
        assert conn.execute("SELECT current_setting('is_superuser')").fetchone() == ("off",)  # unprivileged shadow
        with psycopg.connect(served.engine.settings.database) as direct:
            states = direct.execute("SELECT code, name FROM states ORDER BY code").fetchall()
        assert conn.execute("SELECT code, name FROM states ORDER BY code").fetchall() == states  # public rows
        # one database, under the name the client connected to, as psql's \l+ and a BI tool's browser list it
        assert conn.execute("SELECT current_database(), current_catalog").fetchone() == ("demo", "demo")
        listed = conn.execute("SELECT d.datname, pg_catalog.has_database_privilege(d.datname, 'CONNECT'), "
                              "pg_catalog.pg_database_size(d.datname) FROM pg_catalog.pg_database d ORDER BY 1")
        assert listed.fetchall() == [("demo", True, None)]
        assert conn.execute("SELECT count(*) FROM pg_database").fetchone() == (1,)
        cur = conn.execute("SELECT TRUE FROM people WHERE 1 <> 1 LIMIT 0")  # Metabase's probe
        assert cur.fetchall() == [] and [d.name for d in cur.description] == ["?column?"]
        cur = conn.execute('SELECT "person_id", "age" FROM "public"."people" WHERE (1 = 0)')  # Tableau's
        assert cur.fetchall() == [] and [d.type_code for d in cur.description] == [20, 23]
        count = conn.execute("-- Metabase:: userID: 1 queryType: native\nSELECT COUNT(*) FROM people").fetchone()
        assert 0.9 * PEOPLE < count[0] < 1.1 * PEOPLE
        pgconn = conn.pgconn
        assert pgconn.exec_(b"-- a comment only").status == psycopg.pq.ExecStatus.EMPTY_QUERY
        assert pgconn.exec_(b"").status == psycopg.pq.ExecStatus.EMPTY_QUERY
        multi = pgconn.exec_(b"SELECT 1; SELECT COUNT(*) FROM people; SELECT 'last'")
        assert multi.get_value(0, 0) == b"last"
        assert conn.execute("DEALLOCATE ALL").statusmessage == "DEALLOCATE ALL"
        assert conn.execute("DISCARD ALL").statusmessage == "DISCARD ALL"


def test_wrong_password_and_unknown_analyst_fail_alike(served: Running):
    messages = []
    for user, password in [("ana", "wrong"), ("nobody", PASSWORD)]:
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(served.dsn(user, password))
        messages.append(str(caught.value).replace(user, "USER"))
        assert "password authentication failed" in str(caught.value)
    assert messages[0] == messages[1]


def test_md5_method_and_scram_verifiers_under_it(served: Running):
    md5_server = served.start(auth_method="md5")
    try:
        for user in ("md5user", "ana"):  # a SCRAM verifier still logs in with SCRAM, as in PostgreSQL
            dsn = served.dsn(user).replace(f"port='{served.port}'", f"port='{md5_server.port}'")
            with psycopg.connect(dsn, autocommit=True) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError):  # the default server refuses md5 verifiers
            psycopg.connect(served.dsn("md5user"))
    finally:
        served.stop(md5_server)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    return str(cert), str(key)


def test_tls_and_cleartext_passwords_only_over_it(served: Running, certificate):
    from dpsql.server import tls_context
    context = tls_context(Settings(tls_cert=certificate[0], tls_key=certificate[1]))
    tls_server = served.start(auth_method="password", tls=context)
    try:
        dsn = served.dsn().replace(f"port='{served.port}'", f"port='{tls_server.port}'")
        with psycopg.connect(dsn.replace("sslmode='disable'", "sslmode='require'"), autocommit=True) as conn:
            assert conn.info.pgconn.ssl_in_use
            assert conn.execute("SELECT COUNT(*) FROM people").fetchone()[0] > 0
        with pytest.raises(psycopg.OperationalError, match="only over TLS"):
            psycopg.connect(dsn)
    finally:
        served.stop(tls_server)
    with pytest.raises(psycopg.OperationalError):  # no TLS configured: SSLRequest gets N
        psycopg.connect(served.dsn(sslmode="require"))


# --- the other Python clients ------------------------------------------------------------------------------


def test_asyncpg(served: Running):
    asyncpg = pytest.importorskip("asyncpg")

    async def session():
        conn = await asyncpg.connect(host="127.0.0.1", port=served.port, user="ana", password=PASSWORD,
                                     database="demo", ssl=False)
        assert await conn.fetchval("SELECT 1") == 1
        rows = await conn.fetch("SELECT sex, COUNT(*) AS n FROM people WHERE age BETWEEN $1 AND $2 "
                                "GROUP BY sex ORDER BY sex", 18, 65)
        assert [r["sex"] for r in rows] == ["F", "M"] and all(isinstance(r["n"], int) for r in rows)
        assert await conn.fetchval("SELECT AVG(amount) FROM visits WHERE day >= $1",
                                   __import__("datetime").date(2024, 6, 1)) > 0
        types = await conn.fetch("SELECT typname FROM pg_type WHERE oid = ANY($1::oid[])", [20, 701])
        assert {r["typname"] for r in types} == {"int8", "float8"}
        async with conn.transaction():  # a cursor: Execute with a row limit, PortalSuspended
            fetched = [r[0] async for r in conn.cursor("SELECT generate_series(1, 25)", prefetch=4)]
        assert fetched == list(range(1, 26))
        with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
            await conn.fetch("SELECT age FROM people")
        assert await conn.fetchval("SELECT 2") == 2
        with pytest.raises(asyncio.TimeoutError):  # asyncpg cancels the query when the timeout passes
            await conn.fetchval(SLOW_CATALOG_QUERY, timeout=0.5)
        assert await conn.fetchval("SELECT 3") == 3
        await conn.close()

    asyncio.run(session())


def test_pg8000(served: Running):
    pg8000 = pytest.importorskip("pg8000.dbapi")
    conn = pg8000.connect(user="ana", password=PASSWORD, host="127.0.0.1", port=served.port, database="demo")
    cur = conn.cursor()
    cur.execute("SELECT 1")
    assert cur.fetchall() == ([1],)
    cur.execute("SELECT COUNT(*), SUM(income) FROM people WHERE state = %s", ("CA",))
    (count, total), = cur.fetchall()
    assert count >= 0 and total is not None
    cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY 1",
                ("visits",))
    assert [r[0] for r in cur.fetchall()] == ["amount", "category", "day", "person_id", "visit_id"]
    with pytest.raises(pg8000.DatabaseError) as caught:
        cur.execute("SELECT income FROM people")
    assert caught.value.args[0]["C"] == "42501"
    conn.rollback()
    cur.execute("SELECT 2")
    assert cur.fetchall() == ([2],)
    conn.close()


def test_sqlalchemy_inspect_and_pandas(served: Running):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pandas = pytest.importorskip("pandas")
    engine = sqlalchemy.create_engine(f"postgresql+psycopg://ana:{PASSWORD.replace(' ', '%20')}@127.0.0.1:"
                                      f"{served.port}/demo")
    try:
        inspector = sqlalchemy.inspect(engine)
        assert set(inspector.get_table_names()) == set(DEMO_TABLES)
        columns = {c["name"]: str(c["type"]) for c in inspector.get_columns("people")}
        assert columns == {"person_id": "BIGINT", "age": "INTEGER", "sex": "TEXT", "state": "TEXT",
                           "income": "DOUBLE PRECISION"}
        with engine.connect() as conn:
            frame = pandas.read_sql_query(sqlalchemy.text("SELECT category, COUNT(*) AS n FROM visits "
                                                          "WHERE amount > :low GROUP BY category"), conn,
                                          params={"low": 5})
            assert list(frame.columns) == ["category", "n"] and len(frame) == 8
            with pytest.raises(sqlalchemy.exc.ProgrammingError):
                conn.execute(sqlalchemy.text("SELECT * FROM visits"))
            conn.rollback()
            assert conn.execute(sqlalchemy.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


# --- psql, pgjdbc, node-postgres -----------------------------------------------------------------------------


def test_psql(served: Running):
    psql = shutil.which("psql")
    if psql is None:
        pytest.skip("psql is not installed")
    script = "\n".join([
        "SELECT 1 AS one;",
        "PREPARE q AS SELECT 1;",  # refused with 0A000, the session goes on
        r"\d people",
        "SELECT state, COUNT(*) FROM people WHERE age > 30 GROUP BY state ORDER BY 2 DESC LIMIT 3;",
        "SELECT age FROM people;",
        "SHOW dpsql.budget;",
        r"\q",
    ])
    env = {**os.environ, "PGPASSWORD": PASSWORD}
    done = subprocess.run([psql, "-X", "-h", "127.0.0.1", "-p", str(served.port), "-U", "ana", "-d", "demo"],
                          input=script, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert " one \n-----\n   1\n(1 row)" in done.stdout
    assert 'Table "public.people"' in done.stdout and "income" in done.stdout
    assert "(3 rows)" in done.stdout and "NOTICE:  dpsql: spent" in done.stderr
    assert "ERROR:  the query has no aggregate" in done.stderr and "ERROR:  PREPARE is not supported" in done.stderr
    assert "ε spent" in done.stdout


JDBC_JARS = ["/usr/share/java/postgresql.jar", *sorted(Path("/usr/share/java").glob("postgresql-*.jar"))]
JDBC_CLIENT = r"""
import java.sql.*;
import java.util.Properties;
public class DpsqlJdbc {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.setProperty("user", "ana"); p.setProperty("password", args[1]); p.setProperty("sslmode", "disable");
        try (Connection c = DriverManager.getConnection(args[0], p)) {
            try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT 1")) {
                r.next(); System.out.println("one=" + r.getInt(1));
            }
            try (PreparedStatement s = c.prepareStatement("SELECT COUNT(*) FROM people WHERE age > ?")) {
                for (int i = 0; i < 6; i++) {  // past prepareThreshold: server-prepared, binary transfer
                    s.setInt(1, 30 + i);
                    try (ResultSet r = s.executeQuery()) { r.next(); System.out.println("count=" + r.getLong(1)); }
                }
            }
            DatabaseMetaData m = c.getMetaData();
            try (ResultSet r = m.getTables(null, "public", "%", new String[] {"TABLE"})) {
                while (r.next()) System.out.println("table=" + r.getString("TABLE_NAME"));
            }
            try (ResultSet r = m.getColumns(null, "public", "people", "%")) {
                while (r.next()) System.out.println("column=" + r.getString("COLUMN_NAME"));
            }
            try (Statement s = c.createStatement()) { s.executeQuery("SELECT age FROM people"); }
            catch (SQLException e) { System.out.println("error=" + e.getSQLState()); }
            c.setAutoCommit(false);
            try (Statement s = c.createStatement()) {
                s.setFetchSize(3);
                try (ResultSet r = s.executeQuery("SELECT generate_series(1, 10)")) {
                    int n = 0; while (r.next()) n++; System.out.println("fetched=" + n);
                }
            }
            c.commit();
            try (Statement s = c.createStatement()) {
                new Thread(() -> { try { Thread.sleep(500); s.cancel(); } catch (Exception e) {} }).start();
                s.executeQuery("SELECT count(*) FROM generate_series(1, 2000000000)");
            } catch (SQLException e) { System.out.println("cancel=" + e.getSQLState()); }
            c.setAutoCommit(true);
            try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT 2")) {
                r.next(); System.out.println("after=" + r.getInt(1));
            }
        }
    }
}
"""


def run_jdbc(served: Running, folder: Path, name: str, source: str) -> subprocess.CompletedProcess:
    """Compile and run the Java class `name` (its `source`) with pgjdbc against `served`."""
    jar = next((str(j) for j in JDBC_JARS if Path(j).exists()), None)
    if jar is None or shutil.which("javac") is None:
        pytest.skip("pgjdbc is not installed (Debian: apt-get install libpostgresql-jdbc-java) or no JDK")
    (folder / f"{name}.java").write_text(source)
    subprocess.run(["javac", "-cp", jar, f"{name}.java"], cwd=folder, check=True, capture_output=True)
    done = subprocess.run(["java", "-cp", f"{jar}:.", name, f"jdbc:postgresql://127.0.0.1:{served.port}/demo",
                           PASSWORD], cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_pgjdbc(served: Running, tmp_path):
    done = run_jdbc(served, tmp_path, "DpsqlJdbc", JDBC_CLIENT)
    lines = done.stdout.splitlines()
    assert "one=1" in lines and sum(line.startswith("count=") for line in lines) == 6
    assert {"table=people", "table=visits", "table=states"} <= set(lines) and "column=income" in lines
    assert "error=42501" in lines and "fetched=10" in lines and "cancel=57014" in lines and "after=2" in lines


NODE_CLIENT = r"""
const { Client } = require('pg');
(async () => {
  const c = new Client({ host: '127.0.0.1', port: +process.argv[2], user: 'ana', password: process.argv[3],
                         database: 'demo' });
  await c.connect();
  console.log('one=' + (await c.query('SELECT 1 AS one')).rows[0].one);
  const r = await c.query('SELECT COUNT(*) AS n FROM people WHERE age > $1', [30]);
  console.log('count=' + r.rows[0].n);
  const t = await c.query("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'");
  console.log('tables=' + t.rows.map(x => x.table_name).sort().join(','));
  try { await c.query('SELECT age FROM people'); } catch (e) { console.log('error=' + e.code); }
  const slow = c.query('SELECT count(*) FROM generate_series(1, 2000000000)');
  setTimeout(() => { const k = new Client({ host: '127.0.0.1', port: +process.argv[2] });
                     k.cancel(c, c.activeQuery); }, 500);
  try { await slow; } catch (e) { console.log('cancel=' + e.code); }
  console.log('after=' + (await c.query('SELECT 2 AS two')).rows[0].two);
  await c.end();
})().catch(e => { console.error(e); process.exit(1); });
"""


def test_node_postgres(served: Running, node_pg: Path):
    (node_pg / "client.js").write_text(NODE_CLIENT)
    done = subprocess.run(["node", "client.js", str(served.port), PASSWORD], cwd=node_pg, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "one=1" in lines and any(line.startswith("count=") for line in lines)
    assert "tables=" + ",".join(DEMO_TABLES) in lines and "error=42501" in lines
    assert "cancel=57014" in lines and "after=2" in lines


# --- raw sockets: what a broken or hostile peer sends --------------------------------------------------------


def _exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("payload", [
    struct.pack("!i", 2),  # a length shorter than the length field
    struct.pack("!ii", 8, 1234),  # an unknown protocol version
    struct.pack("!i", 0x7FFFFFF0) + b"x" * 100,  # a message far too long
    struct.pack("!ii", 12, 196608) + b"user",  # a startup packet without its NULs
], ids=["short-length", "bad-version", "huge-length", "unterminated"])
def test_malformed_input_gets_an_error_and_a_closed_connection(served: Running, payload: bytes):
    reply = _exchange(served.port, payload)
    assert reply.startswith(b"E") and b"08P01" in reply
    with psycopg.connect(served.dsn(), autocommit=True) as conn:  # and the server goes on
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_truncated_message_and_abrupt_close_do_not_hurt_the_server(served: Running):
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(struct.pack("!ii", 40, 196608) + b"user\x00an")  # then hang up mid-message
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(struct.pack("!ii", 8, 80877103))  # SSLRequest: no TLS configured
        assert sock.recv(1) == b"N"
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


# --- the command line ----------------------------------------------------------------------------------------


def test_cli_passwd_and_serve(served: Running, server, template):
    database = copy_database(server, template, "dpsql_serve_cli")  # its own shadow, too
    env = {**os.environ, "DPSQL_DATABASE": database, "DPSQL_SCHEMA": str(DEMO_SCHEMA)}
    cli = [sys.executable, "-m", "dpsql.cli"]
    for command, stdin in [(["analyst", "add", "cli_user", "--epsilon", "5"], ""),
                           (["analyst", "passwd", "cli_user"], "other pass\n")]:
        done = subprocess.run([*cli, *command], input=stdin, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
    with psycopg.connect(database) as conn:
        stored = conn.execute("SELECT password_verifier FROM dpsql.analysts WHERE name = 'cli_user'").fetchone()[0]
    assert stored.startswith("SCRAM-SHA-256$") and "other pass" not in stored
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([*cli, "serve", "--listen", f"127.0.0.1:{port}", "--log-level", "debug"], env=env,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on" in process.stderr.readline()
        dsn = served.dsn("cli_user", "other pass").replace(f"port='{served.port}'", f"port='{port}'")
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    assert conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        process.terminate()
        process.wait(10)
    log = process.stderr.read()  # one line per connection, login, statement and answer; no SQL, no values
    for line in (r"connection client=(\d+) from 127\.0\.0\.1:\d+\n", r"login analyst=cli_user ",
                 r"answer analyst=cli_user epsilon=1 ", r"statement done analyst=cli_user tag=SELECT 1\n",
                 r"disconnection client=(\d+) after [\d.]+ s\n",
                 r"stopping on SIGTERM: closing \d+ client connections\n", r"INFO dpsql.server: stopped\n"):
        assert re.search(line, log), log
    assert "visits" not in log and "COUNT" not in log and "ERROR" not in log


# --- the protocol state machine, fed bytes directly (no sockets) ---------------------------------------------


def _conversation(served: Running) -> Conversation:
    return Conversation(served.server.gateway, process_id=77, secret=b"abcd")


def _login(conversation: Conversation, user: str = "ana", password: str = PASSWORD, **startup_extra: str):
    scramp = pytest.importorskip("scramp")
    reply = backend_messages(conversation.receive(startup(user=user, database="demo", **startup_extra)).data)
    assert reply[-1] == ("R", struct.pack("!i", 10) + b"SCRAM-SHA-256\0\0")
    client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
    first = client.get_client_first().encode()
    reply = backend_messages(conversation.receive(
        frontend(b"p", cstr("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first)).data)
    client.set_server_first(reply[0][1][4:].decode())
    output = conversation.receive(frontend(b"p", client.get_client_final().encode()))
    reply = backend_messages(output.data)
    assert reply[0][0] == "R" and reply[0][1][:4] == struct.pack("!i", 12)  # SASLFinal: the server's proof
    client.set_server_final(reply[0][1][4:].decode())
    return reply[1:]


def _kinds(data: bytes) -> str:
    return "".join(kind for kind, _ in backend_messages(data))


def test_conversation_login_reports_parameters_key_and_ready(served: Running):
    conversation = _conversation(served)
    reply = _login(conversation)
    kinds = "".join(k for k, _ in reply)
    assert kinds.startswith("R") and kinds.endswith("KZ") and set(kinds[1:-2]) == {"S"}  # AuthenticationOk first
    assert ("K", struct.pack("!i", 77) + b"abcd") in reply and reply[-1] == ("Z", b"I")
    names = {body.split(b"\0")[0].decode() for kind, body in reply if kind == "S"}
    assert {"server_version", "client_encoding", "DateStyle", "integer_datetimes",
            "standard_conforming_strings"} <= names
    assert conversation.receive(TERMINATE).close


def test_conversation_refuses_tls_and_gss_it_lacks_and_negotiates_3_2(served: Running):
    conversation = _conversation(served)
    assert conversation.receive(struct.pack("!ii", 8, codec.SSL_REQUEST)).data == b"N"
    assert conversation.receive(struct.pack("!ii", 8, codec.GSSENC_REQUEST)).data == b"N"
    body = struct.pack("!i", codec.PROTOCOL_3_2) + b"user\0ana\0_pq_.fancy\0on\0\0"
    reply = backend_messages(conversation.receive(struct.pack("!i", len(body) + 4) + body).data)
    assert reply[0] == ("v", struct.pack("!ii", 0, 1) + b"_pq_.fancy\0") and reply[1][0] == "R"


def test_conversation_extended_protocol(served: Running):
    conversation = _conversation(served)
    _login(conversation)
    out = conversation.receive(parse("s1", "SELECT generate_series(1, $1) AS n") + describe("S", "s1") + SYNC)
    reply = backend_messages(out.data)
    assert _kinds(out.data) == "1tTZ" and reply[1][1] == struct.pack("!hI", 1, values.INT4)  # type inferred
    # a row limit suspends the portal; Flush gets the answer out without a Sync
    out = conversation.receive(bind("p", "s1", [b"5"]) + execute("p", 2) + FLUSH)
    assert _kinds(out.data) == "2DDs"
    out = conversation.receive(execute("p", 0) + SYNC)
    assert _kinds(out.data) == "DDDCZ" and backend_messages(out.data)[-2] == ("C", b"SELECT 5\0")
    # the named statement outlives the Sync; binary results on request
    out = conversation.receive(bind("", "s1", [struct.pack("!i", 2)], (1,), (1,)) + execute() + SYNC)
    rows = [body for kind, body in backend_messages(out.data) if kind == "D"]
    assert rows == [struct.pack("!hi", 1, 4) + struct.pack("!i", 1), struct.pack("!hi", 1, 4) + struct.pack("!i", 2)]
    # a DP aggregate: int8 in binary, and the NOTICE before CommandComplete
    out = conversation.receive(parse("", "SELECT COUNT(*) FROM people WHERE age > $1") + bind("", "", [b"30"], (),
                                                                                               (1,))
                               + describe("P") + execute() + SYNC)
    assert _kinds(out.data) == "12TDNCZ"
    (count,) = struct.unpack("!q", backend_messages(out.data)[3][1][6:])
    assert 0 < count < PEOPLE
    # after an error everything up to Sync is skipped, then the connection goes on
    out = conversation.receive(bind("", "missing", []) + execute() + parse("", "SELECT 1") + SYNC)
    assert _kinds(out.data) == "EZ" and b"26000" in out.data
    out = conversation.receive(frontend(b"C", b"S" + cstr("s1")) + bind("", "s1", [b"1"]) + SYNC)
    assert _kinds(out.data) == "3EZ"  # closed: the statement is gone
    assert _kinds(conversation.receive(frontend(b"Q", cstr(""))).data) == "IZ"  # EmptyQueryResponse


def test_conversation_transaction_status(served: Running):
    conversation = _conversation(served)
    _login(conversation)

    def status(sql: str) -> tuple[str, bytes]:
        out = conversation.receive(frontend(b"Q", cstr(sql)))
        return _kinds(out.data), backend_messages(out.data)[-1][1]

    assert status("BEGIN") == ("CZ", b"T")
    assert status("SELECT age FROM people")[1] == b"E"
    kinds, state = status("SELECT 1")
    assert (kinds, state) == ("EZ", b"E")
    assert status("COMMIT") == ("CZ", b"I")  # reported as ROLLBACK, as PostgreSQL does
    assert status("SELECT 1; SELECT 2") == ("TDCTDCZ", b"I")
    assert status("ROLLBACK") == ("NCZ", b"I")  # WARNING: no transaction in progress


def test_conversation_closes_on_a_violation_after_login(served: Running):
    conversation = _conversation(served)
    _login(conversation)
    output = conversation.receive(b"\x00garbage")
    assert output.close and b"08P01" in output.data and backend_messages(output.data)[0][0] == "E"


def test_demo_serve_prints_a_working_psql_line(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "dpsql.cli", "demo", "--people", "500", "--serve", "--listen",
                                "127.0.0.1:0", "--data-dir", str(tmp_path / "pg")], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        line = ""
        while not line.strip().startswith('psql "') and time.monotonic() < deadline:
            line = process.stdout.readline()
            assert line or process.poll() is None, "dpsql demo --serve ended early"
        url = line.strip().removeprefix('psql "').removesuffix('"')
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM people").fetchone()[0] > 0
        while not line.startswith("Prometheus metrics: ") and time.monotonic() < deadline:
            line = process.stdout.readline()
        metrics = line.split(": ", 1)[1].strip()  # the address it printed answers a scrape
        with urllib.request.urlopen(metrics, timeout=10) as response:
            assert b"dpsql_connections_total" in response.read()
    finally:
        process.terminate()
        process.wait(30)
