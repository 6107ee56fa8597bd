"""`dpsql serve` in front of a PostgreSQL that fails, and against clients that take more than their share.

These tests start a PostgreSQL of their own (so that it can be restarted and its sessions terminated without
touching the other tests' server), put `dpsql serve` in front of it, and use real clients over real sockets.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from dpsql.config import Settings
from dpsql.demo import load_demo_data
from dpsql.embedded import EmbeddedPostgres
from dpsql.engine import Engine
from dpsql.server import ListenAddress, Server, build_server
from dpsql.server.auth import scram_verifier
from tests.conftest import DEMO_SCHEMA, in_threads
from tests.test_codec import cstr, frontend, startup

PASSWORD = "ops pass"
SLOW = "SELECT count(*) FROM generate_series(1, 2000000000)"  # a catalog query that runs until cancelled


@dataclass
class Deployment:
    postgres: EmbeddedPostgres
    url: str
    engine: Engine
    server: Server
    loop: asyncio.AbstractEventLoop

    def dsn(self, port: int | None = None, user: str = "ops", password: str = PASSWORD) -> str:
        return (f"host=127.0.0.1 port={port or self.server.port} user={user} password='{password}' dbname=demo "
                "sslmode=disable connect_timeout=10")

    def another_server(self, **options) -> Server:
        server = Server(self.server.gateway, ListenAddress("127.0.0.1", 0), **options)
        asyncio.run_coroutine_threadsafe(server.start(), self.loop).result()
        return server

    def stop(self, server: Server) -> None:
        asyncio.run_coroutine_threadsafe(server.close(), self.loop).result()

    def charges_and_answers(self, analyst: str) -> tuple[int, int]:
        with psycopg.connect(self.url) as conn:
            return conn.execute("SELECT (SELECT count(*) FROM dpsql.charges WHERE analyst = %s), "
                                "(SELECT count(*) FROM dpsql.answers WHERE analyst = %s)", (analyst, analyst)
                                ).fetchone()


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployment]:
    postgres = EmbeddedPostgres()
    admin = postgres.start()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE ops")
    url = admin.replace("/postgres?", "/ops?")
    load_demo_data(url, people=300, seed=3)
    engine, server = build_server(Settings(database=url, schema=str(DEMO_SCHEMA), listen="127.0.0.1:0",
                                           connect_timeout_s=2.0))
    for name in ("ops", "ops2", "flight"):
        engine.ledger.add_analyst(name, 1000.0, 1e-3)
        engine.ledger.set_verifier(name, scram_verifier(PASSWORD))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result()
    yield Deployment(postgres, url, engine, server, loop)
    asyncio.run_coroutine_threadsafe(server.close(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    server.gateway.close()
    engine.close()
    postgres.stop()


def _dp(conn: psycopg.Connection, lower: int) -> int:
    """A fresh DP query (each `lower` is a new answer, charged once)."""
    return conn.execute("SELECT COUNT(*) FROM people WHERE age >= %s", (lower,)).fetchone()[0]


def _eventually(statement, attempts: int = 3):
    """Run `statement` until it stops failing with 08006 (the one statement a fault may cost)."""
    for attempt in range(attempts):
        try:
            return statement()
        except psycopg.OperationalError as exc:
            if exc.sqlstate != "08006" or attempt == attempts - 1:
                raise


# --- PostgreSQL faults -------------------------------------------------------------------------------------------


def test_terminated_backends_cost_clients_nothing(deployed: Deployment):
    clients = [psycopg.connect(deployed.dsn(), autocommit=True) for _ in range(3)]
    try:
        for i, conn in enumerate(clients):
            assert conn.execute("SELECT 1").fetchone() == (1,)  # opens the client's shadow session
            assert _dp(conn, 10 + i) > 0
        with psycopg.connect(deployed.postgres.url, autocommit=True) as admin:  # every other session, dpsql's too
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'")
        for i, conn in enumerate(clients):
            # the statement may first meet the client's dead shadow session (08006, charged nothing); the engine's
            # pools replace their dead connections before anything is charged (the count below)
            assert _eventually(lambda conn=conn, i=i: _dp(conn, 20 + i)) > 0
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert not conn.closed
    finally:
        for conn in clients:
            conn.close()
    charges, answers = deployed.charges_and_answers("ops")
    assert charges == answers == 6


def test_restart_drops_no_client_and_charges_nothing_that_did_not_run(deployed: Deployment):
    clients = [psycopg.connect(deployed.dsn(user="ops2"), autocommit=True) for _ in range(2)]
    try:
        for conn in clients:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        deployed.postgres.halt()
        try:
            for i, conn in enumerate(clients):
                with pytest.raises(psycopg.OperationalError) as failed:
                    _dp(conn, 30 + i)
                assert failed.value.sqlstate == "08006" and "did not run" in str(failed.value)
                assert not conn.closed  # an error for the statement, not a FATAL for the session
        finally:
            deployed.postgres.start()
        for i, conn in enumerate(clients):
            assert _dp(conn, 30 + i) > 0
            assert _eventually(lambda conn=conn: conn.execute("SELECT 1").fetchone()) == (1,)
    finally:
        for conn in clients:
            conn.close()
    charges, answers = deployed.charges_and_answers("ops2")
    assert charges == answers == 2  # the two queries that failed during the restart cost nothing


def test_concurrent_identical_queries_are_charged_once(deployed: Deployment):
    sql = "SELECT sex, COUNT(*) FROM people GROUP BY sex"
    answers, failures = in_threads(lambda: deployed.engine.query(sql, analyst="flight", epsilon=0.5).rows, 50)
    assert not failures and len(answers) == 50
    assert all(rows == answers[0] for rows in answers)
    assert deployed.charges_and_answers("flight") == (1, 1)
    assert deployed.engine.budget("flight").epsilon_spent == pytest.approx(0.5)


# --- clients that take more than their share ---------------------------------------------------------------------


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_oversized_startup_packet_is_refused_on_its_header(deployed: Deployment):
    with socket.create_connection(("127.0.0.1", deployed.server.port), timeout=10) as sock:
        sock.sendall(struct.pack("!ii", 20_000, 196608) + b"user\0")  # PostgreSQL allows 10,000 bytes
        reply = _read_all(sock)
    assert reply.startswith(b"E") and b"08P01" in reply


def test_login_has_one_deadline_for_all_its_reads(deployed: Deployment):
    server = deployed.another_server(login_timeout=1.0)
    try:
        packet = startup(user="ops", database="demo")
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            try:
                for byte in packet:  # one byte every 0.2 s: each read is quick, the login is not
                    sock.sendall(bytes([byte]))
                    time.sleep(0.2)
                    if time.monotonic() - started > 5:
                        break
                closed = sock.recv(1) == b""
            except (ConnectionError, TimeoutError):
                closed = True
        assert closed and time.monotonic() - started < 3
    finally:
        deployed.stop(server)


def test_connection_limit_refuses_with_53300_and_cancels_still_work(deployed: Deployment):
    server = deployed.another_server(max_clients=2)
    try:
        busy = [psycopg.connect(deployed.dsn(server.port), autocommit=True) for _ in range(2)]
        errors: list[str] = []

        def slow(conn: psycopg.Connection) -> None:
            try:
                conn.execute(SLOW)
            except psycopg.Error as exc:
                errors.append(exc.sqlstate)

        threads = [threading.Thread(target=slow, args=(conn,)) for conn in busy]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # both statement workers are taken
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(deployed.dsn(server.port))
        assert "too many clients already" in str(refused.value) and time.monotonic() - started < 2  # 53300
        for conn in busy:
            conn.cancel_safe(timeout=5)  # CancelRequests get through while every statement worker is busy
        for thread in threads:
            thread.join(10)
        assert errors == ["57014", "57014"]
        busy[0].close()
        time.sleep(0.2)
        with psycopg.connect(deployed.dsn(server.port), autocommit=True) as conn:  # room again
            assert conn.execute("SELECT 1").fetchone() == (1,)
        busy[1].close()
    finally:
        deployed.stop(server)


def test_one_analyst_cannot_hold_every_connection(deployed: Deployment):
    """PgBouncer's max_user_connections: one analyst's logins past max_analyst_connections get PostgreSQL's 53300
    for a role's connection limit, and every other analyst still logs in and is answered."""
    cap = deployed.engine.settings.max_analyst_connections
    assert 0 < cap < deployed.engine.settings.max_client_connections
    held = [psycopg.connect(deployed.dsn(user="ops"), autocommit=True) for _ in range(cap)]
    try:
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(deployed.dsn(user="ops"))
        assert 'too many connections for role "ops"' in str(refused.value)
        with psycopg.connect(deployed.dsn(user="ops2"), autocommit=True) as other:
            assert _dp(other, 41) > 0
        held.pop().close()
        time.sleep(0.2)
        with psycopg.connect(deployed.dsn(user="ops"), autocommit=True) as again:  # room again
            assert again.execute("SELECT 1").fetchone() == (1,)
    finally:
        for conn in held:
            conn.close()


def test_prepared_statements_per_connection_are_bounded(deployed: Deployment):
    """A connection may hold max_prepared_statements named statements; the next Parse gets 53400 and the
    connection goes on (the unnamed statement, and those it deallocates, stay usable)."""
    server = deployed.another_server(max_prepared_statements=5)
    try:
        with psycopg.connect(deployed.dsn(server.port), autocommit=True) as conn:
            pgconn = conn.pgconn
            for i in range(5):
                assert pgconn.prepare(f"s{i}".encode(), b"SELECT 1").status == psycopg.pq.ExecStatus.COMMAND_OK
            failed = pgconn.prepare(b"s5", b"SELECT 1")
            assert failed.status == psycopg.pq.ExecStatus.FATAL_ERROR
            assert failed.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"53400"
            assert b"max_prepared_statements = 5" in failed.error_message
            assert conn.execute("SELECT 1").fetchone() == (1,)  # unnamed statements are not counted
            conn.execute("DEALLOCATE s0")
            assert pgconn.prepare(b"s5", b"SELECT 1").status == psycopg.pq.ExecStatus.COMMAND_OK
    finally:
        deployed.stop(server)


def test_idle_session_timeout_ends_the_session_as_postgresql_does(deployed: Deployment):
    server = deployed.another_server(idle_timeout=0.5)
    try:
        with psycopg.connect(deployed.dsn(server.port), autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            time.sleep(1.0)
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
            assert conn.closed or conn.broken
    finally:
        deployed.stop(server)


def _sasl_first(port: int, client_first: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(startup(user="ops", database="demo"))
        sock.recv(65536)  # AuthenticationSASL
        sock.sendall(frontend(b"p", cstr("SCRAM-SHA-256") + struct.pack("!i", len(client_first)) + client_first))
        return _read_all(sock)


@pytest.mark.parametrize("client_first", [b"n,", "n,,n=ops,r=\u00e9\u00e9".encode()], ids=["truncated", "non-ascii"])
def test_malformed_scram_is_a_protocol_error_not_an_internal_one(deployed: Deployment, client_first: bytes):
    reply = _sasl_first(deployed.server.port, client_first)
    assert reply.startswith(b"E") and b"08P01" in reply and b"XX000" not in reply


def test_binary_date_parameter_out_of_range_keeps_the_connection(deployed: Deployment):
    with psycopg.connect(deployed.dsn(), autocommit=True) as conn:
        conn.adapters.register_dumper(_Days, _DaysDumper)
        # a binary date of 2**31 - 1 days after 2000-01-01: PostgreSQL answers 22008 and goes on
        with pytest.raises(psycopg.Error) as failed:
            conn.execute("SELECT %b::date", (_Days(2**31 - 1),))
        assert failed.value.sqlstate == "22008"
        assert conn.execute("SELECT 1").fetchone() == (1,)


class _Days:
    """A date as a raw number of days since 2000-01-01, sent in binary (a value Python's date cannot hold)."""

    def __init__(self, days: int):
        self.days = days


class _DaysDumper(psycopg.adapt.Dumper):
    format = psycopg.pq.Format.BINARY
    oid = 1082  # date

    def dump(self, obj: _Days) -> bytes:
        return struct.pack("!i", obj.days)


# --- several processes on one database -------------------------------------------------------------------------


def test_a_second_instance_shares_the_shadow_and_a_new_schema_version_keeps_the_old_in_use(deployed: Deployment):
    from dataclasses import replace

    from dpsql.server.shadow import create_shadow

    def shadows() -> list[str]:
        with psycopg.connect(deployed.url) as conn:
            query = "SELECT datname FROM pg_database WHERE datname LIKE 'ops_dpsql_shadow%'"
            return [name for (name,) in conn.execute(query)]

    with psycopg.connect(deployed.dsn(), autocommit=True) as client:
        assert client.execute("SELECT current_database()").fetchone() == ("demo",)  # the name the client asked for
        [first] = shadows()
        again, _ = create_shadow(deployed.url, deployed.engine.schema)  # what a second `dpsql serve` does
        assert psycopg.conninfo.conninfo_to_dict(again)["dbname"] == first
        assert client.execute("SELECT count(*) FROM states").fetchone()[0] > 0  # refreshed, never gone
        tables = dict(deployed.engine.schema.tables)
        tables.pop("prescriptions")
        changed, _ = create_shadow(deployed.url, replace(deployed.engine.schema, tables=tables))
        assert psycopg.conninfo.conninfo_to_dict(changed)["dbname"] != first
        # the old version stays in use, prescriptions and all
        assert client.execute("SELECT count(*) FROM pg_class WHERE relname = 'prescriptions'").fetchone() == (1,)
    create_shadow(deployed.url, deployed.engine.schema)  # back to the first version; the unused one goes
    assert shadows() == [first]


def test_catalog_results_past_the_limit_are_cancelled_not_buffered(deployed: Deployment):
    with psycopg.connect(deployed.dsn(), autocommit=True) as conn:
        started = time.monotonic()
        with pytest.raises(psycopg.Error) as failed:  # 200 MB of text, which PostgreSQL would stream
            conn.execute("SELECT repeat('x', 1000000) FROM generate_series(1, 200)").fetchall()
        assert failed.value.sqlstate == "54000" and time.monotonic() - started < 10
        assert len(conn.execute("SELECT repeat('x', 1000) FROM generate_series(1, 1000)").fetchall()) == 1000


def test_metrics_count_connections_logins_statements_and_budgets(deployed: Deployment):
    from dpsql.server import parse_listen

    server = deployed.another_server(metrics_listen=parse_listen("127.0.0.1:0"))
    try:
        with psycopg.connect(deployed.dsn(server.port), autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            with pytest.raises(psycopg.Error):
                conn.execute("SELECT * FROM people")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(deployed.dsn(server.port, password="wrong"))
        with socket.create_connection(("127.0.0.1", server.metrics_port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            text = _read_all(sock).decode()
    finally:
        deployed.stop(server)
    assert text.startswith("HTTP/1.0 200 OK")
    for line in ['dpsql_logins_total{result="ok"}', 'dpsql_logins_total{result="failed"}',
                 'dpsql_statements_total{route="catalog"}', 'dpsql_errors_total{sqlstate="42501"}',
                 'dpsql_epsilon_spent{analyst="ops"}', "dpsql_open_connections"]:
        assert line in text, line
    gauges = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith(("process_resident_memory_bytes", "dpsql_threads", "dpsql_python_allocated"))}
    assert gauges["process_resident_memory_bytes"] > 2**20 and gauges["dpsql_threads"] >= 2
    assert gauges["dpsql_python_allocated_blocks"] > 1000
    assert "people" not in text  # no query text


def _get(port: int, path: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        return _read_all(sock).decode()


def test_health_says_which_part_cannot_answer_while_postgresql_is_down(deployed: Deployment):
    from dpsql.server import parse_listen

    server = deployed.another_server(metrics_listen=parse_listen("127.0.0.1:0"))
    try:
        healthy = _get(server.metrics_port, "/health")
        assert healthy.startswith("HTTP/1.0 200 OK") and healthy.endswith("backend: ok\nledger: ok\n")
        deployed.postgres.halt()
        try:
            down = _get(server.metrics_port, "/health")
        finally:
            deployed.postgres.start()
        assert down.startswith("HTTP/1.0 503 Service Unavailable")
        assert "backend: cannot reach PostgreSQL" in down and "ledger: cannot reach PostgreSQL" in down
        assert _eventually_healthy(server.metrics_port)
    finally:
        deployed.stop(server)


def _eventually_healthy(port: int) -> bool:
    """Whether /health says 200 within a few seconds (the pools replace their dead connections)."""
    for _ in range(20):
        if _get(port, "/health").startswith("HTTP/1.0 200"):
            return True
        time.sleep(0.25)
    return False


def test_a_charged_query_that_never_delivered_is_answered_without_a_second_charge(deployed: Deployment):
    engine, sql = deployed.engine, "SELECT COUNT(*) FROM visits WHERE amount > 17"
    engine.ledger.add_analyst("died", 10.0, 1e-5)
    prepared = engine.prepare(sql, epsilon=0.5)
    engine.ledger.charge("died", prepared.calibration.cost, prepared.key)  # as if PostgreSQL died under the query
    answer = engine.query(sql, analyst="died", epsilon=0.5)
    assert not answer.cached and answer.rows
    assert deployed.charges_and_answers("died") == (1, 1)
    assert engine.budget("died").epsilon_spent == pytest.approx(0.5)
    engine.query("SELECT COUNT(*) FROM visits WHERE amount > 18", analyst="died", epsilon=0.5)  # others are charged
    assert engine.budget("died").epsilon_spent == pytest.approx(1.0)


def test_a_query_that_failed_on_a_live_connection_is_charged_again(deployed: Deployment):
    from dpsql import errors
    from dpsql.backends import PostgresBackend

    slow = Engine(Settings(database=deployed.url, schema=str(DEMO_SCHEMA)))
    slow.backend.close()
    slow.backend = PostgresBackend(deployed.url, statement_timeout_ms=1)  # every DP query times out
    try:
        slow.ledger.add_analyst("timed", 10.0, 1e-5)
        sql = "SELECT category, SUM(amount) FROM visits v JOIN people p ON v.person_id = p.person_id GROUP BY 1"
        for _ in range(2):  # a timeout is an outcome: each attempt is charged (free retries would sample it)
            with pytest.raises(errors.BackendError):
                slow.query(sql, analyst="timed", epsilon=0.5)
        assert deployed.charges_and_answers("timed") == (2, 0)
        assert slow.budget("timed").epsilon_spent == pytest.approx(1.0)
    finally:
        slow.close()


def test_a_second_serve_with_another_schema_leaves_the_first_one_s_shadow(deployed: Deployment, tmp_path):
    """Issue 39: another `dpsql serve` on the same database with another version of the schema (a test instance
    beside production) drops the shadows nobody uses. The running instance's shadow stays, because its gateway
    holds a connection to it; and where that lease was down (a restart) and the shadow went, the first instance
    makes it again at its next login instead of failing every catalog query until it is restarted."""
    other = tmp_path / "other.toml"
    other.write_text(DEMO_SCHEMA.read_text().replace('max_rows_per_unit = 10 ', 'max_rows_per_unit = 11 ', 1)
                     + '\n[tables.extra]\npublic = true\n[tables.extra.columns]\ncode = "text"\n')
    with psycopg.connect(deployed.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS extra (code text)")
    with psycopg.connect(deployed.dsn(), autocommit=True) as conn:  # a login renews a lease a restart cut
        assert conn.execute("SELECT 1").fetchone() == (1,)
    first_shadow = deployed.server.gateway.shadow_url
    engine, second = build_server(Settings(database=deployed.url, schema=str(other), listen="127.0.0.1:0"))
    try:
        assert second.gateway.shadow_url != first_shadow  # another version, another shadow
        with psycopg.connect(first_shadow) as conn:  # still there
            assert conn.execute("SELECT COUNT(*) FROM pg_tables WHERE tablename = 'people'").fetchone()[0] == 1
        deployed.server.gateway.close()  # the lease down, as after a restart: the second instance drops it
        second.gateway.close()
        engine.close()
        engine, second = build_server(Settings(database=deployed.url, schema=str(other), listen="127.0.0.1:0"))
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(first_shadow).close()
        with psycopg.connect(deployed.dsn(), autocommit=True) as conn:  # made again at the next login
            assert conn.execute("SELECT COUNT(*) FROM pg_catalog.pg_tables WHERE tablename = 'visits'").fetchone() \
                == (1,)
    finally:
        second.gateway.close()
        engine.close()


def test_the_pool_hands_out_an_idle_connection_unasked_and_replaces_a_terminated_one(server):
    """A pooled connection with nothing to read is handed out without a round trip; one whose backend was
    terminated while it sat idle has the server's goodbye to read, fails its check and is replaced, so the
    statement after it runs."""
    import time

    from dpsql.backends.postgres import check_alive, checked_pool, pooled

    pool = checked_pool(server.url, 1)
    try:
        with pooled(pool) as conn:
            pid = conn.info.backend_pid
        with pooled(pool) as conn:
            check_alive(conn)  # idle and alive: returns
            assert conn.info.backend_pid == pid
        with psycopg.connect(server.url, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                time.sleep(0.01)
        with pooled(pool) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,) and conn.info.backend_pid != pid
    finally:
        pool.close()
