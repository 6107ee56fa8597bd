"""Apache Spark as the backend: the rewritten statement's tree rendered in Spark SQL (its dialect nodes spelled
here, the rest transpiled by sqlglot with PostgreSQL's semantics kept; no SQL text is parsed) and run by a Spark
session (`spark://local[N]` for one machine and the tests, `spark://HOST:PORT` for a standalone cluster's master,
`sc://host:port` for a cluster through Spark Connect).
The ledger, the answer cache and the shadow catalog stay in PostgreSQL.

What the guarantee rests on must mean the same on Spark; where Spark differs, the rule is here:

- No constraint is trusted: Spark has no primary keys to verify, so `catalog` is None (no key, no NOT NULL) and
  every bound (rows per unit, key frequencies) is enforced by the rewrite.
- Integer division: PostgreSQL's `int / int` truncates; Spark's `/` returns a double. The query is typed
  (sqlglot's qualify and annotate_types over the declared columns), and each integer division becomes
  `CAST(a / b AS BIGINT)`, which truncates toward zero as PostgreSQL does (exact below 2^53).
- Number literals with an exponent: PostgreSQL reads `250e-2` as the numeric 2.50, Spark as a double 2.5 (whose
  text is '2.5'), so they are written out as decimals (`2.50`; `1e3` and `1.5e1`, whose scale is 0, as DECIMAL(38, 0)s).
- Rounding: PostgreSQL's round(double precision) rounds halves to even, Spark's round() away from zero; on a
  double it becomes bround (numeric rounds halves away from zero on both).
- Sums of integers: PostgreSQL's SUM(bigint) is numeric and cannot overflow; Spark's is a bigint. Integer
  arguments of SUM are cast to DECIMAL(38, 0).
- The keyed hash that picks which rows of an over-bound unit are kept (`dialect.KEYED_HASH`; PostgreSQL's
  `hashtextextended(CAST(ROW(...) AS TEXT), seed)`) is Spark's `xxhash64(seed, ...)` (which mixes each field
  in fully, so its values are independent across units too). Both are deterministic functions of the row and
  the stored seed, so a table is always bounded the same way, but the two backends may keep different rows of a
  unit that exceeds its bound (the bound holds on both).
- Dates: the rewrite keeps dates and timestamps inside the engine's safe range (`dialect.earliest()` and
  `latest()`: 4000 BC to 294276 AD on PostgreSQL, whose bounds Spark cannot parse); Spark's dates run from
  0001-01-01 to 9999-12-31, where none of its functions overflow, so the guard's bounds are those.
- Clamps: the rewrite clamps with strict bounds (`dialect.strict_bound`: PostgreSQL's `int8smaller`,
  `numeric_larger`, ...), which keep NULL NULL; Spark's LEAST and GREATEST skip NULLs (as PostgreSQL's do), so
  each is
  `CASE WHEN x IS NULL THEN NULL ELSE LEAST(x, bound) END`. `CAST(x AS DECIMAL)` is PostgreSQL's unbounded
  numeric but Spark's DECIMAL(10, 0), which would round every price: it becomes DECIMAL(38, 10) (bounds are
  within ±1e12).
- NaN: both order NaN above every number and treat NaN = NaN as true, so the rewrite's clamps
  (`x <> 'NaN'`) mean the same. ANSI mode stays on: an overflow or invalid cast the rewrite did not prevent is an
  error (DP008), never a silently wrapped value; the session's time zone is UTC.
- Statement timeout: each statement is tagged, and its tag interrupted when the timeout passes.
- Row identity: under row-level privacy the rewrite identifies a row by PostgreSQL's physical (tableoid, ctid).
  Spark has no stable row id (monotonically_increasing_id changes between runs, and between two reads of one
  table in a query). A truncation (`dialect.truncated`; on PostgreSQL, NOT IN over row ids) is a ranking of
  every row within each key, kept if no key ranks it past its limit: the same rule, one shuffle per key, no row
  id. Elsewhere (a row as its own unit, `dialect.row_id`) a table read for its row ids becomes a subquery where
  `tableoid` is the table's name and `ctid` is the row's text (each column as text, in a JSON array:
  unambiguous) with its copy number among identical rows. Identical rows are interchangeable, so which of them
  gets which copy number changes no answer, and adding a row adds one id.
- Bands: PostgreSQL's `width_bucket(x, ARRAY[t1, ..., tn])` (how many thresholds are at most x; NULL for NULL)
  has no Spark form; it becomes `CASE WHEN x IS NULL THEN NULL WHEN x < t1 THEN 0 ... ELSE n END`.
- Text keys: the rewrite groups text keys bytewise (`COLLATE "C"`); Spark's strings already compare byte by
  byte, so the collation is dropped.

A URL's query sets Spark options (`spark://local[2]?spark.driver.memory=8g`). Tables come from the Spark
catalog, or from `path = "..."` in the privacy schema (Parquet), registered as temporary views when the backend
starts.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl

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
from dpsql.errors import BackendError, BackendUnavailable, ConfigError, QueryCancelled, UnsupportedQuery
from dpsql.schema import PrivacySchema
from dpsql.sql import dialect
from dpsql.sql.dialect import Statement

log = logging.getLogger("dpsql.spark")
LOCAL = "spark://local"
# ANSI: integer overflow and bad casts fail (as in PostgreSQL) instead of wrapping or giving NULL; UTC: dates and
# timestamps mean what the shadow and the ledger say
SESSION_RULES = {"spark.sql.ansi.enabled": "true", "spark.sql.session.timeZone": "UTC"}
_SESSION_USERS: dict[int, int] = {}  # id(session) -> open backends using it
_SESSIONS_LOCK = threading.Lock()
INTEGER_TYPES = {exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
                 exp.DataType.Type.BIGINT}


def to_spark(tree: exp.Expression, schema: dict[str, dict[str, str]]) -> str:
    """A rewritten statement in Spark SQL: its dialect nodes spelled for Spark, then PostgreSQL's semantics kept
    where Spark's differ, with the rules of this module's docstring."""
    tree = _dialect_nodes(tree.copy(), schema)
    tree = tree.transform(row_samples).transform(wide_decimals).transform(_unhinted).transform(bytewise) \
        .transform(plain_numbers).transform(_finite).transform(portable_time_formats).transform(bands)
    tree = qualify(tree, schema=schema, dialect="postgres", validate_qualify_columns=False)
    tree = annotate_types(tree, schema=schema, dialect="postgres")
    tree = tree.transform(_decimal_sums).transform(_half_even).transform(_epoch).transform(_date_differences) \
        .transform(_wall_clock_truncs).transform(_wall_clock_shifts)
    return tree.sql(dialect="spark")


def _dialect_nodes(tree: exp.Expression, schema: dict[str, dict[str, str]]) -> exp.Expression:
    """The rewrite's dialect nodes (`dpsql.sql.dialect`) in Spark's spelling; a table whose rows are identified
    becomes a subquery that has `tableoid` and `ctid` (see the docstring)."""
    identified = set()

    def row_id(node: exp.Anonymous) -> exp.Expression:
        alias = node.expressions[0].name
        identified.add(alias)
        return exp.func("concat", exp.column("tableoid", table=alias), exp.Literal.string(":"),
                        exp.column("ctid", table=alias))

    def truncated(node: exp.Anonymous) -> exp.Expression:
        table, seed, limits = dialect.truncation_parts(node)
        return _ranked_truncation(table, limits, exp.Literal.number(seed), node.parent.alias_or_name, schema[table])

    tree = dialect.spell(tree, {
        **SHARED_SPELLINGS, dialect.ROW_ID: row_id, dialect.TRUNCATED: truncated,
        dialect.KEYED_HASH: lambda node: exp.Anonymous(this="xxhash64", expressions=list(node.expressions))})
    for table in list(tree.find_all(exp.Table)):
        if table.alias_or_name in identified and table.name in schema and not table.args.get("db"):
            table.replace(_identified(table, schema[table.name]))
    return tree


def _ranked_truncation(table: str, keys: list[tuple[str, int]], seed: exp.Expression, alias: str,
                       columns: dict[str, str]) -> exp.Expression:
    """Spark's form of a truncation: every row ranked within each key by the keyed hash of its columns, then by
    the columns themselves, kept if no key ranks it past that key's limit (a NULL key never does). It is the rule
    PostgreSQL's form applies with NOT IN over (tableoid, ctid), written so Spark needs no row id and one shuffle
    per key. Floating columns are ordered by their text, as Spark's ordering ties -0.0 with 0.0, which text and
    division tell apart; so only identical rows tie. With several keys those are told apart by one position,
    computed once, so every key orders them alike and two keys never drop two different copies where one
    would do."""
    def window(partition: str, order: list[exp.Expression]) -> exp.Window:
        return exp.Window(this=exp.RowNumber(), partition_by=[exp.column(partition)],
                          order=exp.Order(expressions=[exp.Ordered(this=o.copy()) for o in order]))

    def derived(select: exp.Select, name: str) -> exp.Subquery:
        return exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier(name)))

    names = [exp.column(c) for c in columns]
    hashed = exp.Anonymous(this="xxhash64", expressions=[seed.copy(), *(n.copy() for n in names)])
    order = [exp.column("dpsql_hash"), *(exp.cast(exp.column(c), "text") if _floating(kind) else exp.column(c)
                                         for c, kind in columns.items())]
    rows = exp.select(*names, exp.alias_(hashed, "dpsql_hash")).from_(exp.Table(this=exp.to_identifier(table)))
    if len(keys) > 1:
        rows = exp.select("*", exp.alias_(window(keys[0][0], order), "dpsql_tie")).from_(derived(rows, "dpsql_rows"))
        order.append(exp.column("dpsql_tie"))
    ranked = exp.select("*", *(exp.alias_(window(key, order), f"dpsql_rank{i}") for i, (key, _) in
                               enumerate(keys))).from_(derived(rows, "dpsql_hashed"))
    kept = exp.and_(*(exp.or_(exp.Is(this=exp.column(key), expression=exp.Null()),
                              exp.LTE(this=exp.column(f"dpsql_rank{i}"), expression=exp.Literal.number(limit)))
                      for i, (key, limit) in enumerate(keys)))
    return derived(exp.select(*[n.copy() for n in names]).from_(derived(ranked, "dpsql_ranked")).where(kept), alias)


def _floating(kind: str) -> bool:
    return exp.DataType.build(kind, dialect="postgres").this in (exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT)


def _row_text(columns: dict[str, str]) -> exp.Expression:
    """A row as unambiguous text: each column as text (bytes as hex) in a JSON array, so no two different rows,
    and no NULL and 'null', share one."""
    texts = [exp.Hex(this=exp.column(c)) if kind.lower() == "bytea"
             else exp.cast(exp.column(c), "text") for c, kind in columns.items()]
    return exp.Anonymous(this="to_json", expressions=[exp.Array(expressions=texts)])


def _identified(table: exp.Table, columns: dict[str, str]) -> exp.Expression:
    """`table` with its declared columns, `tableoid` (its name) and `ctid` (its text and copy number)."""
    copy = exp.Window(this=exp.RowNumber(), partition_by=[exp.column("dpsql_text")],
                      order=exp.Order(expressions=[exp.Ordered(this=exp.column("dpsql_text"))]))
    ctid = exp.func("concat", exp.column("dpsql_text"), exp.Literal.string(":"), exp.cast(copy, "text"))
    texts = exp.select(*[exp.column(c) for c in columns], exp.alias_(_row_text(columns), "dpsql_text")).from_(
        exp.Table(this=exp.to_identifier(table.name)))
    rows = exp.select(*[exp.column(c) for c in columns], exp.alias_(exp.Literal.string(table.name), "tableoid"),
                      exp.alias_(ctid, "ctid")).from_(
        exp.Subquery(this=texts, alias=exp.TableAlias(this=exp.to_identifier("dpsql_c"))))
    return exp.Subquery(this=rows, alias=exp.TableAlias(this=exp.to_identifier(table.alias_or_name)))


def _finite(node: exp.Expression) -> exp.Expression:
    # Spark's dates and timestamps have no ±infinity: isfinite(x) is TRUE, or NULL for NULL as in PostgreSQL
    if isinstance(node, exp.Anonymous) and node.name.lower() == "isfinite":
        value = node.expressions[0].copy()
        return exp.paren(exp.or_(exp.Not(this=exp.Is(this=value, expression=exp.Null())), exp.Null()))
    return node


def _epoch(node: exp.Expression) -> exp.Expression:
    # Spark has no EXTRACT(EPOCH ...): a date's is its days since 1970 times 86400, a timestamp's its microseconds
    # over 10⁶, both exact decimals as PostgreSQL's numeric
    if not (isinstance(node, exp.Extract) and node.this.name.upper() == "EPOCH"):
        return node
    value = node.expression.copy()
    if value.type is not None and value.type.this == exp.DataType.Type.DATE:
        days = exp.Cast(this=exp.Anonymous(this="unix_date", expressions=[value]),
                        to=exp.DataType.build("DECIMAL(38, 0)"))
        return exp.paren(exp.Mul(this=days, expression=exp.Literal.number(86400)))
    micros = exp.Cast(this=exp.Anonymous(this="unix_micros", expressions=[value]),
                      to=exp.DataType.build("DECIMAL(38, 6)"))
    return exp.paren(exp.Div(this=micros, expression=exp.Literal.number(1000000)))


def _date_differences(node: exp.Expression) -> exp.Expression:
    # a date minus a date is PostgreSQL's integer of days; Spark's is an INTERVAL DAY, which no number accepts
    if isinstance(node, exp.Sub) and all(side.type is not None and side.type.this == exp.DataType.Type.DATE
                                         for side in (node.this, node.expression)):
        return exp.Anonymous(this="datediff", expressions=[node.this.copy(), node.expression.copy()])
    return node


def _wall_clock_truncs(node: exp.Expression) -> exp.Expression:
    # PostgreSQL shifts a date or a timestamp by an interval as a timestamp without time zone, and truncates that
    # as it stands (Metabase's weeks from Sunday, date_trunc('week', day + INTERVAL '1 day') - INTERVAL '1 day'):
    # Spark's date_trunc is an instant in the session's zone, cast back to a TIMESTAMP_NTZ here (its shifted
    # operand becomes one in `_wall_clock_shifts`)
    if isinstance(node, exp.TimestampTrunc | exp.DateTrunc) and any(map(shifts_wall_clock, node.this.walk())):
        return exp.Cast(this=node, to=exp.DataType.build("TIMESTAMP_NTZ", dialect="spark"))
    return node


def _wall_clock_shifts(node: exp.Expression) -> exp.Expression:
    # Spark's date plus days is a date; PostgreSQL's a timestamp without time zone: a TIMESTAMP_NTZ shifted
    if shifts_wall_clock(node):
        node.set("this", exp.Cast(this=node.this, to=exp.DataType.build("TIMESTAMP_NTZ", dialect="spark")))
    return node


def _unhinted(node: exp.Expression) -> exp.Expression:
    # [NOT] MATERIALIZED tells PostgreSQL's planner how to run a WITH query; Spark has no such hint (and plans
    # each reference itself), and the result is the same either way
    if isinstance(node, exp.CTE) and node.args.get("materialized") is not None:
        node.set("materialized", None)
    return node


def _half_even(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Round) and node.args.get("decimals") is None and node.this.type is not None \
            and node.this.type.this in (exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT):
        return exp.Anonymous(this="bround", expressions=[node.this.copy()])
    return node


def _decimal_sums(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Sum) and node.this.type is not None and node.this.type.this in INTEGER_TYPES:
        return exp.Sum(this=exp.Cast(this=node.this.copy(), to=exp.DataType.build("DECIMAL(38, 0)")))
    return node


class SparkBackend:
    """Runs rewritten queries on a Spark session; one statement at a time per session, several sessions at once."""

    def __init__(self, url: str, schema: PrivacySchema, statement_timeout_ms: int = 30_000):
        try:
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise ConfigError("the Spark backend needs pyspark", "pip install 'dpsql[spark]' (and Java 17)") from exc
        self._timeout_s = statement_timeout_ms / 1000
        url, _, query = url.partition("?")  # spark://local[2]?spark.driver.memory=8g: Spark settings
        if url.startswith("sc://"):  # Spark Connect's own builder: one process may also hold a local session
            try:
                from pyspark.sql.connect.session import SparkSession as ConnectSession
            except ImportError as exc:
                raise ConfigError("Spark Connect (sc://) needs pyspark's connect client",
                                  "pip install 'dpsql[spark]' (pyspark[connect]: grpcio, pandas)") from exc
            builder = ConnectSession.builder.remote(url).appName("dpsql")
        else:
            builder = SparkSession.builder.appName("dpsql")
            # spark://local[N] is a session in this process; spark://HOST:PORT is a standalone cluster's master
            master = url[len("spark://"):] or "local[2]"
            master = master if master.startswith("local") else url
            builder = (builder.master(master).config("spark.sql.shuffle.partitions", "4")
                       .config("spark.ui.enabled", "false"))
        for key, value in parse_qsl(query):
            builder = builder.config(key, value)
        try:
            self.spark = builder.getOrCreate()
            # what the rules above rest on, whatever the URL or the cluster says: set on the session itself, which
            # a Spark Connect session allows too (a builder's settings would not reach a running server)
            for key, value in SESSION_RULES.items():
                self.spark.conf.set(key, value)
        except Exception as exc:  # noqa: BLE001 - no Java, no cluster: say so, charge nothing
            log.warning("cannot start Spark: %s", exc)
            raise BackendUnavailable(f"cannot start a Spark session for {url}",
                                     "check that Java 17 is installed (or the Spark Connect server is up)") from None
        with _SESSIONS_LOCK:  # a process's backends share one session (getOrCreate): the last to close stops it
            _SESSION_USERS[id(self.spark)] = _SESSION_USERS.get(id(self.spark), 0) + 1
        self._types = schema.sqlglot_schema()
        for table in schema.tables.values():
            if table.path:
                self.spark.read.parquet(table.path).createOrReplaceTempView(table.name)
        self.locks = NamedLocks()

    @contextmanager
    def session(self, cancel: Any = None) -> Iterator[SparkStatements]:
        session = SparkStatements(self, cancel)
        try:
            yield session
        finally:
            session.release()

    def render(self, statement: Statement) -> str:
        """The statement in Spark SQL (made once per statement)."""
        return statement.render("spark", lambda tree: to_spark(tree, self._types))

    def catalog(self) -> None:
        return None  # Spark verifies no keys (every bound is enforced by the rewrite), and its types are its own

    def time_zone(self) -> None:
        return None  # date_trunc's periods are not computed for Spark's timestamps: its keys stay private

    def time_zone_names(self) -> None:
        return None  # AT TIME ZONE is answered on PostgreSQL, whose zones the analysis knows

    def indexed_columns(self) -> None:
        return None  # no indexes: Spark groups by shuffling, whatever the table

    def health(self) -> str | None:
        try:
            self.spark.sql("SELECT 1").collect()
        except Exception as exc:  # noqa: BLE001 - a stopped session, a lost cluster: the operator reads the log
            log.warning("Spark health check failed: %s", exc)
            return f"Spark does not answer ({type(exc).__name__})"
        return None

    def check(self, statement: Statement) -> None:
        """Refuses, before anything is charged, a rewritten statement Spark cannot analyse (a function or pattern
        it lacks). Spark's analysis reads the tables' types only, never their rows, so its verdict cannot depend
        on the data."""
        try:
            self.spark.sql(self.render(statement)).schema  # noqa: B018 - analysis only, no job runs
        except UnsupportedQuery:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure here is Spark's SQL, not the data's
            found = re.search(r"\[([A-Z_.]+)\]", str(exc))
            reason = found.group(1) if found else type(exc).__name__
            raise UnsupportedQuery(f"Spark cannot run this query's rewritten SQL ({reason})",
                                   "rephrase it, or ask it on the PostgreSQL backend") from None

    def close(self) -> None:
        with _SESSIONS_LOCK:
            users = _SESSION_USERS.pop(id(self.spark), 1) - 1
            if users:
                _SESSION_USERS[id(self.spark)] = users
        if not users:
            with contextlib.suppress(Exception):
                self.spark.stop()


def _instants_as_micros(frame: Any, instants: list[bool]) -> Any:
    """`frame` with every TIMESTAMP column as its microseconds since 1970 (columns renamed by position, as a
    query's may share names)."""
    frame = frame.toDF(*(f"c{i}" for i in range(len(instants))))
    return frame.selectExpr(*(f"unix_micros(c{i})" if instant else f"c{i}" for i, instant in enumerate(instants)))


class SparkStatements:
    """One answer's statements on the shared Spark session (the name mirrors the PostgreSQL backend's session)."""

    broken = False

    def __init__(self, backend: SparkBackend, cancel: Any):
        self._backend, self._cancel = backend, cancel
        self._held: str | None = None

    def run(self, statement: Statement, work_mem: str | None = None) -> list[tuple[Any, ...]]:
        """Rows of one statement; `work_mem` is PostgreSQL's and means nothing here."""
        if self._cancel is not None and self._cancel.cancelled:
            raise QueryCancelled("canceling statement due to user request")
        spark = self._backend.spark
        # a tag on this thread's operations, interrupted at the timeout (job groups need the JVM's SparkContext,
        # which a Spark Connect session has not)
        tag = f"dpsql-{uuid.uuid4().hex}"
        timer = threading.Timer(self._backend._timeout_s, lambda: spark.interruptTag(tag))
        try:
            spark.addTag(tag)
            timer.start()
            frame = spark.sql(self._backend.render(statement))
            instants = [type(f.dataType).__name__ == "TimestampType" for f in frame.schema.fields]
            if any(instants):
                frame = _instants_as_micros(frame, instants)
            rows = frame.collect()
        except Exception as exc:  # noqa: BLE001 - Spark's text never reaches the analyst
            log.warning("Spark query failed: %s: %s", type(exc).__name__, str(exc)[:500])
            raise BackendError(FAILED, FAILED_HINT) from None
        finally:
            timer.cancel()
            with contextlib.suppress(Exception):
                spark.removeTag(tag)
        return [tuple(plain_value(v, instant) for v, instant in zip(row, instants, strict=True)) for row in rows]

    def hold(self, name: str) -> None:
        """Identical queries of this process wait for each other (there is no advisory lock to share across
        processes on Spark; the ledger still never charges a query twice)."""
        self._backend.locks.acquire(name)
        self._held = name

    def release(self) -> None:
        if self._held is not None:
            self._backend.locks.release(self._held)
            self._held = None


__all__ = ["SparkBackend", "to_spark"]
