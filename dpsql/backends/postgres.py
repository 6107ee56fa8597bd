"""PostgreSQL through psycopg 3: pooled, read-only, with a statement timeout set by dpsql.

PostgreSQL's error text never leaves this module: it is logged for the operator and replaced by a fixed
dpsql error, because a message such as "division by zero" or "value out of range" can depend on the data.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from dpsql.errors import BackendError, ConfigError, QueryCancelled, QueryTimeout

log = logging.getLogger("dpsql.backend")
WORK_MEM = "128MB"


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
        except psycopg.errors.QueryCanceled:
            if cancel is not None and cancel.cancelled:
                raise QueryCancelled("canceling statement due to user request") from None
            raise QueryTimeout(f"the query took longer than the {self._timeout} ms limit and was stopped",
                               "simplify the query or ask the operator for a longer statement_timeout") from None
        except psycopg.Error as exc:
            log.warning("backend query failed: %s: %s", type(exc).__name__, exc)
            raise BackendError("PostgreSQL could not run the query (details withheld: they may depend on data)",
                               "check that the privacy schema matches the database's tables and types") from None

    def unique_columns(self) -> frozenset[tuple[str, str]]:
        """(table, column) pairs that a single-column primary key or unique index guarantees (catalog only)."""
        sql = """
            SELECT c.relname, a.attname
            FROM pg_index i
            JOIN pg_class c ON c.oid = i.indrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
            WHERE i.indisunique AND i.indnatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL
              AND n.nspname = 'public'
        """
        return frozenset((table, column) for table, column in self.execute(sql))

    def close(self) -> None:
        self._pool.close()
