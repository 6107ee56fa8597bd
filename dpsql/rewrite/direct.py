"""Strategy: each joined row is one whole unit (unique constraints guarantee it, or row-level privacy), so
the rows are aggregated directly. The per-row clamps of the guarded expressions already bound each unit."""

from __future__ import annotations

from dpsql.analysis import Plan
from dpsql.rewrite.fragments import aggregate, group_by, sql, units_item
from dpsql.rewrite.truncation import from_where


def statistics(plan: Plan, hash_seed: int) -> str:
    """Per group: the keys, one exact sum per measure, and the row count where partition selection reads it."""
    keys = [f"{sql(k.expr)} AS {k.name}" for k in plan.group_keys]
    sums = [f"{aggregate(m, None if m.expr is None else sql(m.expr))} AS {m.name}" for m in plan.measures]
    select = ", ".join([*keys, *sums, units_item(plan)])
    return f"SELECT {select} {from_where(plan, hash_seed=hash_seed)}{group_by([str(i + 1) for i in range(len(keys))])}"
