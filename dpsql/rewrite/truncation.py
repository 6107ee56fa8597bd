"""The joined relation as the rewrite reads it: FROM, JOIN and WHERE, with every table whose join-key
frequencies a row-level bound relies on (`plan.truncate`) cut to at most max_frequency rows per key value.

Why it is sound: the analysis' stability rules assume those frequencies hold in every database; reading the
tables truncated makes them hold, whatever the data. Which rows are kept depends only on the rows themselves
(a keyed hash of the whole row), so one added row can push out at most one kept row per truncated key, which
the stability counts.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from dpsql.analysis import Plan
from dpsql.rewrite.fragments import sql
from dpsql.sql import DIALECT, to_sql


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
    """`node` with every table in `plan.truncate` replaced by that table cut to at most max_frequency rows per value
    of each join key: a row is dropped when, within the rows sharing one of its keys, a keyed hash of the whole row
    ranks it past that key's limit. Ties, which only identical rows can have, are broken by the row's text and then
    its physical identity, so every key's ranking follows one total order and two keys never drop two different
    copies of a row where one would do. A row is identified by (tableoid, ctid): ctid alone repeats across the
    partitions of a partitioned table. Only the rows of over-full keys are ranked, so data within its bounds costs
    one grouping per key."""
    def swap(table: exp.Expression) -> exp.Expression:
        if not isinstance(table, exp.Table) or table.name not in plan.truncate:
            return table
        name = to_sql(exp.to_identifier(table.name))
        # the row's text, not hash_record_extended: a table may hold types without a hash function (json)
        order = f"hashtextextended(dpsql_r::text, {int(hash_seed)}), dpsql_r::text, dpsql_r.tableoid, dpsql_r.ctid"
        excess = []
        for column, frequency in plan.truncate[table.name]:
            key = to_sql(exp.to_identifier(column))
            excess.append(f"SELECT tableoid, ctid FROM (SELECT dpsql_r.tableoid, dpsql_r.ctid, ROW_NUMBER() OVER "
                          f"(PARTITION BY dpsql_r.{key} ORDER BY {order}) AS dpsql_rank FROM {name} AS dpsql_r "
                          f"WHERE dpsql_r.{key} IN "
                          f"(SELECT {key} FROM {name} GROUP BY {key} HAVING COUNT(*) > {frequency})) AS dpsql_x "
                          f"WHERE dpsql_rank > {frequency}")
        select = sqlglot.parse_one(f"SELECT * FROM {name} AS dpsql_t WHERE (dpsql_t.tableoid, dpsql_t.ctid) "
                                   f"NOT IN ({' UNION ALL '.join(excess)})", dialect=DIALECT)
        return exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier(table.alias_or_name)))
    return node.copy().transform(swap, copy=False)
