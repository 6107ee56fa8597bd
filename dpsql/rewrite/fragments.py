"""SQL pieces every rewrite strategy uses: the keyed hash, the per-unit select items, a measure's aggregate."""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis import Measure, Plan
from dpsql.analysis.clamps import number
from dpsql.analysis.plan import SELECTION_WEIGHT
from dpsql.sql import dialect, to_sql

UNITS = "dpsql_units"  # the column counting distinct units (or rows) per group


def units_item(plan: Plan, count: str = "COUNT(*)") -> str:
    """The select item counting each group's units for partition selection, or 0 where nothing selects the
    groups (the column is read only there): the count cost an ungrouped SUM over 100,000 people 6% of its time."""
    return f"{count if plan.partition_selection else '0'} AS {UNITS}"


def sql(node: exp.Expression) -> str:
    return to_sql(node)


def group_by(names: list[str]) -> str:
    return f" GROUP BY {', '.join(names)}" if names else ""


def unit_and_keys(plan: Plan) -> list[str]:
    """The select items every per-unit query starts with: the unit's id and the group keys."""
    return [f"{sql(plan.unit)} AS dpsql_unit", *(f"{sql(k.expr)} AS {k.name}" for k in plan.group_keys)]


def keyed_hash(columns: list[str], seed: int) -> str:
    """A deterministic, seeded hash of some columns (the unit among them): picks which rows or groups a unit
    keeps (`dialect.KEYED_HASH`). It must hash the tuple as one value, so that its values are independent across
    units: ranking a unit's groups by PostgreSQL's hash_record_extended(ROW(unit, g)), which is 31·h(unit) + h(g),
    gave every unit a rotation of one order of the groups, dropped the same quarters for nearly everyone and
    invented trends (4 quarters, 5,000 units: first for 538, 2,032, 782 and 1,648 units, against about 1,250 each
    now). Distinct tuples hash alike only by a 64-bit collision, after which callers order by the values
    themselves."""
    return f"{dialect.KEYED_HASH}({int(seed)}, {', '.join(columns)})"


def within_rows_per_unit(columns: list[str], k: int, seed: int, in_unit_order: bool = False) -> list[str]:
    """CTEs over `dpsql_rows` (with `columns`, dpsql_unit among them) ending in `dpsql_kept`: at most k rows of
    each unit over all its groups. A unit with more has its rows ranked by a keyed hash of the whole row and cut
    at k (rows that tie are identical, so which one is kept makes no difference). Only those units' rows are
    ranked, so data within its bounds costs one grouping by unit (in the index's order, `in_order_of_units`)."""
    names = ", ".join(columns)
    return [*_over(k, None, in_unit_order), f"dpsql_kept AS (SELECT {names} FROM dpsql_rows WHERE NOT EXISTS "
            "(SELECT 1 FROM dpsql_over WHERE dpsql_over.dpsql_unit = dpsql_rows.dpsql_unit) "
            f"UNION ALL SELECT {names} FROM ({_ranked_rows_of_over(columns, seed)}) AS dpsql_ranked_rows "
            f"WHERE dpsql_rank <= {int(k)})"]


def ranked_rows_of_over(columns: list[str], k: int, seed: int, distinct: bool = False,
                        heavier: str | None = None, in_unit_order: bool = False, sizes: bool = False) -> list[str]:
    """CTEs over `dpsql_rows` ending in `dpsql_ranked`: the rows of the units with more than k rows, each with
    its `dpsql_rank` by the keyed hash that `within_rows_per_unit` cuts at, for statistics that correct the
    aggregate over all rows by those units' rows alone. `distinct`: their distinct rows are ranked (a unit then
    keeps k distinct rows; only a unit with more than k rows can have more than k distinct ones). `heavier`:
    a condition on a unit's rows (`SUM(m1) > 500`) that also makes its rows ranked (its total to be bounded).
    `in_unit_order`: the units are grouped in the index's order (`in_order_of_units`). `sizes`: also
    `dpsql_sizes`, every unit with its rows' weight in partition selection (`dpsql_share`), from the same
    grouping."""
    return [*_over(k, heavier, in_unit_order, sizes),
            f"dpsql_ranked AS ({_ranked_rows_of_over(columns, seed, distinct)})"]


def in_order_of_units(in_unit_order: bool) -> str:
    """` ORDER BY dpsql_unit` after a grouping by unit, where an index leads with the unit's column: PostgreSQL
    then reads the units in the index's order instead of hashing them all, which its planner prices as cheaper
    and which is not (with 90,000 units over 4MB of work_mem the hash spills to disk): on the peers' data the race
    for COUNT(*) of visits takes 30 ms instead of 77, the declared SUM(amount) 48 ms instead of 83."""
    return " ORDER BY dpsql_unit" if in_unit_order else ""


def _over(k: int, heavier: str | None = None, in_unit_order: bool = False, sizes: bool = False) -> list[str]:
    """`dpsql_over`, the units with more than k rows (or `heavier`); with `sizes`, from `dpsql_sizes`: every
    unit with whether it is over and what each of its kept rows weighs in partition selection (`dpsql_share`,
    SELECTION_WEIGHT // its kept rows: the weights of its at most k kept rows add up to at most SELECTION_WEIGHT;
    computed once a unit, in a double, whose quotient of integers below 2^53 floors exactly)."""
    # MATERIALIZED: the few units over k are found once and read by every branch (inlined, each would group again)
    over = f"COUNT(*) > {int(k)}{f' OR {heavier}' if heavier else ''}"
    if sizes:
        share = f"CAST(FLOOR(CAST({SELECTION_WEIGHT} AS DOUBLE PRECISION) / LEAST(COUNT(*), {int(k)})) AS BIGINT)"
        grouped = (f"SELECT dpsql_unit, {share} AS dpsql_share, {over} AS dpsql_is_over FROM dpsql_rows "
                   f"GROUP BY dpsql_unit{in_order_of_units(in_unit_order)}")
        return [f"dpsql_sizes AS MATERIALIZED ({grouped})",
                "dpsql_over AS (SELECT dpsql_unit FROM dpsql_sizes WHERE dpsql_is_over)"]
    if not in_unit_order:
        return [f"dpsql_over AS MATERIALIZED (SELECT dpsql_unit FROM dpsql_rows GROUP BY dpsql_unit HAVING {over})"]
    grouped = f"SELECT dpsql_unit, {over} AS dpsql_is_over FROM dpsql_rows GROUP BY dpsql_unit"
    # in order, behind OFFSET 0: pushed in as a HAVING, the condition would make PostgreSQL hash the units again
    found = f"SELECT * FROM ({grouped}{in_order_of_units(True)} OFFSET 0) AS dpsql_sizes WHERE dpsql_is_over"
    return [f"dpsql_over AS MATERIALIZED (SELECT dpsql_unit FROM ({found}) AS dpsql_found)"]


def _ranked_rows_of_over(columns: list[str], seed: int, distinct: bool = False) -> str:
    names = ", ".join(columns)
    rows = (f"(SELECT DISTINCT {names} FROM dpsql_rows WHERE dpsql_unit IN (SELECT dpsql_unit FROM dpsql_over)) "
            "AS dpsql_rows" if distinct else "dpsql_rows WHERE dpsql_unit IN (SELECT dpsql_unit FROM dpsql_over)")
    return f"SELECT {names}, {rank_within_unit(columns, seed)} FROM {rows}"


def rank_within_unit(columns: list[str], seed: int) -> str:
    """`dpsql_rank`: a row's place among its unit's rows by the keyed hash of `columns` (ties: identical rows),
    the order in which a unit's rows are kept up to a bound."""
    return (f"ROW_NUMBER() OVER (PARTITION BY dpsql_unit ORDER BY {keyed_hash(columns, seed)}, {', '.join(columns)}) "
            "AS dpsql_rank")


def present(node: exp.Expression) -> exp.Expression:
    """`node IS NOT NULL`."""
    return exp.Not(this=exp.Is(this=node.copy(), expression=exp.Null()))


def aggregate(measure: Measure, column: str | None) -> str:
    """The SQL aggregate of `measure` over `column`. A centred sum is taken as SUM(x) - c·COUNT(x): the same value
    in exact arithmetic, and both aggregates share their state with the query's other SUM(x) and COUNT(x)."""
    kind = measure.kind
    if kind == "sum":
        if measure.centre:
            return f"(SUM({column}) - {literal(measure.centre)} * COUNT({column}))"
        return f"SUM({column})"
    if kind == "distinct":
        return f"COUNT(DISTINCT {column})"
    return f"COUNT({column or '*'})"


def literal(value: float) -> str:
    """A number as SQL: integral values without a decimal point."""
    return sql(number(value))
