"""Bind: parameters become literals in the parsed tree (never text spliced into SQL), so the analysis sees
their values and the answer cache keys on them."""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlglot import exp

from dpsql.errors import InvalidParameter


def fix_the_time(tree: exp.Select, now: datetime.datetime) -> exp.Select:
    """`tree` with now(), current_timestamp, current_date and localtimestamp, and constant date arithmetic on
    them (`now() - interval '30 days'`, `current_date - 7`), replaced by literals of `now` (UTC). The time is
    not data: fixed when the query arrives, it is part of the query, and of its cache key."""
    def fold(node: exp.Expression) -> exp.Expression:
        if not node.find(*CLOCKS):
            return node
        value = _time_value(node, now)
        if value is None:
            return node
        if isinstance(value, datetime.datetime):
            return exp.cast(exp.Literal.string(value.isoformat(sep=" ")),
                            "timestamptz" if value.tzinfo else "timestamp")
        return exp.cast(exp.Literal.string(value.isoformat()), "date")
    return tree.transform(fold, copy=False)


CLOCKS = (exp.CurrentTimestamp, exp.CurrentDate, exp.Localtimestamp)
_INTERVAL_UNITS = {"SECOND": "seconds", "MINUTE": "minutes", "HOUR": "hours", "DAY": "days", "WEEK": "weeks"}


def _time_value(node: exp.Expression, now: datetime.datetime) -> datetime.date | None:
    """The value of a constant time expression over the clock, as PostgreSQL computes it, or None."""
    if isinstance(node, exp.CurrentTimestamp) and not node.args:
        return now
    if isinstance(node, exp.Localtimestamp) and not node.args:
        return now.replace(tzinfo=None)
    if isinstance(node, exp.CurrentDate) and not node.args:
        return now.date()
    if isinstance(node, exp.Paren):
        return _time_value(node.this, now)
    if isinstance(node, exp.Cast) and node.to.is_type("date"):
        value = _time_value(node.this, now)
        return value.date() if isinstance(value, datetime.datetime) else value
    if isinstance(node, exp.Add | exp.Sub):
        value = _time_value(node.this, now)
        if type(value) is datetime.date and isinstance(node.expression, exp.Interval):
            value = datetime.datetime.combine(value, datetime.time())  # date ± interval is a timestamp
        step = _step(node.expression, value)
        if value is None or step is None:
            return None
        return value + step if isinstance(node, exp.Add) else value - step
    return None


def _step(node: exp.Expression, value: datetime.date | None) -> datetime.timedelta | None:
    """`interval 'n unit'` (seconds to weeks), or an integer of days added to a date."""
    if isinstance(node, exp.Interval) and isinstance(node.this, exp.Literal) and node.args.get("unit") is not None:
        unit = node.args["unit"].name.upper().rstrip("S")
        amount = node.this.this.strip()
        if unit in _INTERVAL_UNITS and amount.lstrip("-").isdigit() and abs(int(amount)) < 100_000:
            step = datetime.timedelta(**{_INTERVAL_UNITS[unit]: int(amount)})
            return step if isinstance(value, datetime.datetime) else None
    if (isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit() and int(node.this) < 100_000
            and type(value) is datetime.date):
        return datetime.timedelta(days=int(node.this))
    return None


def bind_parameters(tree: exp.Select, params: Sequence[Any] | Mapping[str, Any] | None) -> exp.Select:
    """`tree` with every placeholder ($1, %s, %(name)s) replaced by its parameter's literal."""
    slots = [n for n in tree.walk() if isinstance(n, exp.Placeholder | exp.Parameter)]
    if not slots:
        if params:
            raise InvalidParameter(f"{len(params)} parameters given but the query has no placeholders")
        return tree
    if params is None:
        raise InvalidParameter("the query has placeholders but no parameters were given")
    positional = 0
    for slot in slots:
        if isinstance(slot, exp.Parameter):  # $1, $2, ...
            index = int(slot.name) - 1
            value = _lookup(params, index)
        elif slot.name and slot.name != "?":  # %(name)s
            if not isinstance(params, Mapping):
                raise InvalidParameter(f"named placeholder %({slot.name})s needs a mapping of parameters")
            if slot.name not in params:
                raise InvalidParameter(f"no value for parameter %({slot.name})s")
            value = params[slot.name]
        else:  # %s
            value = _lookup(params, positional)
            positional += 1
        slot.replace(_literal(value))
    if isinstance(params, Sequence) and positional and positional != len(params):
        raise InvalidParameter(f"the query has {positional} placeholders but {len(params)} parameters were given")
    return tree


def _lookup(params: Sequence[Any] | Mapping[str, Any], index: int) -> Any:
    if isinstance(params, Mapping) or not 0 <= index < len(params):
        raise InvalidParameter(f"no value for parameter {index + 1}")
    return params[index]


def _literal(value: Any) -> exp.Expression:
    """A SQL literal for a Python value (parameters are bound into the tree, never into text)."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | decimal.Decimal):
        return exp.Literal.number(str(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidParameter(f"parameter {value} is not a finite number")
        return exp.Literal.number(repr(value))
    if isinstance(value, datetime.datetime | datetime.date):
        kind = "TIMESTAMP" if isinstance(value, datetime.datetime) else "DATE"
        return exp.Cast(this=exp.Literal.string(value.isoformat()), to=exp.DataType.build(kind))
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidParameter("string parameters may not contain NUL characters")
        return exp.Literal.string(value)
    if isinstance(value, list | tuple):
        return exp.Tuple(expressions=[_literal(v) for v in value])
    raise InvalidParameter(f"unsupported parameter type {type(value).__name__}")
