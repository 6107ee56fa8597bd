"""Pass: the group keys, whether their values are public, and G, the most groups one unit can touch.

Rules:
- a key's values are public when the schema declares them: a column's domain, a boolean, a CASE whose
  results are constants, or a bounded integer expression with fewer than MAX_DOMAIN values. When every key
  is public (and the product of their domains is at most MAX_DOMAIN), every key combination is released,
  empty ones too, so which groups exist reveals nothing; otherwise the keys are private and the groups are
  released by DP partition selection;
- G = 1 when every key is a function of the unit's own row (its unit-determined tables, no outer join): each
  unit is in one group. Otherwise G = min(max_groups_per_unit, k), enforced by the rewrite unless each
  joined row is a whole unit (then k = 1 and G = 1 hold without it);
- under row-level joins, the S changed joined rows may each fall in another group: G = S, and the stability
  already counts them over all groups (see `Scope.spread`).
"""

from __future__ import annotations

import math
from itertools import product

from sqlglot import exp

from dpsql.analysis.expressions import Expressions, Range
from dpsql.analysis.plan import GroupKey
from dpsql.analysis.scope import Scope
from dpsql.errors import UnsupportedQuery
from dpsql.sql import AGGREGATES, to_sql

MAX_DOMAIN = 10_000  # largest public key set released in full (every key, empty ones too)


def bound_groups(scope: Scope) -> None:
    """Set the scope's group keys, G, whether the rewrite must cap the groups per unit, and the public domain
    of key combinations (None: partition selection)."""
    keys = _group_keys(scope)
    k = scope.rows_per_unit
    if keys and scope.stability is not None:  # the changed joined rows may each fall in another group
        groups, cap = k, False
        scope.notes.append(f"the {k} changed joined row(s) may fall in as many groups")
    elif keys:
        natural = not scope.outer_join and all(
            all(c.table in scope.determined for c in key.expr.find_all(exp.Column)) for key in keys)
        groups = 1 if natural else max(1, min(scope.max_groups_setting, k))
        cap = not natural and not scope.direct
        if natural:
            scope.notes.append("group keys depend only on the unit: each unit is in one group")
        else:
            scope.notes.append(f"each unit counts in at most {groups} group(s) (enforced by the rewrite)")
    else:
        groups, cap = 1, False
    domain = _domain(keys)
    if keys:
        scope.notes.append("group keys come from a public domain: every key is released" if domain is not None
                           else "group keys are private: released by DP partition selection")
    scope.group_keys, scope.max_groups, scope.cap_groups, scope.domain = keys, groups, cap, domain


def key_domain(scope: Scope, node: exp.Expression, value_range: Range | None) -> tuple | None:
    """The public values of a key expression, or None when they are not declared."""
    if isinstance(node, exp.Column):
        column = scope.declared_column(node)
        if column is not None and column.domain is not None:
            return column.domain
        if column is not None and column.type == "boolean":
            return (False, True)
    if isinstance(node, exp.Case) and all(
            isinstance(b.args["true"], exp.Literal) for b in node.args.get("ifs", [])):
        default = node.args.get("default")
        if default is None or isinstance(default, exp.Literal):
            values = [b.args["true"].to_py() for b in node.args["ifs"]]
            values.append(default.to_py() if default is not None else None)
            return tuple(dict.fromkeys(values))
    if (value_range is not None and value_range.integer and value_range.bounded
            and value_range.hi - value_range.lo < MAX_DOMAIN):
        return tuple(range(int(value_range.lo), int(value_range.hi) + 1))
    return None


def key_type(node: exp.Expression, exprs: Expressions) -> str:
    """The PostgreSQL type a key expression's values are released as."""
    value_range = exprs.value_range(node)
    if value_range is not None:
        return "int8" if value_range.integer else "float8"
    if isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
        return "timestamptz"
    if isinstance(node, exp.Column):
        column = exprs.column(node)
        if column is not None:
            return {"boolean": "bool", "date": "date", "timestamp": "timestamp",
                    "timestamptz": "timestamptz"}.get(column.type, "text")
    return "text"


def _group_keys(scope: Scope) -> list[GroupKey]:
    group = scope.tree.args.get("group")
    if group is None:
        return []
    if group.args.get("rollup") or group.args.get("cube") or group.args.get("grouping_sets"):
        raise UnsupportedQuery("ROLLUP, CUBE and GROUPING SETS are not supported")
    keys = []
    for i, node in enumerate(group.expressions):
        if any(isinstance(n, tuple(AGGREGATES)) for n in node.walk()):
            raise UnsupportedQuery("aggregates are not allowed in GROUP BY")
        value_range = scope.exprs.value_range(node)
        keys.append(GroupKey(f"g{i}", scope.exprs.guard(node), key_domain(scope, node, value_range),
                             to_sql(node)))
    return keys


def _domain(keys: list[GroupKey]) -> list[tuple] | None:
    if not keys or any(k.domain is None for k in keys):
        return None
    if math.prod(len(k.domain) for k in keys) > MAX_DOMAIN:
        return None
    return list(product(*(k.domain for k in keys)))
