"""The clamps that make the rewritten SQL enforce a range: a declared column's (`clamp`, a CASE that makes NaN and
NULL what the analysis assumes), a derived value's (`clamp_to`, the engine's strict bounds) and a date's
(`temporal_guard`, NULL outside the dates no function overflows on), with the literals they compare against."""

from __future__ import annotations

import math

from sqlglot import exp

from dpsql.schema import INTEGER_TYPES, Column, temporal_value
from dpsql.sql import dialect

CLAMP = "dpsql_clamp"


def clamp(node: exp.Expression, column: Column) -> exp.Expression:
    """`node` limited to the column's declared range, NULL and NaN becoming NULL (NaN sorts above every number).
    A CASE, not LEAST/GREATEST: those ignore NULL arguments, so a NULL would come out as the lower bound, and a
    value inside the range costs two comparisons here. The clamp carries (node, lo, hi) in its meta[CLAMP]."""
    lo, hi = column.lower, column.upper
    clamped = _clamp(node, column, lo, hi)
    if not column.is_temporal:  # what was clamped, for the bounds' effect (rewrite/bounds.py), which compares numbers
        clamped.meta[CLAMP] = (node.copy(), lo, hi)
    return clamped


def _clamp(node: exp.Expression, column: Column, lo: float, hi: float) -> exp.Expression:
    if column.is_temporal:  # dates and timestamps have no NaN; ±infinity compare as beyond either bound
        low, high = (temporal_literal(column.type, v) for v in (lo, hi))
        return exp.Case(ifs=[exp.If(this=exp.LT(this=node.copy(), expression=low), true=low.copy()),
                             exp.If(this=exp.GT(this=node.copy(), expression=high), true=high.copy())],
                        default=node.copy())
    if column.type in INTEGER_TYPES:  # the integers in [lo, hi]: a cast would round a fractional bound outward
        lo, hi = (math.ceil(lo), math.floor(hi)) if math.ceil(lo) <= math.floor(hi) else (lo, hi)
    low, high = number(lo), number(hi)
    below = exp.If(this=exp.LT(this=node.copy(), expression=low), true=low.copy())
    if column.type in INTEGER_TYPES:
        above = exp.If(this=exp.GT(this=node.copy(), expression=high), true=high.copy())
        return exp.Cast(this=exp.Case(ifs=[below, above], default=node.copy()), to=exp.DataType.build("BIGINT"))
    inside = exp.If(this=exp.LTE(this=node.copy(), expression=high), true=node.copy())
    nan = exp.Cast(this=exp.Literal.string("NaN"), to=exp.DataType.build(column.type))
    above = exp.If(this=exp.NEQ(this=node.copy(), expression=nan), true=high.copy())
    return exp.Case(ifs=[below, inside, above])


def clamp_to(node: exp.Expression, lo: float, hi: float, kind: str) -> exp.Expression:
    """`node`, of SQL kind `kind` (see `Expressions.kind`), limited to [lo, hi]: enforces a range the analysis
    relies on. The engine's strict larger and smaller (`dialect.strict_bound`) evaluate `node` once and keep NULL
    NULL (LEAST/GREATEST would turn it into a bound)."""
    if kind == "integer":
        if math.ceil(lo) > math.floor(hi):
            kind = "numeric"
        else:
            lo, hi = math.ceil(lo), math.floor(hi)
    if kind == "numeric":  # a no-op on numeric; a column declared numeric but stored as a float still works
        node = exp.Cast(this=node, to=exp.DataType.build("DECIMAL"))
    return dialect.strict_bound(dialect.strict_bound(node, number(lo), kind, larger=True), number(hi), kind,
                                larger=False)


def temporal_literal(type_name: str, number: float) -> exp.Expression:
    """The date or timestamp `temporal_number` maps to `number`, as a typed SQL literal."""
    value = temporal_value(type_name, number)
    return exp.Cast(this=exp.Literal.string(value.isoformat()), to=exp.DataType.build(type_name))


def number(value: float) -> exp.Expression:
    if float(value).is_integer():
        return exp.Literal.number(str(int(value)))
    return exp.Literal.number(repr(float(value)))


def temporal_guard(node: exp.Expression, keep_infinite: bool) -> exp.Expression:
    """`node` (a date or timestamp) as NULL outside the engine's safe dates (`dialect.earliest()`, `latest()`),
    where a cast to timestamp or date_trunc could overflow; ±infinity is kept where the consumer takes it (casts)
    and NULL where it would yield an infinite number (EXTRACT(year FROM 'infinity') is Infinity, which no integer
    cast accepts). Constants are left alone: they fail, if at all, on every database."""
    if constant(node):
        return node
    inside = exp.Between(this=node.copy(), low=dialect.earliest(), high=dialect.latest())
    if keep_infinite:
        finite = exp.Anonymous(this="isfinite", expressions=[node.copy()])
        inside = exp.Or(this=inside, expression=exp.Not(this=finite))
    return exp.Case(ifs=[exp.If(this=inside, true=node.copy())])


def constant(node: exp.Expression) -> bool:
    """Whether `node` reads no column."""
    return not any(isinstance(n, exp.Column) for n in node.walk())
