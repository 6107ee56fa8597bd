"""Strategy for quantiles, MIN, MAX and mode(): exact counts per (group, cell) of a histogram, each unit keeping
at most `histogram.rows` rows per group and at most G groups, both chosen by keyed hash.

Why it is sound: with those caps one unit moves at most k counts in each of at most G groups, which bounds
how far any candidate's score moves (the histogram's sensitivity). Rows whose cell is NULL (a NULL value)
count nowhere, as in PostgreSQL's own aggregates.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis import Histogram, Plan
from dpsql.rewrite.fragments import group_by, keyed_hash, present, sql, unit_and_keys, within_rows_per_unit
from dpsql.rewrite.truncation import from_where, rows_cte


def counts(plan: Plan, histogram: Histogram, hash_seed: int) -> str:
    """Rows of (group keys, cell, count) for `histogram`."""
    keys = [k.name for k in plan.group_keys]
    cell_present = present(histogram.cell)
    grouping = group_by([str(i + 1) for i in range(len(keys) + 1)])
    if plan.unit is None:  # each row is a whole unit: nothing to bound
        select = ", ".join([*(f"{sql(k.expr)} AS {k.name}" for k in plan.group_keys),
                            f"{sql(histogram.cell)} AS dpsql_cell", "COUNT(*) AS dpsql_count"])
        return f"SELECT {select} {from_where(plan, cell_present, hash_seed)}{grouping}"
    rows = [*unit_and_keys(plan), f"{sql(histogram.cell)} AS dpsql_cell"]
    unit_and_key_names = ", ".join(["dpsql_unit", *keys])
    ranks = [f"ROW_NUMBER() OVER (PARTITION BY {unit_and_key_names} ORDER BY "
             f"{keyed_hash(['dpsql_unit', *keys, 'dpsql_cell'], hash_seed)}, dpsql_cell) AS dpsql_row"]
    keep = [f"dpsql_row <= {histogram.rows}"]
    if plan.cap_groups:
        ranks.append(f"DENSE_RANK() OVER (PARTITION BY dpsql_unit ORDER BY "
                     f"{keyed_hash(['dpsql_unit', *keys], hash_seed)}, {', '.join(keys)}) "
                     "AS dpsql_group")
        keep.append(f"dpsql_group <= {plan.max_groups}")
    both = exp.and_(present(plan.unit), cell_present)
    ctes = [rows_cte(plan, rows, both, hash_seed)]
    rows_of_units = "dpsql_rows"
    if plan.rows_total:  # k rows per unit over all groups together: the histogram's k, at most the plan's
        ctes += within_rows_per_unit(["dpsql_unit", *keys, "dpsql_cell"], histogram.rows, hash_seed)
        rows_of_units = "dpsql_kept"
    return (f"WITH {', '.join(ctes)}, dpsql_ranked AS (SELECT *, {', '.join(ranks)} FROM {rows_of_units}) "
            f"SELECT {', '.join([*keys, 'dpsql_cell', 'COUNT(*) AS dpsql_count'])} FROM dpsql_ranked "
            f"WHERE {' AND '.join(keep)}{grouping}")
