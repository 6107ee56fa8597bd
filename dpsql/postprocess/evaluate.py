"""A small evaluator for post-processing expressions over noisy values (scalars, or numpy arrays of simulated
draws), and PostgreSQL's ORDER BY over released rows."""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.schema import TEMPORAL_TYPES, temporal_value
from dpsql.sql import to_sql
from dpsql.sql.patterns import like_regex
from dpsql.sql.to_char import number_to_char, template_of, to_char


def typed(value: Any, type_name: str) -> Any:
    if value is None:
        return None
    if type_name.endswith("[]"):
        return [typed(v, type_name[:-2]) for v in value]
    if isinstance(value, np.generic | np.ndarray):
        value = value.item()
    if type_name in TEMPORAL_TYPES and isinstance(value, int | float):  # a quantile of dates, chosen as a number
        return temporal_value(type_name, value)
    if type_name == "int8" and isinstance(value, int | float) and math.isfinite(value):
        return int(round(value))
    if type_name == "float8" and isinstance(value, int | float):
        return float(value)
    if type_name == "numeric" and isinstance(value, int | float) and math.isfinite(value):
        return Decimal(repr(value)).normalize() if value != int(value) else Decimal(int(value))
    return value


def _time_cast(value: datetime.date, to: exp.DataType.Type) -> datetime.date:
    """A released date or time cast as PostgreSQL casts it: to a date, its day (a timestamptz's in the session's
    zone, which the released value carries); to a timestamp, its wall time (a date's midnight)."""
    if to == exp.DataType.Type.DATE:
        return value.date() if isinstance(value, datetime.datetime) else value
    if not isinstance(value, datetime.datetime):
        return datetime.datetime.combine(value, datetime.time())
    return value.replace(tzinfo=None)


def _period_start(node: exp.TimestampTrunc | exp.DateTrunc, value: Any) -> datetime.date | None:
    """`date_trunc(unit, value)::date`: the first day of the value's period (a timestamptz's in the session's zone,
    which the released value carries; a date's own), as PostgreSQL computes it."""
    if value is None:
        return None
    unit = node.args["unit"].name.lower() if node.args.get("unit") is not None else ""
    day = value.date() if isinstance(value, datetime.datetime) else value
    if not isinstance(day, datetime.date) or unit not in PERIOD_STARTS:
        raise UnsupportedQuery(f"{to_sql(node)} cannot be computed after noise", "truncate a date by day, week, "
                               "month, quarter, year, decade, century or millennium")
    return PERIOD_STARTS[unit](day)


PERIOD_STARTS: dict[str, Callable[[datetime.date], datetime.date]] = {
    **dict.fromkeys(("microseconds", "milliseconds", "second", "minute", "hour", "day"), lambda d: d),
    "week": lambda d: d - datetime.timedelta(days=d.weekday()),  # ISO weeks start on Monday
    "month": lambda d: d.replace(day=1),
    "quarter": lambda d: datetime.date(d.year, (d.month - 1) // 3 * 3 + 1, 1),
    "year": lambda d: datetime.date(d.year, 1, 1),
    "decade": lambda d: datetime.date(d.year - d.year % 10, 1, 1),
    "century": lambda d: datetime.date((d.year - 1) // 100 * 100 + 1, 1, 1),
    "millennium": lambda d: datetime.date((d.year - 1) // 1000 * 1000 + 1, 1, 1),
}


def _to_char(node: exp.TimeToStr, value: Any) -> str | None:
    """to_char of a released date or time (a group key) or of a noisy number (`to_char(SUM(x), 'FM999,990')`:
    text, so it has no interval). A time Python cannot hold arrives as PostgreSQL's text ('infinity', whose
    to_char is NULL; past year 9999): NULL."""
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, np.ndarray):
        raise TypeError("text has no simulated interval")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, datetime.date):
        return to_char(value, template_of(node))
    if isinstance(value, bool):
        raise UnsupportedQuery(f"{to_sql(node)} formats a boolean, which PostgreSQL's to_char does not",
                               "format a number or a date: to_char(SUM(x), 'FM999,990')")
    return number_to_char(value, template_of(node))


# EXTRACT's fields of a released date or time, as PostgreSQL computes them
DATE_FIELDS: dict[str, Callable[[datetime.date], int]] = {
    "YEAR": lambda d: d.year, "MONTH": lambda d: d.month, "DAY": lambda d: d.day,
    "QUARTER": lambda d: (d.month + 2) // 3, "DOW": lambda d: d.isoweekday() % 7, "ISODOW": lambda d: d.isoweekday(),
    "DOY": lambda d: d.timetuple().tm_yday, "WEEK": lambda d: d.isocalendar()[1],
    "ISOYEAR": lambda d: d.isocalendar()[0], "EPOCH": lambda d: _epoch(d),
    "HOUR": lambda d: d.hour if isinstance(d, datetime.datetime) else 0,
    "MINUTE": lambda d: d.minute if isinstance(d, datetime.datetime) else 0,
}


def _epoch(value: datetime.date) -> int | float:
    """Seconds since 1970-01-01 as PostgreSQL counts them: a date's or a timestamp's wall time read as UTC, a
    timestamptz's instant (Grafana's time buckets: floor(extract(epoch from day)/86400)*86400)."""
    if isinstance(value, datetime.datetime):
        seconds = value.timestamp() if value.tzinfo is not None else (
            value - datetime.datetime(1970, 1, 1)).total_seconds()
    else:
        seconds = (value - datetime.date(1970, 1, 1)).days * 86400
    return int(seconds) if seconds == int(seconds) else seconds


# the fields of an interval between two times, as PostgreSQL's (days and the time of day; no months)
INTERVAL_FIELDS: dict[str, Callable[[datetime.timedelta], int | float]] = {
    "EPOCH": lambda t: int(t.total_seconds()) if t.total_seconds() == int(t.total_seconds()) else t.total_seconds(),
    "DAY": lambda t: t.days if t.days >= 0 else -((-t).days),
    "HOUR": lambda t: int(abs(t).seconds // 3600) * (1 if t >= datetime.timedelta() else -1),
    "MINUTE": lambda t: int(abs(t).seconds % 3600 // 60) * (1 if t >= datetime.timedelta() else -1),
}


def _extract(node: exp.Extract, value: Any) -> int | float | None:
    """EXTRACT(field FROM k) of a released date or time (a group key: `GROUP BY EXTRACT(DOW FROM day)` over the
    released days); a noisy number has no date, and a time Python cannot hold ('infinity') has no field."""
    field = node.this.name.upper()
    if field not in DATE_FIELDS:
        raise UnsupportedQuery(f"EXTRACT({field} FROM …) of released rows is not computed here",
                               "extract one of " + ", ".join(DATE_FIELDS).lower())
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, datetime.timedelta) and field in INTERVAL_FIELDS:  # two times apart: an interval
        return INTERVAL_FIELDS[field](value)
    if not isinstance(value, datetime.date):
        raise UnsupportedQuery(f"{to_sql(node)} extracts a field of a date, and its value here is a number",
                               "extract from a date key: EXTRACT(DOW FROM day)")
    return DATE_FIELDS[field](value)


def _as_text(value: Any) -> str:
    """A value joined by ||, as PostgreSQL writes it: a whole number (a count) without a fraction, another number
    as float8 writes it (the shortest text that reads back the same, which Python's repr also writes)."""
    if isinstance(value, np.ndarray):
        raise TypeError("text has no simulated interval")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "NaN" if math.isnan(value) else (
            "Infinity" if value > 0 else "-Infinity")
    return str(value)  # text, a whole number, a numeric, a date or a time: as PostgreSQL writes them


def _in_list(value: Any, items: list[Any]) -> Any:
    """`value IN (items)` as PostgreSQL reads it: NULL for a NULL value, or where no item matches and one is
    NULL."""
    if value is None:
        return None
    matches = [np.equal(value, item) for item in items if item is not None]
    found = np.logical_or.reduce(matches) if matches else np.False_
    return None if None in items and np.ndim(found) == 0 and not found else found


def truthy(value: Any) -> bool:
    return value is not None and bool(value)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else value.isoformat() if hasattr(value, "isoformat") else str(value)


def sort_rows(rows: list, value_of: Callable[[Any, int], Any], order: Sequence[tuple[bool, bool]]) -> None:
    """Sort `rows` in place as PostgreSQL's ORDER BY would: by `value_of(row, i)` for each (descending, nulls
    first) of `order`, the first most significant."""
    for index in reversed(range(len(order))):
        descending, nulls_first = order[index]
        try:
            rows.sort(key=lambda r, i=index: sort_key(value_of(r, i), descending, nulls_first), reverse=descending)
        except TypeError:  # a date Python cannot hold came as PostgreSQL's text ('infinity'): order by the text
            rows.sort(key=lambda r, i=index: sort_key(_text_or_none(value_of(r, i)), descending, nulls_first),
                      reverse=descending)


def sort_key(value: Any, descending: bool, nulls_first: bool) -> tuple:
    # with reverse=True the tuple order flips, so put NULLs where PostgreSQL would after the flip
    is_null = value is None
    null_rank = (0 if is_null else 1) if nulls_first != descending else (1 if is_null else 0)
    return (null_rank, 0 if is_null else value)


_BINARY = {
    exp.Add: np.add, exp.Sub: np.subtract, exp.Mul: np.multiply,
    exp.EQ: np.equal, exp.NEQ: np.not_equal, exp.GT: np.greater, exp.GTE: np.greater_equal,
    exp.LT: np.less, exp.LTE: np.less_equal,
}


def _iso_date(text: str) -> datetime.date | str:
    """DATE '2024-01-01' as a date; another spelling PostgreSQL reads stays text, which nothing here subtracts."""
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        return text


def _plain_date(value: Any) -> bool:
    return isinstance(value, datetime.date) and not isinstance(value, datetime.datetime)


def _ln(value: Any) -> Any:
    """ln of a noisy value: NULL (NaN within a simulation) where it is not positive, where PostgreSQL fails."""
    if np.ndim(value) == 0:
        return math.log(value) if value > 0 else None
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(value > 0, np.log(np.where(value > 0, value, 1.0)), np.nan)


_UNARY = {exp.Abs: np.abs, exp.Floor: np.floor, exp.Ceil: np.ceil, exp.Neg: np.negative,
          exp.Sqrt: lambda v: np.sqrt(np.maximum(v, 0)), exp.Ln: _ln, exp.Sign: np.sign, exp.Cbrt: np.cbrt,
          exp.Exp: lambda v: np.exp(np.minimum(v, 709.0))}


def evaluate(node: exp.Expression, env: dict[str, Any]) -> Any:
    """Value of a post-processing expression; NULL is None and propagates as in SQL."""
    if isinstance(node, exp.Column):
        return env[node.name]
    if isinstance(node, exp.Literal):
        value = node.to_py()  # a decimal literal is a Decimal, which numpy will not mix with the noisy floats
        return float(value) if isinstance(value, Decimal) else value
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Paren):
        return evaluate(node.this, env)
    if isinstance(node, exp.Between) and not node.args.get("symmetric"):  # x BETWEEN a AND b: a <= x AND x <= b
        return evaluate(exp.And(this=exp.GTE(this=node.this, expression=node.args["low"]),
                                expression=exp.LTE(this=node.this, expression=node.args["high"])), env)
    if isinstance(node, exp.And | exp.Or):
        left, right = evaluate(node.this, env), evaluate(node.expression, env)
        if isinstance(node, exp.And):
            return None if left is None or right is None else np.logical_and(left, right)
        return None if left is None or right is None else np.logical_or(left, right)
    if isinstance(node, exp.Not):
        value = evaluate(node.this, env)
        return None if value is None else np.logical_not(value)
    if type(node) in _BINARY:
        left, right = evaluate(node.this, env), evaluate(node.expression, env)
        if isinstance(node, exp.Sub) and _plain_date(left) and _plain_date(right):
            return (left - right).days  # PostgreSQL's days between two dates, an integer
        if isinstance(node, exp.Add | exp.Sub) and _plain_date(left) != _plain_date(right) and None not in (
                left, right):  # a date and a number of days: a date
            day, days = (left, right) if _plain_date(left) else (right, left)
            if isinstance(node, exp.Sub) and day is right:
                raise TypeError("a number less a date")  # (PostgreSQL has no such operator)
            shift = datetime.timedelta(days=int(np.round(days)))
            return day - shift if isinstance(node, exp.Sub) else day + shift
        return None if left is None or right is None else _BINARY[type(node)](left, right)
    if isinstance(node, exp.Pow):
        base, power = evaluate(node.this, env), evaluate(node.expression, env)
        if base is None or power is None:
            return None
        if np.ndim(base) == 0 and (base < 0 and not float(power).is_integer() or base == 0 and power < 0):
            return None  # where PostgreSQL fails
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # past a double: infinity
            return np.power(np.asarray(base, dtype=float), float(power))
    if isinstance(node, exp.Div | exp.IntDiv):
        left, right = evaluate(node.this, env), evaluate(node.expression, env)
        if isinstance(node, exp.IntDiv) and left is not None and right is not None:
            left, right = np.round(left), np.round(right)  # PostgreSQL's integer division: of whole numbers
        if left is None or right is None or (np.ndim(right) == 0 and right == 0):
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            quotient = np.divide(left, right)
            return np.trunc(quotient) if isinstance(node, exp.IntDiv) else quotient  # truncated toward zero
    if type(node) in _UNARY:
        value = evaluate(node.this, env)
        return None if value is None else _UNARY[type(node)](value)
    if isinstance(node, exp.Array):
        return [evaluate(e, env) for e in node.expressions]
    if isinstance(node, exp.In) and not node.args.get("query") and not node.args.get("unnest"):
        return _in_list(evaluate(node.this, env), [evaluate(e, env) for e in node.expressions])
    if isinstance(node, exp.Round):
        decimals = node.args.get("decimals")
        number = decimals.this if isinstance(decimals, exp.Neg) else decimals
        if decimals is not None and not (isinstance(number, exp.Literal) and not number.is_string):
            raise UnsupportedQuery("round()'s number of digits must be a constant",
                                   "write the digits as a constant: round(AVG(x), 2)")
        value = evaluate(node.this, env)
        digits = int(evaluate(decimals, env)) if decimals is not None else 0
        return None if value is None else np.round(value, digits)
    if isinstance(node, exp.Greatest | exp.Least):
        values = [v for v in (evaluate(e, env) for e in [node.this, *node.expressions]) if v is not None]
        if not values:
            return None
        combine = np.maximum if isinstance(node, exp.Greatest) else np.minimum
        result = values[0]
        for v in values[1:]:
            result = combine(result, v)
        return result
    if isinstance(node, exp.Nullif):
        value, other = evaluate(node.this, env), evaluate(node.expression, env)
        if value is None or other is None or np.ndim(value) != 0:
            return value
        return None if value == other else value
    if isinstance(node, exp.Coalesce):
        for e in [node.this, *node.expressions]:
            value = evaluate(e, env)
            if value is not None:
                return value
        return None
    if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.DATE \
            and isinstance(node.this.unnest(), exp.TimestampTrunc | exp.DateTrunc):
        return _period_start(node.this.unnest(), evaluate(node.this.unnest().this, env))
    if isinstance(node, exp.Cast):
        value = evaluate(node.this, env)
        if value is None:
            return None
        if node.to.this in (exp.DataType.Type.INT, exp.DataType.Type.BIGINT, exp.DataType.Type.SMALLINT):
            return np.round(value)
        if node.to.this in (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR):
            return _as_text(value)  # (a count is a whole number: 10011, not 10011.0)
        if node.to.this in (exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP) and isinstance(value, datetime.date):
            return _time_cast(value, node.to.this)
        if node.to.this == exp.DataType.Type.DATE and isinstance(node.this, exp.Literal) and node.this.is_string:
            return _iso_date(value)
        scale = node.to.expressions[1:2] if node.to.this == exp.DataType.Type.DECIMAL else []
        if scale:  # numeric(p, s) rounds half away from zero to s digits, as PostgreSQL does
            factor = 10.0 ** int(scale[0].this.this)
            return np.sign(value) * np.floor(np.abs(value) * factor + 0.5) / factor
        return value
    if isinstance(node, exp.Case) and node.this is None:
        for branch in node.args.get("ifs", []):
            condition = evaluate(branch.this, env)
            if np.ndim(condition) != 0:
                raise UnsupportedQuery("CASE over noisy values has no simulated interval",
                                       "ask for the noisy value itself and apply the CASE to the answer")
            if truthy(condition):
                return evaluate(branch.args["true"], env)
        default = node.args.get("default")
        return evaluate(default, env) if default is not None else None
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        return evaluate(node.this, env) is None
    if isinstance(node, exp.TimeToStr):
        return _to_char(node, evaluate(node.this, env))
    if isinstance(node, exp.Extract):
        return _extract(node, evaluate(node.expression, env))
    if isinstance(node, exp.Like | exp.ILike) and isinstance(node.expression, exp.Literal) and (
            node.expression.is_string):
        value = evaluate(node.this, env)  # a key's pattern after grouping: HAVING category LIKE '%a%'
        if value is None:
            return None
        found = like_regex(node.expression.this, ignore_case=isinstance(node, exp.ILike)).fullmatch(_as_text(value))
        return (found is not None) != bool(node.args.get("negate"))
    if isinstance(node, exp.DPipe):
        left, right = evaluate(node.this, env), evaluate(node.expression, env)
        return None if left is None or right is None else _as_text(left) + _as_text(right)
    raise UnsupportedQuery(f"{to_sql(node)} cannot be computed over noisy aggregates",
                           "use arithmetic, ROUND, ABS, GREATEST/LEAST, COALESCE, CASE or casts")
