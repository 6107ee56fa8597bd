"""PostgreSQL's meaning kept on engines that are not PostgreSQL: the rules Spark and DuckDB share.

The rewrite writes PostgreSQL's SQL (and the dialect nodes of `dpsql.sql.dialect`); sqlglot transpiles the syntax,
and these rules keep what the syntax alone would change: exponent literals that PostgreSQL reads as numerics, an
unbounded DECIMAL, the bytewise collation, bands over thresholds, strict clamps, the dates no function overflows
on, and values handed back as psycopg hands PostgreSQL's.
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.sql import dialect
from dpsql.sql.to_char import portable, template_of

FAILED, FAILED_HINT = "the query failed in the backend", "the failure was logged; the charge stands"
# `dialect.earliest()` and `latest()` on an engine whose dates run from year 1 to 9999, where none of its date
# functions overflow (PostgreSQL's own range, 4000 BC to 294276 AD, is not one such an engine can parse)
SAFE_DATES = ("0001-01-01", "9999-12-31")
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


WALL_CLOCK = (exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP)  # PostgreSQL's date and timestamp, no zone


def portable_time_formats(node: exp.Expression) -> exp.Expression:
    """Refuses, before any charge, to_char with a template the engine would print otherwise than PostgreSQL
    (`to_char.portable`): DuckDB printed to_char(day, 'Day') as '7ay', and Spark rejects ISO week fields only
    when the query runs, after its charge."""
    if isinstance(node, exp.TimeToStr) and isinstance(node.args.get("format"), exp.Literal):
        template = template_of(node)
        if not portable(template):
            raise UnsupportedQuery(f"to_char template '{template}' is printed differently by this backend",
                                   "format with YYYY, MM, DD, HH24, MI and SS (to_char(day, 'YYYY-MM')), or group "
                                   "by date_trunc('month', day) or EXTRACT(DOW FROM day) instead of names")
    return node


def row_samples(node: exp.Expression) -> exp.Expression:
    """Refuses TABLESAMPLE, before any charge: only PostgreSQL's BERNOULLI with a seed is known to meet the same
    rows at every read of a table in one statement, which the bounds rely on (`sql.with_sample_seeds`)."""
    if isinstance(node, exp.TableSample):
        raise UnsupportedQuery("TABLESAMPLE is answered on the PostgreSQL backend only",
                               "ask over the whole table on this backend: SELECT COUNT(*) FROM visits")
    return node


def shifts_wall_clock(node: exp.Expression) -> bool:
    """Whether `node` is a date or a timestamp without time zone ± an interval: PostgreSQL's is a timestamp without
    time zone, truncated as it stands (Metabase's weeks from Sunday), where sqlglot's types say a date."""
    return (isinstance(node, exp.Add | exp.Sub) and isinstance(node.expression, exp.Interval)
            and node.this.type is not None and node.this.type.this in WALL_CLOCK)


def plain_numbers(node: exp.Expression) -> exp.Expression:
    """PostgreSQL reads `250e-2` as the numeric 2.50, other engines as a double 2.5 (whose text is '2.5'): written
    out as decimals (`2.50`; `1e3` and `1.5e1`, whose scale is 0, as DECIMAL(38, 0)s)."""
    if isinstance(node, exp.Literal) and not node.is_string and "e" in node.this.lower():
        value = Decimal(node.this)
        if value.as_tuple().exponent < 0:  # a point in its text: a decimal literal of that scale
            return exp.Literal.number(format(value, "f"))
        return exp.Cast(this=exp.Literal.number(format(value, "f")), to=exp.DataType.build("DECIMAL(38, 0)"))
    return node


def bytewise(node: exp.Expression) -> exp.Expression:
    """`COLLATE "C"` dropped: the engines' strings already compare byte by byte."""
    if isinstance(node, exp.Collate) and node.expression.name == "C":
        return node.this
    return node


def wide_decimals(node: exp.Expression) -> exp.Expression:
    """`CAST(x AS DECIMAL)` is PostgreSQL's unbounded numeric but another engine's DECIMAL(10, 0) or (18, 3), which
    would round every price: DECIMAL(38, 10) (the rewrite's bounds are within ±1e12)."""
    if isinstance(node, exp.DataType) and node.this == exp.DataType.Type.DECIMAL and not node.expressions:
        return exp.DataType.build("DECIMAL(38, 10)")
    return node


def bands(node: exp.Expression) -> exp.Expression:
    """PostgreSQL's `width_bucket(x, ARRAY[t1, ..., tn])` (how many thresholds are at most x; NULL for NULL) as
    `CASE WHEN x IS NULL THEN NULL WHEN x < t1 THEN 0 ... ELSE n END`."""
    if not (isinstance(node, exp.WidthBucket) and node.args.get("threshold") is not None):
        return node
    thresholds = node.args["threshold"]
    thresholds = thresholds.this if isinstance(thresholds, exp.Cast) else thresholds
    value = node.this
    ifs = [exp.If(this=exp.Is(this=value.copy(), expression=exp.Null()), true=exp.Null())]
    ifs += [exp.If(this=exp.LT(this=value.copy(), expression=t.copy()), true=exp.Literal.number(band))
            for band, t in enumerate(thresholds.expressions)]
    return exp.Case(ifs=ifs, default=exp.Literal.number(len(thresholds.expressions)))


def strict_bound(value: exp.Expression, bound: exp.Expression, larger: bool) -> exp.Expression:
    """`dialect.strict_bound` where LEAST and GREATEST skip NULLs: `CASE WHEN x IS NULL THEN NULL ELSE
    GREATEST(x, bound) END` (NaN sorts above every number on these engines as on PostgreSQL)."""
    pick = exp.Greatest if larger else exp.Least
    return exp.Case(ifs=[exp.If(this=exp.Is(this=value.copy(), expression=exp.Null()), true=exp.Null())],
                    default=pick(this=value, expressions=[bound]))


def plain_value(value: Any, instant: bool = False) -> Any:
    """A value as psycopg gives PostgreSQL's: decimals as ints or floats, and an instant fetched as microseconds
    since 1970 as an aware datetime, as timestamptz is."""
    if instant and value is not None:
        return EPOCH + datetime.timedelta(microseconds=value)
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _strict_bound_node(node: exp.Anonymous) -> exp.Expression:
    value, bound, _, larger = dialect.bound_parts(node)
    return strict_bound(value, bound, larger)


# the dialect nodes Spark and DuckDB spell alike (`dialect.spell`); each adds its hash, row id and truncation
SHARED_SPELLINGS: dict[str, dialect.Spelling] = {
    dialect.STRICT_BOUND: _strict_bound_node,
    dialect.EARLIEST: lambda node: exp.Literal.string(SAFE_DATES[0]),
    dialect.LATEST: lambda node: exp.Literal.string(SAFE_DATES[1]),
}
