"""Strategy: a unit may hold several joined rows. Where the plan bounds a unit's rows over all groups
(`rows_total`), keep at most k of them (by keyed hash); sum per (unit, group), clamp each unit's totals to what
k rows could give, keep at most G groups per unit (by keyed hash) when the plan says so, then sum per group.
With k rows over all groups and no group cap, the kept rows are summed per group directly (the per-unit clamp
could not bind); counts of distinct units keep k of a unit's distinct groups instead of k of its rows (the same
sensitivity, k groups of 1 each, without dropping a group whose rows all ranked past k).

Where the plan bounds each unit's total of its sums over all groups (`unit_total`, chosen from the data), the
unit's per-group sums are scaled down together until they add up to the bound (`_scaled_to_total`).

Where partition selection counts rows (`Plan.selects_on_weights`), each kept row weighs
SELECTION_WEIGHT // (its unit's kept rows), from the grouping that finds the units over k (`dpsql_sizes`): a
unit's rows weigh at most SELECTION_WEIGHT in all, in at most k groups.

Why it is sound: after the clamp, one unit moves each group's sum by at most its per-unit range, in at most
G groups: exactly the sensitivity the analysis computed; after the scaling, by the bound over all groups.
Rows without a unit are dropped (an outer join's NULL-extended rows, or children whose parent is missing), so
no row escapes the bound.
"""

from __future__ import annotations

from dpsql.analysis import Measure, Plan
from dpsql.analysis.plan import SELECTION_WEIGHT
from dpsql.rewrite.fragments import (
    UNITS,
    aggregate,
    group_by,
    in_order_of_units,
    keyed_hash,
    literal,
    present,
    rank_within_unit,
    ranked_rows_of_over,
    sql,
    unit_and_keys,
    units_item,
    within_rows_per_unit,
)
from dpsql.rewrite.truncation import rows_cte


def statistics(plan: Plan, hash_seed: int, in_unit_order: bool = False) -> str:
    """Per group: the keys, one exact sum per measure over the bounded per-unit totals, and the unit count.
    `in_unit_order`: an index leads with the unit's column, so the units are grouped in its order
    (`in_order_of_units`) where one grouping by unit alone finds them."""
    keys = [k.name for k in plan.group_keys]
    rows = [*unit_and_keys(plan), *(f"{sql(m.expr)} AS {m.name}" for m in plan.measures if _column(plan, m) == m.name)]
    per_unit = ["dpsql_unit", *keys]
    for m in plan.measures:
        total = aggregate(m, _column(plan, m)) if m.kind != "units" else None
        if m.kind == "units":
            per_unit.append(f"1 AS {m.name}")
        else:  # the unit's total, clamped to what k rows could give (then, under a bound on each unit's total, weighed
            # down with its other sums, `_scaled_to_total`: where its rows are not cut at k, the clamp is the bound
            # the sensitivity reads from k; the fuzzer's seed 114 moved a sum by its total, twice its sensitivity)
            lo, hi = (literal(v) for v in m.unit_range)
            per_unit.append(f"LEAST(GREATEST(COALESCE({total}, 0), {lo}), {hi}) AS {m.name}")
    ctes = [rows_cte(plan, rows, present(plan.unit), hash_seed)]
    rows_of_units = "dpsql_rows"
    if plan.rows_total:  # k rows per unit over all groups together
        columns = ["dpsql_unit", *keys, *(m.name for m in plan.measures if _column(plan, m) == m.name)]
        form = _rows_total_form(plan)
        if form == "weighed":
            heavier = f"SUM({_bounded_total(plan)}) > {literal(plan.unit_total)}"
            return _kept_rows_weighed(plan, columns, ctes + ranked_rows_of_over(
                columns, plan.rows_per_unit, hash_seed, heavier=heavier, in_unit_order=in_unit_order,
                sizes=plan.selects_on_weights))
        if form == "corrected":
            # distinct units read only which groups a unit is in: it keeps k of its groups, not k of its rows
            units_only = all(m.kind == "units" for m in plan.measures)
            return _all_rows_corrected(plan, ctes + ranked_rows_of_over(
                columns, plan.rows_per_unit, hash_seed, distinct=units_only, in_unit_order=in_unit_order,
                sizes=plan.selects_on_weights), units_only)
        ctes += within_rows_per_unit(columns, plan.rows_per_unit, hash_seed, in_unit_order)
        rows_of_units = "dpsql_kept"
        if form == "kept":
            return _kept_rows_per_group(plan, ctes)
    unit_order = in_order_of_units(in_unit_order and not keys)
    ctes.append(f"dpsql_per_unit AS (SELECT {', '.join(per_unit)} FROM {rows_of_units}"
                f"{group_by(['dpsql_unit', *keys])}{unit_order})")
    source, where = "dpsql_per_unit", ""
    if plan.unit_total is not None:
        ctes.append(_scaled_to_total(plan, keys))
        source = "dpsql_scaled"
    if plan.cap_groups:
        hashed = keyed_hash(["dpsql_unit", *keys], hash_seed)
        ctes.append(f"dpsql_capped AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY dpsql_unit ORDER BY {hashed}, "
                    f"{', '.join(keys)}) "
                    f"AS dpsql_rank FROM {source})")
        source, where = "dpsql_capped", f" WHERE dpsql_rank <= {plan.max_groups}"
    select = ", ".join([*keys, *(f"SUM({m.name}) AS {m.name}" for m in plan.measures), units_item(plan)])
    return f"WITH {', '.join(ctes)} SELECT {select} FROM {source}{where}{group_by(keys)}"


def _bounded_total(plan: Plan, per_unit: bool = False) -> str:
    """A row's value of what each unit's total is bounded for (`Plan.bounded_sums`): the one sum's column of
    `dpsql_rows`, or its sums' columns added up; `per_unit`: of `dpsql_per_unit`, whose sums are never NULL."""
    return _added([m.name if per_unit else _column(plan, m) for m in plan.bounded_sums], nullable=not per_unit)


def _added(values: list[str], nullable: bool = True) -> str:
    """One SQL value, or several added up (each NULL as 0 where `nullable`: SUM skips a NULL, + does not)."""
    if len(values) == 1:
        return values[0]
    return " + ".join(f"COALESCE({v}, 0)" if nullable else v for v in values)


def _fraction(cap: float) -> str:
    """The bound as the numerator of a weight, written with a decimal point: PostgreSQL's SUM of bigints is a
    numeric, but the types sqlglot gives it on the way to DuckDB are integers, and there an integral numerator
    made the weight an integer division (a weight of 0 for a heavy unit; the neighbour fuzzer's seed 2026)."""
    text = literal(cap)
    return text if any(c in text for c in ".eE") else f"{text}.0"


def _column(plan: Plan, measure: Measure) -> str | None:
    """The column of `dpsql_rows` that holds `measure`'s value (None: it has none, COUNT(*)). Measures of one
    expression, an AVG's count and sum, share the first one's, so that PostgreSQL computes it once a row."""
    return plan.shared_column.get(measure.name)


def _rows_total_form(plan: Plan) -> str:
    """The statement `statistics` writes where each unit keeps at most k rows over all groups (`Plan.rows_total`):
    "weighed" (`_kept_rows_weighed`), "corrected" (`_all_rows_corrected`), "kept" (`_kept_rows_per_group`), or
    "per unit" (a sum per unit and group, its groups capped)."""
    if plan.cap_groups:
        return "per unit"
    if plan.unit_total is not None:
        return "weighed" if plan.group_keys and plan.rows_counted_and_summed else "per unit"
    return "kept" if any(m.kind == "distinct" for m in plan.measures) else "corrected"


def _scaled_to_total(plan: Plan, keys: list[str]) -> str:
    """`dpsql_scaled`: each unit's per-group sums times one factor, min(1, cap / the unit's bounded total over all
    its groups, `Plan.bounded_sums`), so that total adds up to at most the cap over all groups
    (`Plan.unit_total`): the sensitivity of every group's sum together, however many groups the unit reaches,
    and of each sum that is part of it. A variance's plain sum takes its sum of squares' factor g, so it adds up
    to at most g·sqrt(n·S) <= sqrt(k·cap) over the unit's n <= k rows (Cauchy-Schwarz), the sensitivity the
    analysis gives it. Before, each sum was clamped per group and scaled by its own total: a person with 25
    visits on each of 4 days moved a plain sum by 4 times its sensitivity. The totals are non-negative (the
    analysis allows the bound only for sums of non-negative values); a unit whose total is 0 is kept as it is."""
    factor = (f"LEAST(1.0, {_fraction(plan.unit_total)} / NULLIF(SUM({_bounded_total(plan, per_unit=True)}) "
              "OVER (PARTITION BY dpsql_unit), 0))")
    scaled = [f"{m.name} * {factor} AS {m.name}" if m.kind == "sum" else m.name
              for m in plan.measures]  # counts keep their k rows over all groups
    return f"dpsql_scaled AS (SELECT {', '.join(['dpsql_unit', *keys, *scaled])} FROM dpsql_per_unit)"


def contributions(plan: Plan, hash_seed: int, caps: tuple[int, ...], totals: bool = False,
                  rows_caps: tuple[int, ...] = (), in_unit_order: bool = False, values: bool = False) -> str:
    """One row: for each cap τ, Σ over units of min(the unit's rows, τ), over the query's joined rows (FROM, JOIN,
    WHERE) with a unit: what R2T's race reads to choose the rows per unit (`mechanisms.race`). With `totals`,
    Σ over units of min(the unit's total of the plan's one sum, τ), the values clamped to their declared range
    (non-negative), to choose the bound on a unit's total. One unit moves each value by at most τ.

    Each τ sums over a few rows, not over every unit: rows are counted per unit, then units per row count (TPC-H
    Q12's 1.5 million orders have 7 counts: 0.9 s instead of 1.3 s); totals are banded between the caps
    (`width_bucket`: band j holds the totals in [τ_j, τ_j+1)), and min(total, τ_i) is the band's sum below τ_i
    and τ_i per unit from τ_i up (SUM(amount) of 90,000 people: 95 ms instead of 118 ms). With `rows_caps`, the
    same row then holds, after the totals' values, Σ over units of min(the unit's rows, τ) for each of those
    caps: the rows per unit of the counts beside the sum (`RaceToTheTop` for each), from the same per-unit pass
    (its cells: units by band and row count; 90,000 people: 67 ms instead of 90 ms).
    `in_unit_order`: the units are grouped in the order of an index that leads with their column
    (`in_order_of_units`). With `values`, the distinct values the plan's one COUNT(DISTINCT x) finds
    (`_distinct_values_kept`).
    """
    unit_order = in_order_of_units(in_unit_order)
    if values:
        return _distinct_values_kept(plan, hash_seed, caps)
    if totals:
        value = _added([sql(m.expr) for m in plan.bounded_sums])
        items = [f"{sql(plan.unit)} AS dpsql_unit", f"{value} AS dpsql_value"]
        thresholds = ", ".join(str(int(c)) for c in caps)
        ctes = [rows_cte(plan, items, present(plan.unit), hash_seed),
                f"dpsql_totals AS (SELECT COALESCE(SUM(dpsql_value), 0) AS dpsql_total"
                f"{', COUNT(*) AS dpsql_rows_of_unit' if rows_caps else ''} FROM dpsql_rows "
                f"GROUP BY dpsql_unit{unit_order})",
                # the counts beside the sum (an AVG's, a COUNT(*)) race their rows per unit from the same cells: one
                # pass over the units, none of them kept (a second reader would make PostgreSQL store them all)
                f"dpsql_bands AS (SELECT width_bucket(dpsql_total, ARRAY[{thresholds}]) AS dpsql_band, "
                f"{'dpsql_rows_of_unit, ' if rows_caps else ''}SUM(dpsql_total) AS dpsql_sum, COUNT(*) AS dpsql_units "
                f"FROM dpsql_totals GROUP BY {'1, 2' if rows_caps else '1'})"]
        sums = ", ".join(f"COALESCE(SUM(CASE WHEN dpsql_band < {band} THEN dpsql_sum ELSE {int(c)} * dpsql_units "
                         "END), 0)" for band, c in enumerate(caps, start=1))
        if not rows_caps:
            return f"WITH {', '.join(ctes)} SELECT {sums} FROM dpsql_bands"
        return (f"WITH {', '.join(ctes)} SELECT * FROM (SELECT {sums} FROM dpsql_bands) AS dpsql_total_race "
                f"CROSS JOIN (SELECT {_capped_sizes(rows_caps)} FROM dpsql_bands) AS dpsql_rows_race")
    ctes = [rows_cte(plan, [f"{sql(plan.unit)} AS dpsql_unit"], present(plan.unit), hash_seed),
            f"dpsql_sizes AS (SELECT COUNT(*) AS dpsql_rows_of_unit FROM dpsql_rows GROUP BY dpsql_unit{unit_order})",
            _sizes("dpsql_sizes")]
    return f"WITH {', '.join(ctes)} SELECT {_capped_sizes(caps)} FROM dpsql_counts"


def _distinct_values_kept(plan: Plan, hash_seed: int, caps: tuple[int, ...]) -> str:
    """One row: for each cap τ, how many distinct (group, value) pairs of the one COUNT(DISTINCT x) the rows each
    unit keeps at τ hold (`Plan.races_distinct_values`): the answer's own counts at τ, summed over its groups.
    Every unit's rows are ranked by the keyed hash that `within_rows_per_unit` cuts at, so a unit keeps the same
    rows here as in the answer; a pair is found at τ where its first rank over all units is at most τ. One unit
    moves each value by at most τ, one way: its rows ranked up to τ find at most τ pairs, and no other unit's
    ranks change. The differences between values are not counts of units (a unit can find early a pair others
    found later), so the race reads nothing else from them (`RaceToTheTop.counts_units`)."""
    (measure,) = plan.measures
    keys = [k.name for k in plan.group_keys]
    value = _column(plan, measure)
    columns = ["dpsql_unit", *keys, value]
    ranked = f"dpsql_ranked AS (SELECT {', '.join(columns)}, {rank_within_unit(columns, hash_seed)} FROM dpsql_rows)"
    firsts = (f"dpsql_firsts AS (SELECT MIN(dpsql_rank) AS dpsql_first FROM dpsql_ranked WHERE {value} IS NOT NULL "
              f"GROUP BY {', '.join([*keys, value])})")
    rows = rows_cte(plan, [*unit_and_keys(plan), f"{sql(measure.expr)} AS {value}"], present(plan.unit), hash_seed)
    found = ", ".join(f"COUNT(*) FILTER (WHERE dpsql_first <= {int(c)})" for c in caps)
    return f"WITH {rows}, {ranked}, {firsts} SELECT {found} FROM dpsql_firsts"


def _sizes(per_unit: str) -> str:
    """`dpsql_counts`: how many units hold each number of rows (`dpsql_rows_of_unit` of `per_unit`)."""
    return (f"dpsql_counts AS (SELECT dpsql_rows_of_unit, COUNT(*) AS dpsql_units FROM {per_unit} "
            "GROUP BY dpsql_rows_of_unit)")


def _capped_sizes(caps: tuple[int, ...]) -> str:
    """For each cap τ, Σ over units of min(the unit's rows, τ), from a table of row counts (`dpsql_rows_of_unit`)
    and how many units hold each (`dpsql_units`)."""
    return ", ".join(f"COALESCE(SUM(LEAST(dpsql_rows_of_unit, {int(c)}) * dpsql_units), 0)" for c in caps)


def answered_by_contributions(plan: Plan, totals: bool = False) -> bool:
    """Whether `contributions` already holds this plan's answer at each of its caps: the statement `statistics`
    makes for the plan bounded at τ rows per unit (or, with `totals`, at τ as each unit's total) returns one row
    whose one measure is Σ over units of min(the unit's rows or total, τ), the race's value at τ. True for an
    ungrouped plan with one measure and nothing else to read: COUNT(*) with rows bounded, or the sum whose totals
    the race bounds (non-negative values, so clamping the total below at 0 changes nothing). Such a query is
    answered from the race's own pass, without a second statement."""
    if plan.grouped or plan.histograms or plan.top_k is not None or plan.partition_selection or len(plan.measures) != 1:
        return False
    (measure,) = plan.measures
    if totals:
        return measure.kind == "sum" and measure.centre == 0 and measure.row_range.lo >= 0
    return measure.kind == "count" and measure.expr is None


def _kept_rows_per_group(plan: Plan, ctes: list[str]) -> str:
    """The sums per group straight from the kept rows. With at most k rows per unit over all groups, a unit's
    total in any group already lies in its per-unit range (k rows, each clamped to the row range), so the
    per-unit step and its clamp change nothing, and skipping them spares PostgreSQL one aggregate over every
    (unit, group) and its sort. Partition selection reads each group's kept rows (`Plan.selects_on_rows`)."""
    keys = [k.name for k in plan.group_keys]
    sums = [f"COUNT(DISTINCT dpsql_unit) AS {m.name}" if m.kind == "units"
            else f"{aggregate(m, _column(plan, m))} AS {m.name}" for m in plan.measures]
    return (f"WITH {', '.join(ctes)} SELECT {', '.join([*keys, *sums, units_item(plan)])} FROM "
            f"dpsql_kept{group_by(keys)}")


def _kept_rows_weighed(plan: Plan, columns: list[str], ctes: list[str]) -> str:
    """`_kept_rows_per_group` where each unit's total of the one sum is bounded over all groups
    (`Plan.unit_total`): the rows of the units within k rows and the bound are kept as they are (weight 1); the
    units over either (`ranked_rows_of_over` with `heavier`, few) keep their k lowest-ranked rows, with the sums'
    values weighed by min(1, bound / their kept total of the bounded sum), so a unit's bounded sums over all groups
    add up to at most the bound (and a variance's plain sum beside its sum of squares to what that allows). The
    values are non-negative, so a unit's sum in one group is at most its total and needs no clamp of
    its own. No aggregate per (unit, group), sort or window over every unit (the scaled form, `_scaled_to_total`,
    took 540 ms against 170 ms for visits by category at 100,000 people), and every row is added once: an
    aggregate over all rows less the heavy units' rows would lose the bound's precision to the cancellation
    of sums far larger than it (the neighbour fuzzer's heavy person moved a sum bounded at 1 by more than 1), so
    the sets of units are aggregated apart and added (visits by category at 100,000 people: 140 ms against 150
    ms for one aggregate over their rows with a weight each). With weights for partition selection
    (`Plan.selects_on_weights`), each part reads its rows' weight from `dpsql_sizes` (`fragments._over`)."""
    keys = [k.name for k in plan.group_keys]
    total, cap = _bounded_total(plan), _fraction(plan.unit_total)
    weighted = plan.selects_on_weights
    share = "SUM(dpsql_share)" if weighted else "COUNT(*)"

    def part(source: str, weighed: bool = False) -> str:
        """The statistics per group over one set of units' rows: each part is PostgreSQL's plain aggregate, and
        the parts' units are disjoint, so adding them up cancels nothing."""
        sums = [f"SUM({_column(plan, m)} * dpsql_weight)" if weighed and m.kind == "sum"
                else aggregate(m, _column(plan, m)) for m in plan.measures]
        items = [*keys, *(f"{s} AS {m.name}" for s, m in zip(sums, plan.measures, strict=True)),
                 units_item(plan, share)]
        return f"SELECT {', '.join(items)} FROM {source}{group_by(keys)}"

    if weighted:  # every unit's rows are in dpsql_sizes, with whether it is over either bound
        parts = [part("dpsql_rows JOIN dpsql_sizes USING (dpsql_unit) WHERE NOT dpsql_is_over")]
    else:
        parts = [part("dpsql_rows WHERE NOT EXISTS (SELECT 1 FROM dpsql_over WHERE dpsql_over.dpsql_unit = "
                      "dpsql_rows.dpsql_unit)")]
    ranked = "dpsql_ranked JOIN dpsql_sizes USING (dpsql_unit)" if weighted else "dpsql_ranked"
    weights = (f"SELECT {', '.join(columns)}, LEAST(1.0, {cap} / NULLIF(SUM({total}) OVER (PARTITION BY dpsql_unit), "
               f"0)) AS dpsql_weight{', dpsql_share' if weighted else ''} FROM {ranked} "
               f"WHERE dpsql_rank <= {int(plan.rows_per_unit)}")
    parts.append(part(f"({weights}) AS dpsql_weighed", weighed=True))
    # counts stay bigint: a sum of bigints would be numeric
    totals = [f"SUM({m.name}) AS {m.name}" if m.kind == "sum" else f"CAST(SUM({m.name}) AS BIGINT) AS {m.name}"
              for m in plan.measures]
    units = f"CAST(SUM({UNITS}) AS BIGINT)" if plan.partition_selection else "0"
    return (f"WITH {', '.join(ctes)} SELECT {', '.join([*keys, *totals, f'{units} AS {UNITS}'])} FROM "
            f"({' UNION ALL '.join(parts)}) AS dpsql_parts{group_by(keys)}")


def _all_rows_corrected(plan: Plan, ctes: list[str], units_only: bool = False) -> str:
    """`_kept_rows_per_group` for counts, sums and distinct units, which add up over disjoint sets of units:
    each group's statistics over all rows, less those over the rows of the units with more than k rows, plus
    those over the k rows each such unit keeps (for counts and sums, in one pass: less those over the rows
    such a unit drops). The first part is the exact query's own aggregate (PostgreSQL runs it in parallel);
    only the rows of units over k are ranked. A group left with no kept row is not
    returned, as by the other form, so partition selection never sees a group that only dropped rows held.
    `units_only`: the units over k keep k distinct groups, and what partition selection reads per group is its
    kept units, not rows (an over unit's rows beyond its kept groups would count otherwise). With weights for
    partition selection (`Plan.selects_on_weights`), the rows are read with their weight (`dpsql_sizes`), and
    the rows a unit over k drops take back the weight each of its rows had, SELECTION_WEIGHT // k."""
    keys = [k.name for k in plan.group_keys]
    sums = ["COUNT(DISTINCT dpsql_unit)" if m.kind == "units" else aggregate(m, _column(plan, m))
            for m in plan.measures]

    def part(source: str, sign: str, units: str | None = None) -> str:
        kept = f"{sign}{'COUNT(DISTINCT dpsql_unit)' if units_only else 'COUNT(*)'}"
        items = [*keys, *(f"{sign}{s} AS {m.name}" for s, m in zip(sums, plan.measures, strict=True)),
                 f"{units or kept} AS {UNITS}"]
        return f"SELECT {', '.join(items)} FROM {source}{group_by(keys)}"

    k = int(plan.rows_per_unit)
    if units_only or any(m.kind == "units" for m in plan.measures):  # distinct counts do not subtract row by row
        parts = [part("dpsql_rows", ""), part("dpsql_ranked", "-"), part(f"dpsql_ranked WHERE dpsql_rank <= {k}", "")]
    elif plan.selects_on_weights:  # (a unit over k: n > k, so each of its rows weighs as one of k)
        parts = [part("dpsql_rows JOIN dpsql_sizes USING (dpsql_unit)", "", "SUM(dpsql_share)"),
                 part(f"dpsql_ranked WHERE dpsql_rank > {k}", "-", f"-{SELECTION_WEIGHT // k} * COUNT(*)")]
    else:  # less the rows a unit over k drops: one pass over its ranked rows (Spark would rank them twice)
        parts = [part("dpsql_rows", ""), part(f"dpsql_ranked WHERE dpsql_rank > {k}", "-")]
    # counts stay bigint: a sum of bigints would be numeric
    totals = [f"SUM({m.name}) AS {m.name}" if m.kind == "sum" else f"CAST(SUM({m.name}) AS BIGINT) AS {m.name}"
              for m in plan.measures]
    units = f"CAST(SUM({UNITS}) AS BIGINT)" if plan.partition_selection else "0"
    having = f" HAVING SUM({UNITS}) > 0" if keys else ""
    return (f"WITH {', '.join(ctes)} SELECT {', '.join([*keys, *totals, f'{units} AS {UNITS}'])} FROM "
            f"({' UNION ALL '.join(parts)}) AS dpsql_parts{group_by(keys)}{having}")
