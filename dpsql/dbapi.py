"""A PEP 249 (DB-API 2.0) module on top of the engine.

    conn = dpsql.connect(database="postgresql://...", schema="schemas/demo.toml", analyst="alice")
    cur = conn.cursor()
    cur.execute("SELECT sex, AVG(income) FROM people WHERE age > %s GROUP BY sex", (30,))
    cur.fetchall(); cur.accuracy  # noise scale and 95% interval of every value

The engine runs in this process with the backend's credentials: this door is for trusted services and
notebooks that must only publish DP results. Untrusted analysts connect through `dpsql serve` instead.
Parameters (paramstyle "pyformat": %s or %(name)s; $1 also works) are bound into the parsed query before
analysis and are part of the cache key.

Session options work as in the server: `cur.execute("SET dpsql.mechanism = 'gaussian'")`, `SHOW dpsql.budget`,
`RESET dpsql.epsilon` (see `dpsql.session`); `execute(..., epsilon=, mechanism=, histogram=)` sets them for one
query.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dpsql.accounting import describe_budget
from dpsql.answer import Answer
from dpsql.config import load_settings
from dpsql.engine import Engine
from dpsql.errors import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
)
from dpsql.explain import explain_statement
from dpsql.postprocess import Accuracy
from dpsql.session import OPTION_NAMES, Options, SessionCommand, parse_session_command, show_value

__all__ = [
    "BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Connection", "Cursor", "DataError",
    "DatabaseError", "Date", "DateFromTicks", "Error", "IntegrityError", "InterfaceError", "InternalError",
    "NotSupportedError", "OperationalError", "ProgrammingError", "Time", "TimeFromTicks", "Timestamp",
    "TimestampFromTicks", "Warning", "apilevel", "connect", "paramstyle", "read_sql", "threadsafety",
]

apilevel = "2.0"
threadsafety = 1  # threads may share the module, not connections
paramstyle = "pyformat"

TYPE_OIDS = {"bool": 16, "int8": 20, "text": 25, "float8": 701, "date": 1082, "timestamp": 1114,
             "timestamptz": 1184, "numeric": 1700}


class _TypeSet(frozenset):
    def __eq__(self, other: object) -> bool:
        return other in self if isinstance(other, int) else super().__eq__(other)

    def __hash__(self) -> int:
        return super().__hash__()


STRING = _TypeSet({25})
BINARY = _TypeSet({17})
NUMBER = _TypeSet({20, 701, 1700})
DATETIME = _TypeSet({1082, 1114, 1184})
ROWID = _TypeSet({26})

Date, Time, Timestamp = datetime.date, datetime.time, datetime.datetime


def DateFromTicks(ticks: float) -> datetime.date:  # noqa: N802 - PEP 249 name
    return datetime.date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> datetime.time:  # noqa: N802
    return datetime.time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> datetime.datetime:  # noqa: N802
    return datetime.datetime(*time.localtime(ticks)[:6])


def Binary(value: bytes) -> bytes:  # noqa: N802
    return bytes(value)


def connect(database: str | None = None, schema: str | None = None, analyst: str | None = None, *,
            epsilon: float | None = None, config: str | None = None, **settings: Any) -> Connection:
    """Open a dpsql connection. Missing arguments come from DPSQL_* variables or the config file."""
    loaded = load_settings(config, database=database, schema=schema, analyst=analyst, epsilon=epsilon, **settings)
    if not loaded.analyst:
        raise InterfaceError("no analyst given", "pass analyst=NAME or set DPSQL_ANALYST")
    engine = Engine(loaded)
    engine.budget(loaded.analyst)  # fail now, not at the first query, if the analyst is unknown
    return Connection(engine, loaded.analyst)


class Connection:
    def __init__(self, engine: Engine, analyst: str):
        self._engine: Engine | None = engine
        self.analyst = analyst
        self.options = Options()  # the session's options (SET dpsql.*); unset ones come from the settings

    @property
    def epsilon(self) -> float:
        """The session's ε per query; a cursor's execute(epsilon=...) overrides it."""
        return self.engine.options(self.options).epsilon

    @epsilon.setter
    def epsilon(self, value: float) -> None:
        self.options = self.options.with_option("epsilon", value)

    Error, Warning, InterfaceError, DatabaseError = Error, Warning, InterfaceError, DatabaseError
    DataError, OperationalError, IntegrityError, InternalError = DataError, OperationalError, IntegrityError, \
        InternalError
    ProgrammingError, NotSupportedError = ProgrammingError, NotSupportedError

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise InterfaceError("the connection is closed")
        return self._engine

    def cursor(self) -> Cursor:
        return Cursor(self)

    def commit(self) -> None:
        """Nothing to commit: dpsql only reads, and budget charges are committed when they happen."""
        self.engine  # noqa: B018 - raises if closed

    def rollback(self) -> None:
        """Nothing to roll back; a charge is never undone."""
        self.engine  # noqa: B018

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    def budget(self):
        """This analyst's budget: total, spent and left."""
        return self.engine.budget(self.analyst)

    def density(self, table: str, column: str, epsilon: float, delta: float, **options: Any) -> dict:
        """A DP kernel density estimate of `table.column` (see dpsql.releases.density), charged once."""
        from dpsql.releases import density
        return density(self.engine, self.analyst, table, column, epsilon, delta, **options)

    def decision_tree(self, table: str, label: str, features: list[str], epsilon: float, **options: Any) -> dict:
        """A DP decision tree predicting `label` (see dpsql.releases.tree), charged once; predict with
        dpsql.releases.tree.predict."""
        from dpsql.releases import decision_tree
        return decision_tree(self.engine, self.analyst, table, label, features, epsilon, **options)

    def synthesize(self, table: str, columns: list[str], epsilon: float, **options: Any) -> dict:
        """A DP synthetic version of `table` over `columns` (see dpsql.releases.synth), charged once."""
        from dpsql.releases.synth import synthesize
        return synthesize(self.engine, self.analyst, table, columns, epsilon, **options)

    def explain(self, sql: str, params: Any = None, epsilon: float | None = None, **options: Any) -> str:
        """What the query would cost and why (`dpsql explain`); runs and spends nothing."""
        return explain_statement(*self.engine.prepare_parts(sql, params, epsilon,
                                                            _query_options(self.options, options)))

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Cursor:
    def __init__(self, connection: Connection):
        self.connection = connection
        self.arraysize = 1
        self._answer: Answer | None = None  # as presented: with interval columns when dpsql.intervals is on
        self._measured: Answer | None = None  # with every accuracy measure as columns, for fetch_df
        self._position = 0
        self._closed = False

    @property
    def description(self) -> list[tuple] | None:
        if self._answer is None or not self._answer.names:
            return None  # no query yet, or a statement without rows (SET, RESET)
        return [(name, TYPE_OIDS.get(type_name, 25), None, None, None, None, True)
                for name, type_name in zip(self._answer.names, self._answer.types, strict=True)]

    @property
    def rowcount(self) -> int:
        return -1 if self._answer is None or not self._answer.names else len(self._answer.rows)

    @property
    def accuracy(self) -> list[tuple[Accuracy | None, ...]]:
        """Per row and column: the noise scale and 95% confidence interval (None for exact values). The interval
        covers the noise only: values clamped to their declared bounds, and rows or groups a unit has beyond
        them, move the answer outside it."""
        return [] if self._answer is None else self._answer.accuracy

    @property
    def bounds_effect(self) -> dict | None:
        """With `dpsql.bounds_epsilon` set: how many of the last query's units its declared bounds touch (rows left
        out, values clamped), as noisy counts with 95% intervals and shares of the units read; else None."""
        return None if self._answer is None else self._answer.bounds_effect

    @property
    def notes(self) -> list[str]:
        """What the analyst should know beside the last answer's rows (why groups may be missing, and how to ask
        for every group), as psql shows dpsql's NOTICEs."""
        return [] if self._answer is None else list(self._answer.notes)

    @property
    def epsilon_spent(self) -> float:
        """ε charged for the last query (0 if its answer came from the cache)."""
        return 0.0 if self._answer is None else self._answer.epsilon

    @property
    def cached(self) -> bool:
        return bool(self._answer and self._answer.cached)

    def execute(self, operation: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None, *,
                epsilon: float | None = None, **options: Any) -> Cursor:
        """Run a query (or a SET/SHOW/RESET dpsql.* statement); keyword options apply to this query only."""
        self._check_open()
        connection = self.connection
        command = parse_session_command(operation)
        if command is not None:
            self._answer = self._measured = _session_answer(connection, command)
        else:
            query_options = _query_options(connection.options, options)
            self._answer = connection.engine.query(operation, parameters, analyst=connection.analyst,
                                                   epsilon=epsilon, options=query_options)
            self._measured = self._answer.with_intervals(every_measure=True)
            if connection.engine.options(query_options).intervals:
                self._answer = self._answer.with_intervals()
        self._position = 0
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence[Any]) -> Cursor:
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
        return self

    def fetchone(self) -> tuple | None:
        rows = self.fetchmany(1)
        return rows[0] if rows else None

    def fetchmany(self, size: int | None = None) -> list[tuple]:
        rows = self._rows()
        size = self.arraysize if size is None else size
        chunk = rows[self._position:self._position + size]
        self._position += len(chunk)
        return chunk

    def fetchall(self) -> list[tuple]:
        rows = self._rows()
        chunk = rows[self._position:]
        self._position = len(rows)
        return chunk

    def fetch_df(self):
        """The remaining rows as a pandas DataFrame: each noisy column followed by `<column>_ci_low` and
        `<column>_ci_high` (and `_rank_error` or `_count_gap` where the value reports one instead), with what the
        answer cost in `df.attrs` (`epsilon_spent`, `delta_spent`, `cached`, `budget_left`)."""
        try:
            import pandas
        except ImportError:
            raise InterfaceError("fetch_df needs pandas", "pip install pandas") from None
        rows = self._rows()[self._position:]
        self._position += len(rows)
        measured = self._measured
        start = len(measured.rows) - len(rows)
        frame = pandas.DataFrame.from_records(measured.rows[start:], columns=measured.names)
        frame.attrs.update(measured.cost())
        return frame

    def _rows(self) -> list[tuple]:
        self._check_open()
        if self._answer is None:
            raise ProgrammingError("no query has been executed")
        if not self._answer.names:
            raise ProgrammingError("the last statement returned no rows")
        return self._answer.rows

    def setinputsizes(self, sizes: Any) -> None:
        pass

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        pass

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        self.connection.engine  # noqa: B018

    def __iter__(self):
        return iter(self.fetchone, None)

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_sql(sql: str, connection: Connection, params: Sequence[Any] | Mapping[str, Any] | None = None, *,
             epsilon: float | None = None, **options: Any):
    """`pandas.read_sql` for dpsql: the noisy answer as a DataFrame with its intervals (see `Cursor.fetch_df`)."""
    with connection.cursor() as cursor:
        return cursor.execute(sql, params, epsilon=epsilon, **options).fetch_df()


def _query_options(session: Options, options: Mapping[str, Any]) -> Options:
    unknown = set(options) - set(OPTION_NAMES)
    if unknown:
        raise InterfaceError(f"unknown query option(s): {', '.join(sorted(unknown))}",
                             f"options: {', '.join(OPTION_NAMES)}")
    query = Options()
    for name, value in options.items():
        query = query.with_option(name, value)
    return query.over(session)


def _session_answer(connection: Connection, command: SessionCommand) -> Answer:
    """Apply a SET/RESET, or answer a SHOW, as PostgreSQL would: SHOW gives one text column and row."""
    if command.action != "show":
        connection.options = connection.options.with_option(command.name, command.value)
        return Answer([], [], [], [], 0.0, 0.0)
    if command.name == "budget":
        engine = connection.engine
        value = describe_budget(connection.budget(), engine.options(connection.options).epsilon,
                                engine.schema.group_size)
    else:
        value = show_value(getattr(connection.engine.options(connection.options), command.name))
    return Answer([f"dpsql.{command.name}"], ["text"], [(value,)], [(None,)], 0.0, 0.0)
