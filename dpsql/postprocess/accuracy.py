"""Each released value's accuracy: the noise scale where it is one noisy statistic, and a 95% confidence
interval (exact for counts and sums; for averages, variances and expressions over aggregates, the 2.5-97.5% range
of the finishing formula over the noise distribution, drawn by simulation around the released values), with the
least half-width any mechanism at its (ε, δ) could promise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.accounting import zcdp
from dpsql.analysis import COUNTS, Aggregate, Plan
from dpsql.errors import UnsupportedQuery
from dpsql.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    exp_capped,
    expected_error_lower_bound,
    halfwidth_lower_bound,
)
from dpsql.noise import Calibration, NoisyGroup
from dpsql.postprocess.evaluate import evaluate

SIMULATIONS = 2000


@dataclass(frozen=True)
class Accuracy:
    scale: float | None  # Laplace noise scale b, where the value is a single noisy statistic
    ci_low: float | None  # 95% confidence interval (None for values chosen by the exponential mechanism)
    ci_high: float | None
    rank_error: float | None = None  # quantiles: with 95% probability at most this many ranks off
    count_gap: float | None = None  # mode and top-k keys: with 95% probability the chosen value's count is
    # within this of the largest (remaining) count
    lower_bound: float | None = None  # COUNT, SUM, AVG: the least 95% half-width any mechanism at this value's
    # (ε, δ) could promise on every database (mechanisms.lower_bounds)
    error_bound: float | None = None  # and the least expected absolute error it could have
    unclamped: float | None = None  # a count shown as 0: its noisy value below 0, which aggregates over released
    # rows read (a sum of clamped counts runs high where the noise is as large as the counts)
    halfwidth: float | None = None  # a single noisy statistic whose noise is its own (no other row's; a de-biased
    # count's errors and its group's other values' move opposite ways): its interval's half-width before the clamp
    # at 0, which the intervals of sums over released rows add up
    noise_variance: float | None = None  # such a statistic's noise variance where one mechanism drew it alone: what
    # a variance over released rows takes off (the noisy values spread wider than the exact ones by it)

    @property
    def optimality_ratio(self) -> float | None:
        """The achieved 95% half-width over the least any (ε, δ)-DP mechanism could promise (None where either
        is missing or the bound is 0)."""
        if self.lower_bound is None or not self.lower_bound or self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_high - self.ci_low) / 2 / self.lower_bound


def simulated_measures(plan: Plan) -> set[str]:
    """The measures whose noise an interval is simulated over: those of the aggregates in outputs whose interval
    is not one mechanism's (all of them where windows combine rows)."""
    if plan.windows:
        return set(plan.measure)
    noisy = plan.aggregate
    return {m for o in plan.outputs if not exact_interval(o.expr, plan)
            for c in o.expr.find_all(exp.Column) if c.name in noisy for m in noisy[c.name].measures}


def draw_unit_noise(rows: int, names: set[str], mechanisms: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per measure in `names`, SIMULATIONS draws of its noise at unit scale for each of `rows`, in one batch."""
    size = (rows, SIMULATIONS)
    return {name: rng.normal(0.0, 1.0, size) if isinstance(mechanisms[name], GaussianMechanism)
            else rng.laplace(0.0, 1.0, size) for name in sorted(names) if name in mechanisms}


def exact_interval(expr: exp.Expression, plan: Plan) -> bool:
    """Whether an output's interval comes straight from one mechanism (a bare count or sum) or is exact."""
    noisy = plan.aggregate
    if isinstance(expr, exp.Column) and expr.name in noisy:
        return noisy[expr.name].kind in (*COUNTS, "sum") or noisy[expr.name].chosen
    return not any(isinstance(n, exp.Column) and (n.name in noisy or n.name in plan.noisy_windows)
                   for n in expr.walk())


def accuracy_of(expr: exp.Expression, plan: Plan, calibration: Calibration, value: Any,
              simulated: dict[str, Any], group: NoisyGroup, fixed: dict[str, tuple]) -> Accuracy | None:
    """The accuracy of one released value; `fixed` keeps what is the same in every group (per aggregate)."""
    mechanisms = calibration.mechanisms
    noisy = plan.aggregate
    used = [noisy[n.name] for n in expr.find_all(exp.Column) if n.name in noisy]
    windowed = any(n.name in plan.noisy_windows for n in expr.find_all(exp.Column))
    if not used and not windowed:
        if group.key_gap is not None and any(n.name in {k.name for k in plan.group_keys}
                                             for n in expr.find_all(exp.Column)):
            return Accuracy(None, None, None, count_gap=group.key_gap)  # a key picked by top-k
        return None  # a group key or a constant: no noise
    if any(a.chosen for a in used):
        if not isinstance(expr, exp.Column):
            return None  # no interval for expressions over chosen values
        agg = noisy[expr.name]
        gap = calibration.choosers[expr.name].utility_gap(plan.histogram[agg.measures[0]].cells)
        return Accuracy(None, None, None, gap) if agg.score == "rank" else Accuracy(None, None, None, count_gap=gap)
    if isinstance(expr, exp.Column) and not windowed:
        agg = noisy[expr.name]
        if agg.kind in (*COUNTS, "sum"):
            mechanism = mechanisms[agg.measures[0]]
            factor = group.interval_factor.get(agg.measures[0], 1.0)
            if agg.name not in fixed:  # the same for every group: computed once per answer
                fixed[agg.name] = mechanism.ci_halfwidth(), lower_bounds(agg, plan, calibration)
            halfwidth, unscaled_bounds = fixed[agg.name]
            width = halfwidth * factor  # smoothed bins: the noise of a bucket's mean
            low, high = float(value) - width, float(value) + width  # (a numeric SUM is released as a Decimal)
            if agg.kind in COUNTS:
                low, high = max(low, 0), max(high, 0)
            bounds = unscaled_bounds if factor == 1.0 else (None, None)
            own = factor == 1.0 or not group.noise_shared  # (a de-biased count's noise is its own)
            variance = getattr(mechanism, "variance", None) if factor == 1.0 else None
            return Accuracy(mechanism.scale if factor == 1.0 else None, float(low), float(high), None, None, *bounds,
                            halfwidth=float(width) if own else None,
                            noise_variance=None if variance is None else float(variance))
    try:
        draws = np.asarray(evaluate(expr, simulated), dtype=float)
    except (TypeError, ValueError, KeyError, UnsupportedQuery):  # KeyError: no simulated windows
        return None
    if draws.ndim == 0 or not np.isfinite(draws).any():
        return None
    agg = noisy[expr.name] if isinstance(expr, exp.Column) and expr.name in noisy else None
    bounds = (None, None) if agg is None else lower_bounds(agg, plan, calibration, group.measures[agg.measures[0]])
    return Simulated(np.broadcast_to(draws, (SIMULATIONS,)), bounds)


@dataclass
class Simulated:
    """An interval still to be read off its simulated draws: every row's at once (`_simulated_intervals`)."""

    draws: np.ndarray
    bounds: tuple[float | None, float | None]


def simulated_intervals(accuracies: list[list[Accuracy | Simulated | None]]) -> None:
    """Each `Simulated` in `accuracies` replaced by its 95% interval, all percentiles in one batch. Where more
    than 2.5% of the draws have no finite value (a ratio whose divisor's noise reaches 0: `SUM(x) / NULLIF(COUNT(*),
    0)`), no interval holds 95% of them: there is none (it had a NaN or infinite bound)."""
    places = [(row, i) for row, values in enumerate(accuracies) for i, a in enumerate(values)
              if isinstance(a, Simulated)]
    if not places:
        return
    draws = np.stack([accuracies[row][i].draws for row, i in places]).astype(float)
    finite = np.isfinite(draws)
    with np.errstate(invalid="ignore"):
        # np.percentile works on all rows at once; the NaN-skipping one goes row by row
        percentile = np.percentile if finite.all() else np.nanpercentile
        lows, highs = percentile(np.where(finite, draws, np.nan), [2.5, 97.5], axis=1)
    unbounded = (~finite).mean(axis=1) > 0.025
    for (row, i), low, high, none in zip(places, lows, highs, unbounded, strict=True):
        interval = (None, None) if none else (float(low), float(high))
        accuracies[row][i] = Accuracy(None, *interval, None, None, *accuracies[row][i].bounds)


def lower_bounds(agg: Aggregate, plan: Plan, calibration: Calibration,
                 count: float | None = None) -> tuple[float | None, float | None]:
    """For a released COUNT, SUM or AVG: the least 95% half-width and expected error of any mechanism with the
    (ε, δ) this value was given, for what one unit can move it (a group's count by its row bound, a sum by its
    unit range). An average is bounded at its released `count` n, where replacing one unit moves it by its unit
    range over n (two add-remove steps); without it, (None, None)."""
    privacy = [_privacy(calibration, name) for name in agg.measures]
    if None in privacy or not (agg.kind in (*COUNTS, "sum") or (agg.kind == "avg" and len(agg.measures) == 2)):
        return None, None
    epsilon, delta = sum(p[0] for p in privacy), sum(p[1] for p in privacy)
    measure = plan.measure[agg.measures[-1]]
    lo, hi = measure.unit_range
    if agg.kind == "avg":
        if count is None or count < 1:
            return None, None
        moved = (hi - lo) / float(count)
        if plan.neighbouring == "add-remove":
            epsilon, delta = 2 * epsilon, delta * (1 + exp_capped(epsilon))
    else:
        moved = hi - lo if plan.neighbouring == "replace" else max(abs(lo), abs(hi))
    return halfwidth_lower_bound(moved, epsilon, delta), expected_error_lower_bound(moved, epsilon, delta)


def _privacy(calibration: Calibration, measure: str) -> tuple[float, float] | None:
    """The (ε, δ) a measure's mechanism gives it: a Laplace mechanism's ε, or a Gaussian's ρ converted at its
    share of the δ the measures took."""
    mechanism = calibration.mechanisms.get(measure)
    if isinstance(mechanism, LaplaceMechanism):
        return mechanism.epsilon, 0.0
    if isinstance(mechanism, GaussianMechanism):
        share = (calibration.cost.delta - calibration.cost.approx_delta) / len(calibration.mechanisms)
        return (zcdp.epsilon_of(mechanism.rho, share), share) if share > 0 else None
    return None
