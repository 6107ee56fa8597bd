"""Bounds chosen from the data (`dpsql.rows_per_unit = auto`): which of R2T's races a plan gets, at what share of
the query's ε, and what explain says of it. The engine runs the race and answers at the bound it chooses."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import astuple

from dpsql.accounting import Cost
from dpsql.analysis import SQUARED, Plan
from dpsql.mechanisms.race import EFFECT_SHARE, FALLBACK_SHARE, MARGIN, RAISE_SHARE, RaceToTheTop
from dpsql.noise import Calibration
from dpsql.session import Options

RACE_SHARE = 0.2  # of a query's ε, spent choosing its rows per unit when asked to (dpsql.rows_per_unit = auto)


def plan_race(plan: Plan, options: Options, share: float = RACE_SHARE) -> RaceToTheTop | None:
    """R2T's race for the rows per unit of `plan`, when the options ask for it and the plan bounds a unit's rows
    (a per-unit stage with more than one row allowed; row-level joins and locally randomized keys keep the
    declared bound). The race reads the query's joined rows whatever it computes from them, so quantiles and
    top-k selections beside counts or sums take its bound as they do: the chosen τ is public before the answer
    runs. Values chosen alone run no race (`chosen_values_rows`)."""
    if not raceable(plan, options) or not plan.measures:  # values chosen alone keep `chosen_values_rows`
        return None
    if not plan.grouped and not plan.histograms and all(m.kind == "units" for m in plan.measures):
        return None  # an ungrouped count of units: each adds at most 1, whatever its rows
    steps = 2 if plan.neighbouring == "replace" else 1
    if plan.unit_total is not None:  # the race's cap: a unit's declared rows times the largest value, each sum
        cap = math.ceil(sum(min(m.unit_range[1], m.natural_total or m.unit_range[1]) for m in plan.bounded_sums))
        squares = plan.bounded_sums[0].squares_of is not None
        return RaceToTheTop.calibrate(cap, options.epsilon * share, steps, integer_valued=False,
                                      margin=SQUARES_MARGIN if squares else TOTALS_MARGIN,
                                      many_cells_margin=SQUARES_MARGIN // 2 if squares else MANY_CELLS_TOTALS_MARGIN)
    if plan.rows_per_unit <= 1:
        return None
    return RaceToTheTop.calibrate(plan.rows_per_unit, options.epsilon * share, steps, margin=MARGIN,
                                  counts_units=not (plan.races_distinct_values
                                                    and values_resolvable(plan, options.epsilon * share)))


def values_resolvable(plan: Plan, epsilon: float) -> bool:
    """Whether a race at `epsilon` over the distinct values that `plan`'s one COUNT(DISTINCT x) finds
    (`Plan.races_distinct_values`) could resolve them: not where the public domains allow fewer (group, value)
    pairs than it needs (`RaceToTheTop.may_resolve`: days with a visit, 366 at most, would need over 1,000 at
    ε = 1), where it would keep the cap. The race over rows then chooses, and the values lose no more than it
    weighs: a value found beyond τ rows is held by a row beyond τ."""
    pairs = plan.distinct_pairs
    steps = 2 if plan.neighbouring == "replace" else 1
    return pairs is None or RaceToTheTop.calibrate(plan.rows_per_unit, epsilon, steps).may_resolve(pairs)


# The counts beside a raced sum that only divide it (an AVG's or a variance's, with no COUNT answered and no
# partition selection) keep the chosen τ itself, no margin, in an answer of more than FEW_CELLS cells: a unit's
# rows beyond it leave the numerator and the denominator together, so the cut moves the ratio only where a heavy
# unit's values differ from the rest, while the margin's noise in the count moves it in every answer. Measured on
# the demo data at ε = 1 (/tmp scripts of the session): AVG(amount) by day over 100,000 people went from 19.8% to
# 14.6% median error (8 answers of 366 days, median bias -1.8% and 0.0%, coverage 95% and 96%), by category over
# 20,000 people from 3.5% to 2.5-2.8% (30 and 60 answers, coverage 94-96%). An answer of few cells keeps MARGIN:
# its noise is small beside that difference, and without the margin the ungrouped AVG(amount) over 20,000 people
# went from 0.56% to 0.87% median error, stddev(amount) from 2.2% to 3.1% with 92% coverage (bench_accuracy.py).
# Values computed from a unit's rows (`Plan.unit_row_values`: each visit's share of its person's spending, the
# amount of their visit before) differ in heavy units by construction, so those keep MARGIN: the average share of a
# person's spending by category over 20,000 demo people went from 7.8% median error, +7.0% bias and 41% coverage
# to 2.1%, +0.3% and 94% (ε = 1, 20 answers of 8 cells each, /tmp scripts of the session).
def counts_race(totals: Plan, epsilon: float, steps: int) -> RaceToTheTop:
    """R2T's race for the rows per unit of the counts beside a sum whose units' totals race
    (`Prepared.rows_race`), over `totals`' declared rows at `epsilon`: MARGIN times its τ, or beyond FEW_CELLS
    cells the τ itself where the counts only divide the sums (`divides_only`) of values not computed from the
    unit's rows."""
    alone = divides_only(totals) and not totals.unit_row_values
    return RaceToTheTop.calibrate(totals.rows_per_unit, epsilon, steps, margin=MARGIN,
                                  many_cells_margin=1 if alone else None)


def divides_only(plan: Plan) -> bool:
    """Whether the plan's counts are only the denominators of its averages and variances: no count answered
    alone or beside them, and no partition selection (which counts a unit's rows toward its groups)."""
    counts = {m.name for m in plan.measures if m.kind == "count"}
    return bool(counts) and not plan.partition_selection and all(
        a.kind in ("avg", *SQUARED) for a in plan.aggregates if counts & set(a.measures))


def visible_cut(calibration: Calibration, cells: int | None, steps: int) -> float:
    """How many units over a bound, each holding at least the bound more, cut more than the answer's noise can
    hide: the 95% half-width of that noise on the answer's total over its `cells` cells (one where its keys are
    private), in bounds. From the calibration at the declared caps (a mechanism's half-width is proportional to
    its sensitivity) and the cells: both known before the data."""
    per_bound = min((m.ci_halfwidth() / m.sensitivity for m in calibration.mechanisms.values()), default=math.inf)
    return steps * per_bound * math.sqrt(cells or 1)


def lent(calibration: Calibration, share: float) -> float:
    """The ε an answer lends the race's choice (the fallback's search, the units over its bound): `share` of its
    own, and no more than keeps `share` of its ρ. The choice is pure ε-DP, ε²/2 in the zCDP account; a Gaussian
    answer's ρ is far below its ε²/2, so lending it `share` of its ε would take more than its ρ there."""
    cost = calibration.cost
    return min(share * cost.epsilon, math.sqrt(2 * share * cost.rho))


def kept_epsilon(charged: Cost, spent: float, calibrated: Callable[[float], Calibration]) -> float:
    """The ε an answer keeps once `spent` (pure ε, lent to the race's choice) is gone: the largest ε', at most
    charged ε − `spent`, whose calibration (`calibrated(ε')`) beside `spent` costs no more than `charged` in
    either account. Basic composition alone would allow ε − `spent`; in the zCDP account the parts of an answer
    split into many (its measures, its partition selection) cost Σε_i²/2, which `spent`²/2 may exceed what taking
    `spent` from them saves (eight measures at ε = 0.8: ρ 0.04 charged, 0.0425 had the fallback's 0.2 been
    taken from them)."""
    def fits(epsilon: float) -> bool:
        cost = calibrated(epsilon).cost + Cost.pure(spent)
        return all(a <= b * (1 + 1e-12) for a, b in zip(astuple(cost), astuple(charged), strict=True))
    high = charged.epsilon - spent
    if high <= 0 or fits(high):
        return max(high, 0.0)
    low = 0.0
    for _ in range(50):  # ρ grows with ε: bisect to a relative precision far below the noise's
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def raceable(plan: Plan, options: Options) -> bool:
    """Whether a bound may be chosen from the data: asked for, and a per-unit stage to enforce it (row-level joins
    and locally randomized keys keep the declared bounds)."""
    return (options.rows_per_unit == "auto" and (plan.unit is not None or plan.reads_units_table)
            and plan.stability is None and not plan.local_key)


# A plan of values chosen from histograms only (percentiles, MIN, MAX, mode()) runs no race: it keeps at most
# CHOSEN_ROWS rows per unit, or the declared bound where smaller (`chosen_values_rows`). A chosen value's error is
# its rank error: one unit moves each rank by at most its k rows, so the exponential mechanism's error in ranks
# grows as k/ε, and as a share of the Q(k) = Σ_u min(c_u, k) rows kept it grows with k for any data (Q(k)/k only
# falls). Truncation costs a chosen value little: a unit's rows beyond k go in the keyed hash's order, a sample
# of its rows, which moves a quantile only where a heavy unit's values differ from a light one's. So a small k is
# best for the noise, and a few rows each cut the error of sampling one row per unit; the rank interval covers
# the noise, not that sample, so k must keep the sample close. R2T's race weighs rows against a count's noise
# instead, and chose 16 or 32 rows a person on 3,000 demo people, at the cost of 20% of ε (and a quarter more
# where it could not resolve the data). Measured on the demo data at ε = 1 (the median amount by category, 20
# answers of 8 cells; /tmp scripts of the session): over 3,000 people the race gave 9.9% median error with 2,209%
# at the 90th percentile (a fifth of the cells a uniform draw from the range), 1 row 4.5% (15.7%), 4 rows 4.3%
# (11.3%), 8 rows 4.5% (13.7%); over 20,000 people the race 1.5% (8.7%), 1 row 1.5% (6.2%), 4 rows 1.2% (2.2%),
# 8 and 16 rows 1.2% (5.4%, 6.2%). But with 4 rows the rank interval held the truth in 91-99% of the cells
# depending on the hash seed (six seeds, 80 cells each: 95.8% in all), where the kept sample's median strays
# from all rows' by about the noise; with 8 rows in 97.5-100% (98.8%).
CHOSEN_ROWS = 8


def chosen_values_rows(plan: Plan, options: Options) -> int | None:
    """The rows per unit that a plan of values chosen from histograms only keeps where the options ask for bounds
    chosen per query: CHOSEN_ROWS where the declared bound is larger; None for any other plan."""
    if raceable(plan, options) and plan.histograms and not plan.measures and plan.rows_per_unit > CHOSEN_ROWS:
        return CHOSEN_ROWS
    return None


def chosen_histogram_rows(plan: Plan, options: Options) -> int | None:
    """The rows per unit and group that the histograms of a plan with counts or sums beside them keep where the
    options ask for bounds chosen per query: CHOSEN_ROWS, for the same reason as values chosen alone, whatever
    the race chooses for the counts and sums (their statements are apart). With the race's rows (up to the
    declared 100 where it could not resolve the data) the demo's median cost by drug beside AVG(cost) was 370%
    and 957% off at 3,000 people (two runs of 10 answers; alone 7.4%). None where no histogram keeps more."""
    if raceable(plan, options) and plan.histograms and plan.measures and plan.rows_per_unit > CHOSEN_ROWS:
        return CHOSEN_ROWS
    return None


def chosen_values_note(rows: int, declared: int) -> str:
    """What explain says of `chosen_values_rows`."""
    return (f"rows per unit: {rows} (below the declared {declared}) for values chosen from histograms: one unit "
            f"moves each rank by its rows, so fewer rows mean less noise in ranks, and a unit's rows beyond them "
            f"go in the keyed hash's order, a sample of its rows; no race is run (dpsql.rows_per_unit = auto)")
TOTALS_MARGIN = 8  # a unit's totals are heavier-tailed than its rows: the answer keeps 8 times the chosen τ
# An answer of more cells than FEW_CELLS keeps half that: each cell carries the whole bound's noise but only its
# share of what the bound cuts, so the cut hides in the noise (the same reason the fallback keeps less for many
# cells). On the demo data (20,000 people, ε = 1, 60 answers each, measured with /tmp scripts in one session),
# eight times the τ held every unit's total (the race's τ is 1,024 or 2,048; 37 of 14,182 people spend more than
# 4,096, 0.35% of the money) at noise twice what the cells need: AVG(amount) by category went from 5.1% median
# error to 3.1% (coverage 95% and 94%), SUM(amount) by category from 1.7% to 0.9% (bias -0.42% ± 0.10, coverage
# 95%), AVG(amount) by month from 6.3% to 4.1%, SUM(amount) by state (private keys) from 42% to 22%.
MANY_CELLS_TOTALS_MARGIN = 4
# A unit's total of squares is heavier-tailed still: the answer keeps 64 times the chosen τ. On the demo data
# (ε = 1, 100 answers each, /tmp scripts), stddev(amount) over 20,000 people (the race's τ about 262,144) was
# 7.3% off (median) with 13% coverage at 8 times τ, 2.3% with 75% at 32, and is 2.1% with 93% at 64 (300
# answers); over 3,000 people 7.3% with 93%; at 128 times, 3.4% and 8.5% (more noise, no less bias). Before it was
# 100% off: sums centred on the declared midpoint (2,500 for amounts mostly near 100) leave the variance as the
# difference of two numbers near 2,500² that the noise of either swamps.
SQUARES_MARGIN = 64


def bounds_totals(plan: Plan) -> bool:
    """Whether the race bounds each unit's total of the query's sums rather than its rows: SUMs, AVGs, variances
    and standard deviations of one non-negative value (one sum measure, or its sum and its sum of squares, whose
    total the race then bounds; beside counts), or several sums of values of one declared range (a pivot's
    SUM(amount) FILTER (WHERE category = 'lab'), ... columns, or a share SUM(CASE WHEN c THEN x ELSE 0 END) /
    SUM(x): the race bounds each unit's total of all of them together, `Plan.bounded_sums`), no top-k. Values
    chosen from histograms beside (percentiles, MIN, MAX, mode()) keep their own few rows
    (`chosen_histogram_rows`), whatever the race chooses: with them the sums were bounded by rows at the cap,
    and AVG(amount) beside the median by category over 20,000 demo people was 100% off (median error; 3.7%
    now). Sums of different ranges keep the race over rows: a bound on the total of SUM(amount) beside SUM(age)
    would give the ages the amounts' noise. Measured on the demo data at ε = 1 (10 answers of 8
    cells, /tmp scripts): SUM(amount) by category for each half of the year, two FILTER columns, had 237%
    median error over 20,000 people and 64% over 100,000 (a rows race at up to 100 visits of 5,000 each).
    A unit's total is what moves the sum; its rows bound it only through their number times the largest value,
    which for a heavy-tailed value is far above what most units hold (a visit's amount is declared up to
    5,000, a heavy user's year totals a few thousand). The counts beside it (an AVG's, a COUNT(*)) and partition
    selection (the groups a unit reaches) get the rows per unit of a race of their own in the same pass
    (`Prepared.rows_race`), enforced on the rows the sum keeps."""
    sums = [m for m in plan.measures if m.kind == "sum"]
    squares = len(sums) == 2 and sums[1].squares_of == sums[0].name
    one_range = all(s.squares_of is None and s.row_range.hi == sums[0].row_range.hi for s in sums)
    return (plan.unit_total is not None and (squares or one_range) and all(
                s.centre == 0 and s.row_range.lo >= 0 and s.unit_range[1] >= 1 for s in sums)
            and all(m.kind in ("count", "units") for m in plan.measures if m.kind != "sum")
            and not plan.top_k)


def race_note(plan: Plan, totals: Plan | None, race: RaceToTheTop, rows_race: RaceToTheTop | None,
              calibration: Calibration, race_answers: bool, epsilon: float) -> str:
    """What explain says of a bound chosen from the data: which race, at what ε, and what its fallback and the
    answer read."""
    summed = " + ".join(m.label for m in totals.bounded_sums) if totals else ""
    chosen = (f"each unit's total of {summed} over all groups: chosen at query time from "
              f"the data below {race.taus[-1]:,} (its rows times the declared range)" if totals else
              f"rows per unit: chosen at query time from the data below the declared {plan.rows_per_unit}")
    read = "; below the cap, the answer is the race's own truncated value at the chosen bound, read in " \
           "the same pass" if race_answers else ""
    if not race.counts_units:
        chosen = (f"rows per unit: chosen at query time from the data below the declared {plan.rows_per_unit}, "
                  "by the distinct values the rows each unit keeps at each bound find")
        read += "; where the race cannot resolve the data, the declared bound stands"
    elif lent(calibration, FALLBACK_SHARE):
        halves = ", half for each race" if rows_race else ""
        read += (f"; where the race cannot resolve the data, {FALLBACK_SHARE:.0%} of the answer's ε chooses "
                 f"the bound instead (sparse vector{halves}); below the cap, {EFFECT_SHARE:.0%} of it counts "
                 f"the units that hold more than the chosen bound, shown with the answer, and where that count "
                 f"shows a cut beyond the answer's noise, {RAISE_SHARE:.0%} more raises the bound to the first "
                 "that few units exceed (sparse vector)")
    beside = "" if rows_race is None else (
        f"; each unit's rows (for the counts beside it and the groups it reaches): chosen in the same pass "
        f"below the declared {totals.rows_per_unit} (R2T's race over {', '.join(map(str, rows_race.taus))}, "
        f"ε = {rows_race.epsilon:.4g})")
    return (f"{chosen} (R2T's race over {', '.join(map(str, race.taus))}, ε = {race.epsilon:.4g} of the "
            f"query's {epsilon:g}){beside}{read}; the plan shown is the declared bound's")
