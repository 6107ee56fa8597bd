"""Where the rewritten statements run: PostgreSQL (psycopg 3), Spark or DuckDB, behind one protocol.

The engine sees only `Backend` and `Session`. A statement reaches a backend as a tree (`dpsql.sql.dialect.Statement`)
that the backend renders in its own SQL, spelling the rewrite's dialect nodes its own way; no backend parses SQL
text. A new backend is one module here (its session, its rendering and its catalog) and one line in `open_backend`.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any, Protocol

from dpsql.backends.postgres import Cancellation, PostgresBackend
from dpsql.errors import ConfigError
from dpsql.schema import PrivacySchema
from dpsql.schema.catalog import Catalog
from dpsql.sql.dialect import Statement


class Session(Protocol):
    """One answer's statements on one connection (or the engine's share of a cluster)."""

    @property
    def broken(self) -> bool:
        """Whether the connection died, so that what failed was the backend, not the statement."""

    def run(self, statement: Statement, work_mem: str | None = None) -> list[tuple[Any, ...]]:
        """The rows of one read-only statement, values as psycopg gives PostgreSQL's; a failure is a dpsql error
        (BackendError, QueryCancelled), never the engine's own text."""

    def hold(self, name: str) -> None:
        """Wait until no other session holds `name`, then hold it until the session ends (identical queries run
        one after the other, so the second finds the first's answer)."""


class Backend(Protocol):
    def session(self, cancel: Cancellation | None = None) -> AbstractContextManager[Session]:
        """A working session, in hand before anything is charged (BackendUnavailable if there is none)."""

    def check(self, statement: Statement) -> None:
        """Refuse, before any charge, a statement the engine cannot run whatever the data (planned or analysed,
        never run)."""

    def catalog(self) -> Catalog | None:
        """Tables, types and the keys the engine verifies; None where it verifies none (every bound is then
        enforced by the rewrite)."""

    def time_zone(self) -> str | None:
        """The session time zone in which dates are truncated, or None where it is not known."""

    def time_zone_names(self) -> frozenset[str] | None:
        """The zones AT TIME ZONE may name, in lower case (names and abbreviations, each within a day of UTC), or
        None where the backend lists none."""

    def indexed_columns(self) -> frozenset[tuple[str, str]] | None:
        """(table, column) pairs that lead an index, which lets the engine read a table's units in order."""

    def health(self) -> str | None:
        """None when a trivial statement runs now; otherwise why not, in words an operator can act on (never a
        query's text or values). The server's /health answers from it."""

    def close(self) -> None: ...


class NamedLocks:
    """Locks by name within this process, for engines without PostgreSQL's advisory locks: identical queries wait
    for each other. A name's lock lives only while a session holds or waits for it, so names do not accumulate."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, list[int]]] = {}  # name -> (lock, [sessions holding or waiting])

    def acquire(self, name: str) -> None:
        with self._guard:
            lock, users = self._locks.setdefault(name, (threading.Lock(), [0]))
            users[0] += 1
        lock.acquire()

    def release(self, name: str) -> None:
        with self._guard:
            lock, users = self._locks[name]
            lock.release()
            users[0] -= 1
            if not users[0]:
                del self._locks[name]


def is_spark_url(url: str | None) -> bool:
    return bool(url) and (url.startswith("spark://") or url.startswith("sc://"))


def open_backend(database: str, schema: PrivacySchema, statement_timeout_ms: int, connect_wait: float,
                 ledger: str | None) -> Backend:
    """PostgreSQL; Spark for a spark:// or sc:// URL and DuckDB for duckdb://, whose ledger must live in
    PostgreSQL. Spark and DuckDB are extras, imported only when asked for."""
    if not (is_spark_url(database) or database.startswith("duckdb://")):
        return PostgresBackend(database, statement_timeout_ms, connect_wait=connect_wait)
    duck = database.startswith("duckdb://")
    if not ledger:
        raise ConfigError(f"the {'DuckDB' if duck else 'Spark'} backend keeps its ledger in PostgreSQL: none given",
                          "pass --ledger postgresql://... or set DPSQL_LEDGER (dpsql demo --keep starts one)")
    if duck:
        from dpsql.backends.duckdb import DuckDBBackend

        return DuckDBBackend(database, schema, statement_timeout_ms)
    from dpsql.backends.spark import SparkBackend

    return SparkBackend(database, schema, statement_timeout_ms)


__all__ = ["Backend", "Cancellation", "NamedLocks", "PostgresBackend", "Session", "is_spark_url", "open_backend"]
