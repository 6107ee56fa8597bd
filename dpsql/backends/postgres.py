"""PostgreSQL through psycopg 3: pooled, read-only, with a statement timeout set by dpsql.

PostgreSQL's error text never leaves this module: it is logged for the operator and replaced by a fixed
dpsql error, because a message such as "division by zero" or "value out of range" can depend on the data.

The rule for a statement that fails on the backend: the analysis makes every accepted query total (no value can
make it fail), so a residual failure is a dpsql bug, and it must not tell which database it ran on. Every failure
and every timeout therefore gives the same error (DP008, the same message), after the same charge: whether one
unit's rows made the query slow or made it fail, the analyst sees one outcome. Values the client cannot represent
(dates past year 9999, ±infinity) come back as PostgreSQL's text instead of failing in psycopg.
"""

from __future__ import annotations

import hashlib
import logging
import re
import select
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.adapt import Loader
from psycopg.types.datetime import DateLoader, TimestampLoader, TimestamptzLoader
from psycopg_pool import ConnectionPool, PoolTimeout

from dpsql.errors import (
    BackendError,
    BackendUnavailable,
    InternalError,
    InvalidConstant,
    QueryCancelled,
    SchemaError,
)
from dpsql.schema.catalog import Catalog
from dpsql.sql.dialect import Statement

log = logging.getLogger("dpsql.backend")
FAILED = ("PostgreSQL did not finish the query: it failed or ran past the statement timeout (which of the two, and "
          "why, is withheld: either can depend on the data)")
CONNECT_WAIT = 10.0  # seconds to wait for a working connection (a PostgreSQL restart takes a few)
UNAVAILABLE = "dpsql cannot reach PostgreSQL right now; the query did not run"
UNAVAILABLE_HINT = "retry in a moment; if it persists, ask the operator whether the database is up"
FAILED_HINT = ("check that the privacy schema matches the database's tables and types, simplify the query, or ask "
               "the operator for a longer statement_timeout")


def _text_on_failure(loader: type[Loader]) -> type[Loader]:
    """`loader`, returning PostgreSQL's text where Python has no value for it (a date in year 10000 or at
    infinity): which values a group key takes depends on the data, so loading one must never fail."""
    class Safe(loader):
        def load(self, data: Any) -> Any:
            try:
                return super().load(data)
            except psycopg.DataError:
                return bytes(data).decode()
    return Safe


SAFE_LOADERS = {"date": _text_on_failure(DateLoader), "timestamp": _text_on_failure(TimestampLoader),
                "timestamptz": _text_on_failure(TimestamptzLoader)}


def check_alive(conn: psycopg.Connection) -> None:
    """The pool's check of a connection it hands out: raises if the connection is dead. A connection that has
    nothing to read is idle and alive, as far as one can tell without asking; one the server wrote to while it
    was idle (a terminated backend's FATAL message, the EOF of a restart) is asked with an empty round trip,
    which fails if it is dead. The round trip on every hand-out was 4 of the 13 a fresh answer takes."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        ConnectionPool.check_connection(conn)


def checked_pool(conninfo: str, max_size: int, configure: Callable[[psycopg.Connection], None] | None = None,
                 wait: float = CONNECT_WAIT) -> ConnectionPool:
    """A pool whose connections are checked (`check_alive`) each time one is handed out, so that after a
    PostgreSQL restart or a terminated backend the pool replaces dead connections instead of handing them on.
    A database that cannot be reached at all fails at once, with PostgreSQL's reason: a wrong URL or password is
    the operator's to fix, and waiting for the pool would only hide it."""
    try:
        with psycopg.connect(conninfo, connect_timeout=int(wait) or 1):
            pass
    except psycopg.Error as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BackendUnavailable(f"cannot connect to PostgreSQL: {reason}",
                                 "check --database / DPSQL_DATABASE (a postgresql:// URL) and that the server runs"
                                 ) from None
    return ConnectionPool(conninfo, min_size=1, max_size=max_size, open=True, configure=configure,
                          check=check_alive, timeout=wait,
                          kwargs={"autocommit": True})


@contextmanager
def pooled(pool: ConnectionPool) -> Iterator[psycopg.Connection]:
    """A working connection of `pool`; BackendUnavailable when there is none (PostgreSQL down or restarting)."""
    try:
        conn = pool.getconn()
    except (PoolTimeout, psycopg.OperationalError) as exc:
        log.warning("no working connection to PostgreSQL: %s", exc)
        raise BackendUnavailable(UNAVAILABLE, UNAVAILABLE_HINT) from None
    try:
        yield conn
    except psycopg.OperationalError as exc:  # the connection broke while in use (statements raise dpsql errors)
        log.warning("lost a connection to PostgreSQL: %s", exc)
        raise BackendUnavailable(UNAVAILABLE, UNAVAILABLE_HINT) from None
    finally:
        pool.putconn(conn)


def pool_health(pool: ConnectionPool) -> str | None:
    """None when one of the pool's connections runs a trivial statement now; otherwise why not (a /health line)."""
    try:
        with pooled(pool) as conn:
            conn.execute("SELECT 1")
    except (BackendUnavailable, psycopg.Error):
        return "cannot reach PostgreSQL (no working connection)"
    return None


class Cancellation:
    """Lets another thread stop the statement that a query is running (a client's CancelRequest)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: psycopg.Connection | None = None
        self.cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            conn = self._conn
        if conn is not None:
            try:
                conn.cancel_safe(timeout=5)
            except (psycopg.Error, TimeoutError):
                log.warning("could not cancel a backend query")

    def attach(self, conn: psycopg.Connection | None) -> None:
        with self._lock:
            if conn is not None and self.cancelled:
                raise QueryCancelled("canceling statement due to user request")
            self._conn = conn


# SQLSTATEs of a table, column, type or schema the database lacks, or may not be read: the schema does not match
OWN_NAME = re.compile(r'"(dpsql_\w+|[gm]\d+)"')  # the names the rewrite gives its columns and steps
MISSING_OBJECTS = ("42P01", "42703", "42704", "3F000", "42501")


class PostgresBackend:
    def __init__(self, conninfo: str, statement_timeout_ms: int = 30_000, max_connections: int = 8,
                 connect_wait: float = CONNECT_WAIT):
        self._timeout = int(statement_timeout_ms)
        self._pool = checked_pool(conninfo, max_connections, self._configure, connect_wait)

    def _configure(self, conn: psycopg.Connection) -> None:
        # every statement is its own read-only transaction: one round trip per query, nothing can write
        conn.add_notice_handler(lambda notice: None)  # backend notices never reach anyone
        for type_name, loader in SAFE_LOADERS.items():
            conn.adapters.register_loader(type_name, loader)
        # JIT compilation costs more than it saves on these aggregates. work_mem stays the server's: a larger one
        # makes PostgreSQL hash every unit instead of reading the unit's index in order (benchmarks/results/
        # work_mem.md); a statement that must hash the units raises it for itself (`run`)
        conn.execute(f"SET default_transaction_read_only = on; SET statement_timeout = {self._timeout}; "
                     "SET jit = off")

    @contextmanager
    def session(self, cancel: Cancellation | None = None) -> Iterator[BackendSession]:
        """A working connection, in hand before anything is charged: if PostgreSQL cannot be reached this raises
        BackendUnavailable and nothing was spent. What then fails while a statement runs keeps its charge (the
        statement may have read the data) and gives DP008."""
        with pooled(self._pool) as conn:
            session = BackendSession(conn, cancel)
            try:
                yield session
            finally:
                session.release()

    def execute(self, sql: str, cancel: Cancellation | None = None) -> list[tuple[Any, ...]]:
        """Rows of one read-only query; any failure becomes a dpsql error without PostgreSQL's text."""
        with self.session(cancel) as session:
            return session.run_text(sql)

    def health(self) -> str | None:
        return pool_health(self._pool)

    def catalog(self) -> Catalog:
        """The tables of the `public` schema as the catalog declares them: columns and types, primary and unique
        keys (of one column, and of several), NOT NULL constraints and validated foreign keys. Catalog only, never
        a row. An invalid index (left by a failed CREATE UNIQUE INDEX CONCURRENTLY) or a NOT VALID key guarantees
        nothing."""
        columns: dict[str, dict[str, str]] = {}
        not_null, enums = set(), set()
        for table, column, type_name, required, enum in self.execute(CATALOG_COLUMNS):
            columns.setdefault(table, {})[column] = type_name
            if required:
                not_null.add((table, column))
            if enum:
                enums.add(type_name)
        references = {(t, c): (rt, rc) for t, c, rt, rc in self.execute(CATALOG_FOREIGN_KEYS)}
        return Catalog(columns, frozenset(map(tuple, self.execute(CATALOG_UNIQUE))),
                       frozenset((t, frozenset(names)) for t, names in self.execute(CATALOG_UNIQUE_SETS)),
                       frozenset(not_null), references, frozenset(enums))

    def check(self, statement: Statement) -> None:
        """The statement planned, not run (EXPLAIN reads the catalog, never a row), so what fails whatever the data
        is refused before any charge: a constant PostgreSQL cannot read as its type (InvalidConstant, with its
        SQLSTATE and the constant named), or a table, column or function the privacy schema declares and the
        database lacks (SchemaError). Either would fail on every database, so saying so reveals nothing."""
        sql = statement.sql
        with pooled(self._pool) as conn:  # a connection lost here is BackendUnavailable: nothing was charged
            try:
                conn.execute(f"{EXPLAIN}{sql}", prepare=False)
            except psycopg.DataError as exc:  # SQLSTATE class 22: a value PostgreSQL cannot read or compute
                constant = _constant_at(sql, exc.diag.statement_position, len(EXPLAIN))
                raise InvalidConstant(f"the constant {constant} cannot be read as the type it is used as "
                                      f"(SQLSTATE {exc.sqlstate}); nothing was run or charged",
                                      "correct the constant, e.g. a date as '2024-06-30' or a number without "
                                      "quotes", sqlstate=exc.sqlstate) from None
            except psycopg.errors.QueryCanceled:  # planning ran past the timeout: the run will say what it says
                return
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                log.error("PostgreSQL cannot plan a rewritten statement (%s): %s", exc.sqlstate, exc)
                if exc.sqlstate in MISSING_OBJECTS and OWN_NAME.search(exc.diag.message_primary or ""):
                    # a name the rewrite made (m0, g1, dpsql_rows) is missing: the rewrite's fault, not the schema's
                    raise InternalError(f"internal error in dpsql (its rewrite reads a name it did not make, SQLSTATE "
                                        f"{exc.sqlstate}); the query did not run and was not charged",
                                        "this is a dpsql bug: the log has the details; please report it") from None
                if exc.sqlstate in MISSING_OBJECTS:
                    raise SchemaError(f"the database does not match the privacy schema: PostgreSQL cannot plan "
                                      f"the query (SQLSTATE {exc.sqlstate}); nothing was run or charged",
                                      "the server log names what is missing; have the data owner correct the "
                                      "schema or the database") from None
                raise SchemaError(f"PostgreSQL cannot plan the query as dpsql rewrote it (SQLSTATE {exc.sqlstate}: "
                                  "types that do not fit together); nothing was run or charged",
                                  "the server log has PostgreSQL's message; if the privacy schema declares each "
                                  "column's type as the database holds it, this is a dpsql bug: please report the "
                                  "query") from None

    def indexed_columns(self) -> frozenset[tuple[str, str]] | None:
        """(table, column) pairs that lead a valid b-tree index: PostgreSQL can read such a column's rows in order,
        which makes grouping by it cheap."""
        sql = """
            SELECT c.relname, a.attname
            FROM pg_index i
            JOIN pg_class c ON c.oid = i.indrelid
            JOIN pg_class ic ON ic.oid = i.indexrelid
            JOIN pg_am am ON am.oid = ic.relam
            JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
            WHERE i.indisvalid AND am.amname = 'btree' AND i.indpred IS NULL AND n.nspname = 'public'
        """
        return frozenset((table, column) for table, column in self.execute(sql))

    def time_zone(self) -> str:
        """The TimeZone of the sessions that run the queries (the server's or the database's default)."""
        return str(self.execute("SHOW TimeZone")[0][0])

    def time_zone_names(self) -> frozenset[str]:
        """The zone names and abbreviations PostgreSQL lists, in lower case (it matches them regardless of case),
        whose offset from UTC is under a day (all of them: a POSIX zone, 'UTC+100', is not listed)."""
        return frozenset(str(name).lower() for (name,) in self.execute(TIME_ZONE_NAMES))

    def close(self) -> None:
        self._pool.close()


EXPLAIN = "EXPLAIN (COSTS OFF) "
TIME_ZONE_NAMES = """
    SELECT name FROM pg_timezone_names WHERE abs(extract(epoch FROM utc_offset)) < 86400
    UNION SELECT abbrev FROM pg_timezone_abbrevs WHERE abs(extract(epoch FROM utc_offset)) < 86400"""
CATALOG_COLUMNS = """
    SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull AND c.relkind IN ('r', 'p'),
           t.typtype = 'e'
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_type t ON t.oid = a.atttypid
    WHERE a.attnum > 0 AND NOT a.attisdropped AND n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
"""
CATALOG_UNIQUE = """
    SELECT c.relname, a.attname
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
    WHERE i.indisunique AND i.indisvalid AND i.indnatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL
      AND n.nspname = 'public'
"""
CATALOG_UNIQUE_SETS = """
    SELECT c.relname, array_agg(a.attname)
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey)
    WHERE i.indisunique AND i.indisvalid AND i.indnatts > 1 AND i.indnatts = i.indnkeyatts AND i.indpred IS NULL
      AND i.indexprs IS NULL AND n.nspname = 'public'
    GROUP BY i.indexrelid, c.relname
"""
CATALOG_FOREIGN_KEYS = """
    SELECT c.relname, a.attname, rc.relname, ra.attname
    FROM pg_constraint k
    JOIN pg_class c ON c.oid = k.conrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_class rc ON rc.oid = k.confrelid
    JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = k.conkey[1]
    JOIN pg_attribute ra ON ra.attrelid = k.confrelid AND ra.attnum = k.confkey[1]
    WHERE k.contype = 'f' AND k.convalidated AND cardinality(k.conkey) = 1 AND n.nspname = 'public'
"""


def _constant_at(sql: str, position: str | None, offset: int) -> str:
    """The constant starting at PostgreSQL's error position (1-based, in the statement it was given), as written:
    a quoted string to its closing quote, or a bare token."""
    if not position or not 0 < int(position) - offset <= len(sql):
        return "of the query"
    rest = sql[int(position) - offset - 1:]
    if rest.startswith("'"):
        end = 1
        while end < len(rest) and not (rest[end] == "'" and rest[end + 1:end + 2] != "'"):
            end += 2 if rest[end:end + 2] == "''" else 1
        return rest[:end + 1]
    return rest.split()[0].rstrip(",)") if rest.split() else "of the query"


class BackendSession:
    """One connection of the backend's pool, held for one answer: its statements, and a lock that makes identical
    queries wait for each other (see `hold`)."""

    def __init__(self, conn: psycopg.Connection, cancel: Cancellation | None):
        self._conn, self._cancel, self._locked = conn, cancel, False

    @property
    def broken(self) -> bool:
        """Whether the connection died (PostgreSQL restarted, the backend was terminated)."""
        return self._conn.broken

    def run(self, statement: Statement, work_mem: str | None = None) -> list[tuple[Any, ...]]:
        """Rows of one read-only statement, rendered in PostgreSQL's SQL, with `work_mem` for it alone when given;
        any failure becomes a dpsql error without PostgreSQL's text."""
        return self.run_text(statement.sql, work_mem)

    def run_text(self, sql: str, work_mem: str | None = None) -> list[tuple[Any, ...]]:
        """`run` for SQL that dpsql wrote for PostgreSQL alone (the catalog's queries)."""
        try:
            if work_mem is None:
                return self._rows(sql)
            with self._conn.transaction():
                self._conn.execute(f"SET LOCAL work_mem = '{int(work_mem.removesuffix('MB'))}MB'")
                return self._rows(sql)
        except psycopg.Error as exc:
            raise self._failure(exc) from None

    def hold(self, name: str) -> None:
        """Wait until no other session (of this process or another on the same database) holds `name`, then hold it
        until this session ends: a session-level advisory lock, so two identical queries of one analyst run one
        after the other and the second finds the first's answer in the cache. Nothing is charged yet, so a
        connection lost here is BackendUnavailable."""
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        try:
            self._rows(f"SELECT pg_advisory_lock({key})")
        except psycopg.Error as exc:
            if self._conn.broken:
                log.warning("lost a connection to PostgreSQL: %s", exc)
                raise BackendUnavailable(UNAVAILABLE, UNAVAILABLE_HINT) from None
            raise self._failure(exc) from None
        self._locked = True

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        cancel = self._cancel
        with self._conn.cursor() as cur:
            if cancel is not None:
                cancel.attach(self._conn)
            try:
                cur.execute(sql, prepare=False)
                return cur.fetchall()
            finally:
                if cancel is not None:
                    cancel.attach(None)

    def _failure(self, exc: psycopg.Error) -> Exception:
        if isinstance(exc, psycopg.errors.QueryCanceled) and self._cancel is not None and self._cancel.cancelled:
            return QueryCancelled("canceling statement due to user request")
        log.warning("backend query failed: %s: %s", type(exc).__name__, exc)
        return BackendError(FAILED, FAILED_HINT)

    def release(self) -> None:
        if self._locked and not self._conn.broken:
            try:
                self._conn.execute("SELECT pg_advisory_unlock_all()")
            except psycopg.Error:
                log.warning("could not release an advisory lock; the connection is closed instead")
                self._conn.close()
        self._locked = False
