"""The joined relation as the rewrite reads it: FROM, JOIN and WHERE, with every table whose join-key
frequencies a row-level bound relies on (`plan.truncate`) cut to at most max_frequency rows per key value.

Why it is sound: the analysis' stability rules assume those frequencies hold in every database; reading the
tables truncated makes them hold, whatever the data. Which rows are kept depends only on the rows themselves
(a keyed hash of the whole row), so one added row can push out at most one kept row per truncated key, which
the stability counts.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis import Plan
from dpsql.errors import UnsupportedQuery
from dpsql.rewrite.fragments import sql
from dpsql.sql import dialect


def from_where(plan: Plan, extra: exp.Expression | None = None, hash_seed: int = 0) -> str:
    """`FROM ... JOIN ... WHERE (plan's condition) AND (extra)`, the tables truncated where the plan says."""
    def read(node: exp.Expression) -> str:
        return sql(_truncated(node, plan, hash_seed) if plan.truncate else node)

    parts = [read(plan.from_)] + [read(j) for j in plan.joins]
    conditions = [c for c in (plan.where, extra) if c is not None]  # subqueries in WHERE read their tables whole
    if conditions:
        parts.append("WHERE " + " AND ".join(f"({sql(c)})" for c in conditions))
    return " ".join(parts)


def rows_cte(plan: Plan, items: list[str], extra: exp.Expression, hash_seed: int) -> str:
    """`dpsql_rows`: the plan's rows as `items`. Read from one table without truncation, it is NOT MATERIALIZED:
    PostgreSQL then scans the table once per use, in parallel and (for the unit's grouping) from an index,
    which costs less than storing every row; a join is computed once and stored."""
    materialized = "" if plan.joins or plan.truncate else " NOT MATERIALIZED"
    return f"dpsql_rows AS{materialized} (SELECT {', '.join(items)} {from_where(plan, extra, hash_seed)})"


def _truncated(node: exp.Expression, plan: Plan, hash_seed: int) -> exp.Expression:
    """`node` with every table in `plan.truncate` read truncated to at most max_frequency rows per value of each
    join key (`dialect.truncated`, which says how the rows to keep are chosen)."""
    def swap(table: exp.Expression) -> exp.Expression:
        if not isinstance(table, exp.Table) or table.name not in plan.truncate:
            return table
        if table.args.get("sample") is not None:  # the truncated read would drop it
            raise UnsupportedQuery(f"TABLESAMPLE on {table.name} is not supported in a join that bounds how often "
                                   "its keys repeat", f"ask over the whole table: FROM {table.name} without "
                                   "TABLESAMPLE")
        return dialect.truncated(table.name, hash_seed, plan.truncate[table.name], table.alias_or_name)
    return node.copy().transform(swap, copy=False)
