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


def bind_parameters(tree: exp.Select, params: Sequence[Any] | Mapping[str, Any] | None) -> exp.Select:
    """A copy of `tree` with every placeholder ($1, %s, %(name)s) replaced by its parameter's literal (`tree`
    itself where it has none): the caller's tree keeps its placeholders, so it may be bound again."""
    if not any(isinstance(n, exp.Placeholder | exp.Parameter) for n in tree.walk()):
        if params:
            raise InvalidParameter(f"{len(params)} parameters given but the query has no placeholders")
        return tree
    if params is None:
        raise InvalidParameter("the query has placeholders but no parameters were given")
    tree = tree.copy()
    slots = [n for n in tree.walk() if isinstance(n, exp.Placeholder | exp.Parameter)]
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
