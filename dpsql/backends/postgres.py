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

import logging
import threading
from typing import Any

import psycopg
from psycopg.adapt import Loader
from psycopg.types.datetime import DateLoader, TimestampLoader, TimestamptzLoader
from psycopg_pool import ConnectionPool

from dpsql.errors import BackendError, ConfigError, QueryCancelled

log = logging.getLogger("dpsql.backend")
WORK_MEM = "128MB"
FAILED = ("PostgreSQL did not finish the query: it failed or ran past the statement timeout (which of the two, and "
          "why, is withheld: either can depend on the data)")
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


class PostgresBackend:
    def __init__(self, conninfo: str, statement_timeout_ms: int = 30_000, max_connections: int = 8):
        self._timeout = int(statement_timeout_ms)
        try:
            with psycopg.connect(conninfo, connect_timeout=10):
                pass
        except psycopg.Error as exc:
            raise ConfigError(f"cannot connect to the database: {type(exc).__name__}",
                              "check --database / DPSQL_DATABASE (a postgresql:// URL) and that the server runs"
                              ) from None
        self._pool = ConnectionPool(conninfo, min_size=1, max_size=max_connections, open=True,
                                    configure=self._configure, kwargs={"autocommit": True})

    def _configure(self, conn: psycopg.Connection) -> None:
        # every statement is its own read-only transaction: one round trip per query, nothing can write
        conn.add_notice_handler(lambda notice: None)  # backend notices never reach anyone
        for type_name, loader in SAFE_LOADERS.items():
            conn.adapters.register_loader(type_name, loader)
        # JIT compilation costs more than it saves on these aggregates; per-unit aggregation keeps one hash
        # entry per unit, which spills to disk under the default 4MB work_mem from about 100k units
        conn.execute(f"SET default_transaction_read_only = on; SET statement_timeout = {self._timeout}; "
                     f"SET jit = off; SET work_mem = '{WORK_MEM}'")

    def execute(self, sql: str, cancel: Cancellation | None = None) -> list[tuple[Any, ...]]:
        """Rows of one read-only query; any failure becomes a dpsql error without PostgreSQL's text."""
        try:
            with self._pool.connection() as conn, conn.cursor() as cur:
                if cancel is not None:
                    cancel.attach(conn)
                try:
                    cur.execute(sql, prepare=False)
                    return cur.fetchall()
                finally:
                    if cancel is not None:
                        cancel.attach(None)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.errors.QueryCanceled) and cancel is not None and cancel.cancelled:
                raise QueryCancelled("canceling statement due to user request") from None
            log.warning("backend query failed: %s: %s", type(exc).__name__, exc)
            raise BackendError(FAILED, FAILED_HINT) from None

    def unique_columns(self) -> frozenset[tuple[str, str]]:
        """(table, column) pairs that a single-column primary key or unique index guarantees (catalog only). An
        invalid index (left by a failed CREATE UNIQUE INDEX CONCURRENTLY) guarantees nothing."""
        sql = """
            SELECT c.relname, a.attname
            FROM pg_index i
            JOIN pg_class c ON c.oid = i.indrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
            WHERE i.indisunique AND i.indisvalid AND i.indnatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL
              AND n.nspname = 'public'
        """
        return frozenset((table, column) for table, column in self.execute(sql))

    def close(self) -> None:
        self._pool.close()
