"""The SQL that runs on PostgreSQL: exact per-group statistics over bounded data.

`rewrite` is the stage's one public entry. Its query returns, per group, the group keys, one exact sum per
measure and the number of distinct units, with every bound of the plan enforced in the SQL itself:
- every per-row value is clamped to its range (done by the analysis' guarded expressions);
- unless each row already is one whole unit (a unique constraint guarantees it), rows are first summed per
  unit and each unit's total is clamped to what k rows could give, which is cheaper and keeps more data
  than sampling k rows;
- when a unit may touch more groups than allowed, it keeps the groups whose keyed hash ranks lowest
  (`hashtextextended`, never random(), so the same data always gives the same bounded table).
Percentiles, MIN and MAX get a second query per histogram: counts per (group, cell), each unit keeping at most
k rows per group and G groups, chosen by the same keyed hash.
The SQL is generated from the analysed tree, never from the analyst's text.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from dpsql.analysis import Histogram, Measure, Plan
from dpsql.sql import DIALECT

UNITS = "dpsql_units"


@dataclass(frozen=True)
class Rewritten:
    sql: str  # rows: group keys, one exact sum per measure, distinct units
    histograms: dict[str, str]  # histogram name -> SQL whose rows are: group keys, cell, count


def rewrite(plan: Plan, hash_seed: int = 0) -> Rewritten:
    """The bounded, exact aggregation queries for `plan`."""
    sql = _direct(plan, hash_seed) if plan.unit is None else _per_unit(plan, hash_seed)
    return Rewritten(sql, {h.name: _histogram(plan, h, hash_seed) for h in plan.histograms})


def _sql(node: exp.Expression) -> str:
    return node.sql(dialect=DIALECT)


def _from_where(plan: Plan, extra: exp.Expression | None = None, hash_seed: int = 0) -> str:
    def read(node: exp.Expression) -> str:
        return _sql(_truncated(node, plan, hash_seed) if plan.truncate else node)

    parts = [read(plan.from_)] + [read(j) for j in plan.joins]
    conditions = [c for c in (plan.where, extra) if c is not None]  # subqueries in WHERE read their tables whole
    if conditions:
        parts.append("WHERE " + " AND ".join(f"({_sql(c)})" for c in conditions))
    return " ".join(parts)


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
        name = exp.to_identifier(table.name).sql(dialect=DIALECT)
        # the row's text, not hash_record_extended: a table may hold types without a hash function (json)
        order = f"hashtextextended(dpsql_r::text, {int(hash_seed)}), dpsql_r::text, dpsql_r.tableoid, dpsql_r.ctid"
        excess = []
        for column, frequency in plan.truncate[table.name]:
            key = exp.to_identifier(column).sql(dialect=DIALECT)
            excess.append(f"SELECT tableoid, ctid FROM (SELECT dpsql_r.tableoid, dpsql_r.ctid, ROW_NUMBER() OVER "
                          f"(PARTITION BY dpsql_r.{key} ORDER BY {order}) AS dpsql_rank FROM {name} AS dpsql_r "
                          f"WHERE dpsql_r.{key} IN "
                          f"(SELECT {key} FROM {name} GROUP BY {key} HAVING COUNT(*) > {frequency})) AS dpsql_x "
                          f"WHERE dpsql_rank > {frequency}")
        select = sqlglot.parse_one(f"SELECT * FROM {name} AS dpsql_t WHERE (dpsql_t.tableoid, dpsql_t.ctid) "
                                   f"NOT IN ({' UNION ALL '.join(excess)})", dialect=DIALECT)
        return exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier(table.alias_or_name)))
    return node.copy().transform(swap, copy=False)


def _group_by(names: list[str]) -> str:
    return f" GROUP BY {', '.join(names)}" if names else ""


def _direct(plan: Plan, hash_seed: int) -> str:
    """Each row is one whole unit: aggregate directly (the per-row clamps already bound each unit)."""
    keys = [f"{_sql(k.expr)} AS {k.name}" for k in plan.group_keys]
    sums = [f"{_aggregate(m, None if m.expr is None else _sql(m.expr))} AS {m.name}" for m in plan.measures]
    select = ", ".join([*keys, *sums, f"COUNT(*) AS {UNITS}"])
    group_by = _group_by([str(i + 1) for i in range(len(keys))])
    return f"SELECT {select} {_from_where(plan, hash_seed=hash_seed)}{group_by}"


def _per_unit(plan: Plan, hash_seed: int) -> str:
    """Sum per (unit, group), clamp each unit's totals, cap the groups per unit, then sum per group."""
    keys = [k.name for k in plan.group_keys]
    rows = [*_unit_and_keys(plan), *(f"{_sql(m.expr)} AS {m.name}" for m in plan.measures if m.expr is not None)]
    per_unit = ["dpsql_unit", *keys]
    for m in plan.measures:
        if m.kind == "units":
            per_unit.append(f"1 AS {m.name}")
        else:  # the unit's total, clamped to what k rows could give
            lo, hi = (_number(v) for v in m.unit_range)
            total = _aggregate(m, None if m.expr is None else m.name)
            per_unit.append(f"LEAST(GREATEST(COALESCE({total}, 0), {lo}), {hi}) AS {m.name}")
    ctes = [f"dpsql_rows AS (SELECT {', '.join(rows)} {_from_where(plan, _present(plan.unit), hash_seed)})",
            f"dpsql_per_unit AS (SELECT {', '.join(per_unit)} FROM dpsql_rows"
            f"{_group_by(['dpsql_unit', *keys])})"]
    source, where = "dpsql_per_unit", ""
    if plan.cap_groups:
        hashed = _keyed_hash(["dpsql_unit", *keys], hash_seed)
        ctes.append(f"dpsql_capped AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY dpsql_unit ORDER BY {hashed}, "
                    f"{', '.join(keys)}) "
                    "AS dpsql_rank FROM dpsql_per_unit)")
        source, where = "dpsql_capped", f" WHERE dpsql_rank <= {plan.max_groups}"
    select = ", ".join([*keys, *(f"SUM({m.name}) AS {m.name}" for m in plan.measures), f"COUNT(*) AS {UNITS}"])
    return f"WITH {', '.join(ctes)} SELECT {select} FROM {source}{where}{_group_by(keys)}"


def _histogram(plan: Plan, histogram: Histogram, hash_seed: int) -> str:
    """Counts per (group, cell), each unit keeping at most `histogram.rows` rows per group and at most
    `plan.max_groups` groups, both chosen by keyed hash."""
    keys = [k.name for k in plan.group_keys]
    cell_present = _present(histogram.cell)
    group_by = _group_by([str(i + 1) for i in range(len(keys) + 1)])
    if plan.unit is None:  # each row is a whole unit: nothing to bound
        select = ", ".join([*(f"{_sql(k.expr)} AS {k.name}" for k in plan.group_keys),
                            f"{_sql(histogram.cell)} AS dpsql_cell", "COUNT(*) AS dpsql_count"])
        return f"SELECT {select} {_from_where(plan, cell_present, hash_seed)}{group_by}"
    rows = [*_unit_and_keys(plan), f"{_sql(histogram.cell)} AS dpsql_cell"]
    unit_and_keys = ", ".join(["dpsql_unit", *keys])
    ranks = [f"ROW_NUMBER() OVER (PARTITION BY {unit_and_keys} ORDER BY "
             f"{_keyed_hash(['dpsql_unit', *keys, 'dpsql_cell'], hash_seed)}, dpsql_cell) AS dpsql_row"]
    keep = [f"dpsql_row <= {histogram.rows}"]
    if plan.cap_groups:
        ranks.append(f"DENSE_RANK() OVER (PARTITION BY dpsql_unit ORDER BY "
                     f"{_keyed_hash(['dpsql_unit', *keys], hash_seed)}, {', '.join(keys)}) "
                     "AS dpsql_group")
        keep.append(f"dpsql_group <= {plan.max_groups}")
    both = exp.and_(_present(plan.unit), cell_present)
    return (f"WITH dpsql_rows AS (SELECT {', '.join(rows)} {_from_where(plan, both, hash_seed)}), "
            f"dpsql_ranked AS (SELECT *, {', '.join(ranks)} FROM dpsql_rows) "
            f"SELECT {', '.join([*keys, 'dpsql_cell', 'COUNT(*) AS dpsql_count'])} FROM dpsql_ranked "
            f"WHERE {' AND '.join(keep)}{group_by}")


def _unit_and_keys(plan: Plan) -> list[str]:
    """The select items every per-unit query starts with: the unit's id and the group keys."""
    return [f"{_sql(plan.unit)} AS dpsql_unit", *(f"{_sql(k.expr)} AS {k.name}" for k in plan.group_keys)]


def _keyed_hash(columns: list[str], seed: int) -> str:
    """A deterministic, seeded hash of some columns: picks which rows or groups a unit keeps. It hashes the row
    value field by field, by position, with NULL apart from '', so distinct tuples hash alike only by a 64-bit
    collision, after which callers order by the values themselves (concat_ws skipped NULLs: ('lab', NULL) and
    (NULL, 'lab') tied, and the plan broke the tie). Every type a schema declares has a hash function."""
    return f"hash_record_extended(ROW({', '.join(columns)}), {int(seed)})"


def _present(node: exp.Expression) -> exp.Expression:
    return exp.Not(this=exp.Is(this=node.copy(), expression=exp.Null()))


def _aggregate(measure: Measure, column: str | None) -> str:
    """The SQL aggregate of `measure` over `column`. A centred sum is taken as SUM(x) - c·COUNT(x): the same value
    in exact arithmetic, and both aggregates share their state with the query's other SUM(x) and COUNT(x)."""
    kind = measure.kind
    if kind == "sum":
        if measure.centre:
            return f"(SUM({column}) - {_number(measure.centre)} * COUNT({column}))"
        return f"SUM({column})"
    if kind == "distinct":
        return f"COUNT(DISTINCT {column})"
    return f"COUNT({column or '*'})"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
