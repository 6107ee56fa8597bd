"""DuckDB as the backend: an embedded analytical engine for a user with files and no server. `database =
"duckdb:///path/to/file.duckdb"` reads that file's tables (attached read-only); the tables the privacy schema gives
a `path` (Parquet, or CSV by its extension) are loaded into an in-memory database beside it when the backend
starts (`duckdb:///:memory:`: those alone). The ledger, the answer cache and the shadow catalog stay in PostgreSQL
(an embedded one when there is no server).

Each statement is the rewrite's tree rendered in DuckDB's SQL: the dialect nodes spelled here, the rest transpiled
by sqlglot with PostgreSQL's meaning kept where DuckDB's differs (`transpile`, and these rules):

- The attached file's keys (PRIMARY KEY, UNIQUE, FOREIGN KEY, NOT NULL) are trusted as PostgreSQL's are: DuckDB
  enforces them on every write, has no way to drop one, and no process can write the file while this one has it
  attached. Tables loaded from Parquet or CSV have none, so every bound on them is enforced by the rewrite. The
  schema is checked against the catalog at start (tables, columns, types), and its links too where the file
  declares keys at all (a file of plain tables has none to check them against).
- The keyed hash is DuckDB's `hash(seed, fields...)`, a deterministic 64-bit hash of the tuple.
- A row's identity is DuckDB's `rowid` (every table is a base table: the file's, or one loaded from a file). A
  truncation keeps PostgreSQL's form, NOT IN over row ids, ranking each key's rows by the keyed hash of the row's
  text, its text, then its row id.
- Integer division truncates toward zero (the query is typed, as for Spark); `round` of a double rounds halves to
  even (`round_even`); `width_bucket(x, lo, hi, n)`, which DuckDB lacks, is PostgreSQL's formula in a CASE;
  `date_trunc` of a date truncates the timestamptz PostgreSQL casts it to, and returns one.
- A fractional literal beside a double is read from its text (DuckDB's decimal-to-double cast is not always the
  nearest double; PostgreSQL's is), so a clamp's bound is exactly the declared one.
- Instants (TIMESTAMP WITH TIME ZONE) are fetched as microseconds since 1970 and handed back as aware datetimes
  (DuckDB's own conversion needs pytz); the session's time zone is UTC.
- Statement timeout and cancel interrupt the statement's connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

from dpsql.backends import NamedLocks
from dpsql.backends.transpile import (
    FAILED,
    FAILED_HINT,
    SHARED_SPELLINGS,
    bands,
    bytewise,
    plain_numbers,
    plain_value,
    portable_time_formats,
    row_samples,
    shifts_wall_clock,
    wide_decimals,
)
from dpsql.errors import BackendError, ConfigError, QueryCancelled, UnsupportedQuery
from dpsql.schema import PrivacySchema
from dpsql.schema.catalog import Catalog
from dpsql.sql import dialect
from dpsql.sql.dialect import Statement

log = logging.getLogger("dpsql.duckdb")
PREFIX = "duckdb://"
INSTANT = "TIMESTAMP WITH TIME ZONE"
# DuckDB's types that PostgreSQL names otherwise (the rest, lower-cased, are PostgreSQL's names or their aliases)
TYPE_NAMES = {"tinyint": "smallint", "utinyint": "smallint", "usmallint": "integer", "uinteger": "bigint",
              "ubigint": "numeric", "hugeint": "numeric", "uhugeint": "numeric", "float": "real"}
OURS = "schema_name = 'main' AND database_name IN ('memory', 'dpsql_data')"  # the loaded files, then the file's
CATALOG_COLUMNS = ("SELECT database_name, table_name, column_name, data_type, NOT is_nullable FROM duckdb_columns() "
                   f"WHERE {OURS} ORDER BY database_name <> 'memory'")
CATALOG_KEYS = ("SELECT database_name, table_name, constraint_type, constraint_column_names, referenced_table, "
                f"referenced_column_names FROM duckdb_constraints() WHERE {OURS} AND constraint_type IN "
                "('PRIMARY KEY', 'UNIQUE', 'FOREIGN KEY')")


def to_duckdb(tree: exp.Expression, schema: dict[str, dict[str, str]]) -> str:
    """A rewritten statement in DuckDB's SQL, with the rules of this module's docstring."""
    tree = dialect.spell(tree.copy(), SPELLINGS)
    tree = tree.transform(row_samples).transform(portable_time_formats).transform(wide_decimals).transform(bytewise) \
        .transform(plain_numbers).transform(bands).transform(_width_buckets)
    schema = {table: {**columns, "rowid": "bigint"} for table, columns in schema.items()}  # every table has one
    tree = qualify(tree, schema=schema, dialect="postgres", validate_qualify_columns=False)
    tree = annotate_types(tree, schema=schema, dialect="postgres")
    return tree.transform(_half_even).transform(_instant_truncs).transform(_exact_doubles).sql(dialect="duckdb")


def _truncated(node: exp.Anonymous) -> exp.Expression:
    """`dialect.truncated` in DuckDB: the rows ranked past a key's limit, by the keyed hash of the row's text, its
    text, then its row id (one total order for every key), dropped by row id."""
    table, seed, limits = dialect.truncation_parts(node)
    name = exp.to_identifier(table)
    row = exp.cast(exp.column("dpsql_r"), "text")
    order = [exp.Anonymous(this="hash", expressions=[exp.Literal.number(seed), row]), row.copy(),
             exp.column("rowid", table="dpsql_r")]
    excess = []
    for column, limit in limits:
        key = exp.column(column, table="dpsql_r")
        over = exp.select(exp.column(column)).from_(exp.Table(this=name.copy())).group_by(exp.column(column)) \
            .having(exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(limit)))
        rank = exp.Window(this=exp.RowNumber(), partition_by=[key.copy()],
                          order=exp.Order(expressions=[exp.Ordered(this=o.copy()) for o in order]))
        ranked = exp.select(exp.column("rowid", table="dpsql_r"), exp.alias_(rank, "dpsql_rank")) \
            .from_(exp.Table(this=name.copy(), alias=exp.TableAlias(this=exp.to_identifier("dpsql_r")))) \
            .where(exp.In(this=key.copy(), query=exp.Subquery(this=over)))
        excess.append(exp.select("rowid").from_(exp.Subquery(this=ranked, alias=exp.TableAlias(
            this=exp.to_identifier("dpsql_x")))).where(exp.GT(this=exp.column("dpsql_rank"),
                                                                  expression=exp.Literal.number(limit))))
    dropped = excess[0]
    for branch in excess[1:]:
        dropped = exp.union(dropped, branch, distinct=False)
    kept = exp.Not(this=exp.In(this=exp.column("rowid", table="dpsql_t"), query=exp.Subquery(this=dropped)))
    select = exp.select("*").from_(exp.Table(this=name, alias=exp.TableAlias(this=exp.to_identifier("dpsql_t"))))
    return exp.Subquery(this=select.where(kept), alias=node.parent.args["alias"])  # the table read, under its alias


SPELLINGS: dict[str, dialect.Spelling] = {
    **SHARED_SPELLINGS,
    dialect.KEYED_HASH: lambda node: exp.Anonymous(this="hash", expressions=list(node.expressions)),
    dialect.ROW_ID: lambda node: exp.cast(exp.column("rowid", table=node.expressions[0].name), "text"),
    dialect.TRUNCATED: _truncated,
}


def _width_buckets(node: exp.Expression) -> exp.Expression:
    """PostgreSQL's width_bucket(x, lo, hi, n) for lo < hi: 0 below lo, n + 1 from hi, else
    min(trunc(n · (x - lo) / (hi - lo)), n - 1) + 1 computed in doubles, as PostgreSQL does; NULL for NULL."""
    if not isinstance(node, exp.WidthBucket) or node.args.get("threshold") is not None:
        return node
    value, low, high, count = (node.args[k] for k in ("this", "min_value", "max_value", "num_buckets"))
    x = exp.cast(value.copy(), "double")
    share = exp.Div(this=exp.paren(exp.Sub(this=x, expression=low.copy())),
                    expression=exp.paren(exp.Sub(this=high.copy(), expression=low.copy())))
    inside = exp.Cast(this=exp.Anonymous(this="trunc", expressions=[exp.Mul(this=count.copy(), expression=share)]),
                      to=exp.DataType.build("BIGINT"))
    bucket = exp.Add(this=exp.Least(this=inside, expressions=[exp.Sub(this=count.copy(),
                                                                      expression=exp.Literal.number(1))]),
                     expression=exp.Literal.number(1))
    return exp.Case(ifs=[exp.If(this=exp.LT(this=value.copy(), expression=low.copy()), true=exp.Literal.number(0)),
                         exp.If(this=exp.GTE(this=value.copy(), expression=high.copy()),
                                true=exp.Add(this=count.copy(), expression=exp.Literal.number(1)))],
                    default=bucket)


def _half_even(node: exp.Expression) -> exp.Expression:
    # PostgreSQL's round(double precision) rounds halves to even, DuckDB's round away from zero
    if isinstance(node, exp.Round) and node.args.get("decimals") is None and node.this.type is not None \
            and node.this.type.this in (exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT):
        return exp.Anonymous(this="round_even", expressions=[node.this.copy(), exp.Literal.number(0)])
    return node


def _instant_truncs(node: exp.Expression) -> exp.Expression:
    # PostgreSQL truncates a date as the timestamptz it casts it to (in the session's zone, UTC here) and returns
    # one; DuckDB would return a date
    if isinstance(node, exp.TimestampTrunc | exp.DateTrunc) and node.this.type is not None \
            and node.this.type.this == exp.DataType.Type.DATE \
            and not any(map(shifts_wall_clock, node.this.walk())):  # a shifted date is DuckDB's timestamp too
        node = node.copy()
        node.set("this", exp.cast(node.this, exp.DataType.build("TIMESTAMPTZ")))
    return node


DOUBLES = (exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT)


def _exact_doubles(node: exp.Expression) -> exp.Expression:
    # DuckDB reads 31.622776601683793 as a DECIMAL and casts it to a double by division, which is not always the
    # nearest double (0.09999999999999999 becomes 0.1); PostgreSQL's numeric-to-float8 cast is. Beside a double,
    # a fractional literal is read from its text, which DuckDB rounds correctly: a clamp's bound is the declared one
    if isinstance(node, exp.Literal) and not node.is_string and not node.this.lstrip("-").isdigit() \
            and node.parent is not None and any(
                isinstance(sibling, exp.Expression) and sibling is not node and sibling.type is not None
                and sibling.type.this in DOUBLES for sibling in node.parent.iter_expressions()):
        return exp.Cast(this=exp.Literal.string(node.this), to=exp.DataType.build("DOUBLE"))
    return node


class DuckDBBackend:
    """Runs rewritten statements on one DuckDB database; each session is its own connection (a cursor)."""

    def __init__(self, url: str, schema: PrivacySchema, statement_timeout_ms: int = 30_000):
        try:
            import duckdb
        except ImportError as exc:
            raise ConfigError("the DuckDB backend needs duckdb", "pip install 'dpsql[duckdb]'") from exc
        path = url[len(PREFIX):].removeprefix("/") or ":memory:"
        # an in-memory database, the file attached read-only beside it: the files' tables are loaded into the
        # former, which every session's connection shares (a TEMP table would be its one connection's)
        self._setup = ["SET TimeZone = 'UTC'", "SET search_path = 'memory.main" +
                       (",dpsql_data.main'" if path != ":memory:" else "'")]
        try:
            self._conn = duckdb.connect(":memory:")
            if path != ":memory:":
                self._conn.execute(f"ATTACH {exp.Literal.string(path).sql('duckdb')} AS dpsql_data (READ_ONLY)")
            for table in schema.tables.values():
                if table.path:
                    reader = "read_csv_auto" if table.path.lower().endswith(".csv") else "read_parquet"
                    self._conn.execute(f"CREATE TABLE memory.main.{exp.to_identifier(table.name).sql('duckdb')} AS "
                                       f"SELECT * FROM {reader}(?)", [table.path])
        except duckdb.Error as exc:
            raise ConfigError(f"cannot open the DuckDB database {path}: {exc}",
                              "check the path in the URL (duckdb:///path/to/file.duckdb) and the tables' paths") \
                from None
        self._timeout_s = statement_timeout_ms / 1000
        self._types = schema.sqlglot_schema()
        self.locks = NamedLocks()
        self._cursor_lock = threading.Lock()

    def render(self, statement: Statement) -> str:
        return statement.render("duckdb", lambda tree: to_duckdb(tree, self._types))

    def _connection(self) -> Any:
        """A connection of its own (DuckDB's cursor) to the shared database, with the session's settings. The
        shared connection is not thread-safe, so its cursors are made one at a time."""
        with self._cursor_lock:
            cursor = self._conn.cursor()
        for setting in self._setup:
            cursor.execute(setting)
        return cursor

    @contextmanager
    def session(self, cancel: Any = None) -> Iterator[DuckDBSession]:
        session = DuckDBSession(self, self._connection(), cancel)
        try:
            yield session
        finally:
            session.release()

    def check(self, statement: Statement) -> None:
        """Refuses, before any charge, a statement DuckDB cannot bind (a function or type it lacks): EXPLAIN binds
        and plans it against the tables' types, never their rows."""
        try:
            self._read(f"EXPLAIN {self.render(statement)}")
        except UnsupportedQuery:
            raise
        except Exception as exc:  # noqa: BLE001 - DuckDB's SQL, not the data's
            log.warning("DuckDB cannot plan a rewritten statement: %s", exc)
            raise UnsupportedQuery(f"DuckDB cannot run this query's rewritten SQL ({type(exc).__name__})",
                                   "rephrase it, or ask it on the PostgreSQL backend") from None

    def _read(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of a catalog query or a probe, on a connection of its own."""
        cursor = self._connection()
        try:
            return cursor.execute(sql).fetchall()
        finally:
            cursor.close()

    def catalog(self) -> Catalog:
        """Tables, types and keys as the catalog declares them, a loaded file's table hiding the attached file's
        of the same name (as the search path does)."""
        columns: dict[str, dict[str, str]] = {}
        home: dict[str, str] = {}  # table -> the database it is read from
        not_null, enums = set(), set()
        for database, table, column, type_name, required in self._read(CATALOG_COLUMNS):
            if home.setdefault(table, database) != database:
                continue
            spelled = type_name.lower()
            if spelled.startswith("enum("):
                enums.add("enum")  # its values are text to the schema (`Catalog.base_type` drops the list)
            columns.setdefault(table, {})[column] = TYPE_NAMES.get(spelled, spelled)
            if required:
                not_null.add((table, column))
        unique, unique_sets, references = set(), set(), {}
        for database, table, kind, names, target, target_names in self._read(CATALOG_KEYS):
            if home.get(table) != database:
                continue
            if kind == "FOREIGN KEY":
                if len(names) == 1 and home.get(target) == database:
                    references[(table, names[0])] = (target, target_names[0])
            elif len(names) == 1:
                unique.add((table, names[0]))
            else:
                unique_sets.add((table, frozenset(names)))
        return Catalog(columns, frozenset(unique), frozenset(unique_sets), frozenset(not_null), references,
                       frozenset(enums), keys_known=bool(unique or unique_sets or references))

    def time_zone(self) -> None:
        return None  # date_trunc's periods are not computed for DuckDB's timestamps: its keys stay private

    def time_zone_names(self) -> None:
        return None  # AT TIME ZONE is answered on PostgreSQL, whose zones the analysis knows

    def indexed_columns(self) -> None:
        return None

    def health(self) -> str | None:
        try:
            self._read("SELECT 1")
        except Exception as exc:  # noqa: BLE001 - a closed database: the operator reads the log
            log.warning("DuckDB health check failed: %s", exc)
            return f"DuckDB does not answer ({type(exc).__name__})"
        return None

    def close(self) -> None:
        self._conn.close()


class _Interrupt:
    """What `Cancellation` calls on a connection, for a DuckDB cursor."""

    def __init__(self, cursor: Any):
        self._cursor = cursor

    def cancel_safe(self, timeout: float | None = None) -> None:
        self._cursor.interrupt()


class DuckDBSession:
    """One answer's statements on their own DuckDB connection."""

    broken = False

    def __init__(self, backend: DuckDBBackend, cursor: Any, cancel: Any):
        self._backend, self._cursor, self._cancel = backend, cursor, cancel
        self._held: str | None = None

    def run(self, statement: Statement, work_mem: str | None = None) -> list[tuple[Any, ...]]:
        """Rows of one statement; `work_mem` is PostgreSQL's and means nothing here."""
        sql = self._backend.render(statement)
        timer = threading.Timer(self._backend._timeout_s, self._cursor.interrupt)
        try:
            if self._cancel is not None:
                self._cancel.attach(_Interrupt(self._cursor))
            timer.start()
            relation = self._cursor.sql(sql)
            instants = [str(t) == INSTANT for t in relation.types]
            if any(instants):  # by position: a query's columns may share names
                items = [f"epoch_us(#{i + 1})" if instant else f"#{i + 1}" for i, instant in enumerate(instants)]
                relation = self._cursor.sql(f"SELECT {', '.join(items)} FROM ({sql}) AS dpsql_result")
            rows = relation.fetchall()
        except QueryCancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - DuckDB's text never reaches the analyst
            if self._cancel is not None and self._cancel.cancelled:
                raise QueryCancelled("canceling statement due to user request") from None
            log.warning("DuckDB query failed: %s: %s", type(exc).__name__, str(exc)[:500])
            raise BackendError(FAILED, FAILED_HINT) from None
        finally:
            timer.cancel()
            if self._cancel is not None:
                self._cancel.attach(None)
        return [tuple(plain_value(v, instant) for v, instant in zip(row, instants, strict=True)) for row in rows]

    def hold(self, name: str) -> None:
        """Identical queries of this process wait for each other (the ledger still never charges one twice)."""
        self._backend.locks.acquire(name)
        self._held = name

    def release(self) -> None:
        if self._held is not None:
            self._backend.locks.release(self._held)
            self._held = None
        self._cursor.close()


__all__ = ["DuckDBBackend", "to_duckdb"]
