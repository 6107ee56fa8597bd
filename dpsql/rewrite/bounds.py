"""Strategy for the bounds' effect: how many of a query's units the declared bounds touch, so an analyst can see
how far the bounded answer may sit from the unbounded one (`SET dpsql.bounds_epsilon`).

One row of counts, every count a number of units: the units the query reads; those with more rows than the
plan keeps (their other rows are left out); those reaching more groups than it keeps; and, per clamped column,
those with a value outside its declared range (or NaN). Where each row is a whole unit, only the clamps apply.

Why it is sound: each count counts a unit at most once, so adding or removing a unit moves each by at most 1
(the L1 sensitivity of the row is its number of counts, which the caller prices). Nothing is read from the
data but these counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpsql.analysis import Plan
from dpsql.analysis.clamps import CLAMP
from dpsql.rewrite.fragments import group_by, literal, present, sql, unit_and_keys
from dpsql.rewrite.truncation import from_where
from dpsql.sql.dialect import Statement


@dataclass(frozen=True)
class BoundsStatement:
    statement: Statement  # one row: one count of units per label
    labels: list[str]


def effect(plan: Plan, hash_seed: int) -> BoundsStatement | None:
    """The statement counting the units the plan's bounds touch, or None when no bound can drop or move data."""
    clamps = _clamps(plan)
    if plan.unit is None and (not clamps or not _rows_are_units(plan)):
        return None
    outside = [f"{sql(node)} < {literal(lo)} OR {sql(node)} > {literal(hi)}" for node, lo, hi in clamps]
    labels = [f"with {sql(node)} outside [{literal(lo)}, {literal(hi)}] or NaN (clamped)" for node, lo, hi in clamps]
    flags = [f"CASE WHEN {condition} THEN 1 ELSE 0 END AS dpsql_c{i}" for i, condition in enumerate(outside)]
    if plan.unit is None:  # each row is one unit: nothing is truncated
        counts = ["COUNT(*)", *(f"SUM(CASE WHEN {c} THEN 1 ELSE 0 END)" for c in outside)]
        return BoundsStatement(Statement.parse(f"SELECT {', '.join(counts)} {from_where(plan, None, hash_seed)}"),
                               ["units (rows) read", *labels])
    keys = [k.name for k in plan.group_keys]
    rows = f"SELECT {', '.join([*unit_and_keys(plan), *flags])} {from_where(plan, present(plan.unit), hash_seed)}"
    marks = [f"MAX(dpsql_c{i}) AS dpsql_c{i}" for i in range(len(clamps))]
    per_group = f"SELECT dpsql_unit, COUNT(*) AS dpsql_n{''.join(', ' + m for m in marks)} FROM dpsql_rows" \
                f"{group_by(['dpsql_unit', *keys])}"
    per_unit = ["SUM(dpsql_n) AS dpsql_n", "MAX(dpsql_n) AS dpsql_most", "COUNT(*) AS dpsql_groups", *marks]
    k = int(plan.rows_per_unit)
    over_rows = "dpsql_n" if plan.rows_total else "dpsql_most"
    counts = ["COUNT(*)", f"COUNT(*) FILTER (WHERE {over_rows} > {k})"]
    per = " in a group" if keys and not plan.rows_total else ""
    labels = ["units read", f"with more than {k} rows{per} (the rest left out)",
              *labels]
    if plan.cap_groups:
        counts.append(f"COUNT(*) FILTER (WHERE dpsql_groups > {int(plan.max_groups)})")
        labels.insert(2, f"in more than {int(plan.max_groups)} groups (the others left out)")
    counts += [f"SUM(dpsql_c{i})" for i in range(len(clamps))]
    text = (f"WITH dpsql_rows AS ({rows}), dpsql_per_group AS ({per_group}), dpsql_per_unit AS "
            f"(SELECT dpsql_unit, {', '.join(per_unit)} FROM dpsql_per_group GROUP BY dpsql_unit) "
            f"SELECT {', '.join(counts)} FROM dpsql_per_unit")
    return BoundsStatement(Statement.parse(text), labels)


def _rows_are_units(plan: Plan) -> bool:
    """Whether each row the plan reads is one unit that no other unit's change can bring in or out: one table,
    no truncation, no subquery in WHERE (a semi-join on another private table lets one of its rows move many
    of these; the fuzzer found that the counts then moved by 6)."""
    where_reads = plan.where is not None and plan.where.find(exp.Select) is not None
    return not plan.joins and not plan.truncate and plan.stability in (None, 1) and not where_reads


def _clamps(plan: Plan) -> list[tuple[exp.Expression, float, float]]:
    """Each distinct (value, lo, hi) that the plan's measures and histograms clamp to a declared range."""
    found: dict[str, tuple[exp.Expression, float, float]] = {}
    trees = [m.expr for m in plan.measures if m.expr is not None] + [h.cell for h in plan.histograms]
    for tree in trees:
        for node in tree.walk():
            if CLAMP in node.meta:
                value, lo, hi = node.meta[CLAMP]
                found.setdefault(f"{sql(value)} {lo} {hi}", (value, lo, hi))
    return list(found.values())
