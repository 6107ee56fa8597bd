"""Post-processing of noisy groups: finish aggregates, evaluate the select list, HAVING, ORDER BY, LIMIT.

All of it runs on noisy values only, so it costs no budget. Every released number carries its accuracy:
the noise scale where the value is one noisy statistic, and a 95% confidence interval (exact for counts
and sums; for averages, variances and expressions over aggregates, the 2.5-97.5% range of the finishing
formula over the noise distribution, drawn by simulation around the released values).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.accounting import zcdp
from dpsql.analysis import CHOSEN, COUNTS, Aggregate, Plan
from dpsql.errors import UnsupportedQuery
from dpsql.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    expected_error_lower_bound,
    halfwidth_lower_bound,
    noise_first,
)
from dpsql.mechanisms.race import UnitsOver
from dpsql.noise import Calibration, NoisyGroup
from dpsql.schema import TEMPORAL_TYPES, temporal_value
from dpsql.sql import to_sql

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

    @property
    def optimality_ratio(self) -> float | None:
        """The achieved 95% half-width over the least any (ε, δ)-DP mechanism could promise (None where either
        is missing or the bound is 0)."""
        if self.lower_bound is None or not self.lower_bound or self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_high - self.ci_low) / 2 / self.lower_bound


@dataclass(frozen=True)
class Result:
    names: list[str]
    types: list[str]
    rows: list[tuple]
    accuracy: list[tuple[Accuracy | None, ...]]


def finish(plan: Plan, calibration: Calibration, groups: list[NoisyGroup]) -> Result:
    """The rows the analyst sees, in order, with each value's accuracy."""
    mechanisms = calibration.mechanisms
    rng = np.random.default_rng(0)  # only simulates the already-released noise; not a privacy mechanism
    simulate = any(not _exact_interval(o.expr, plan) for o in plan.outputs)
    if calibration.histogram == "noisefirst":
        groups = _noise_first(groups, calibration)
    # a row's interval needs only its own noise's law, so rows share one set of draws, except where windows
    # combine rows (their draws must be independent across rows)
    draw_rows = len(groups) if plan.windows else 1
    unit_draws = _unit_draws(draw_rows, _simulated_measures(plan), mechanisms, rng) if simulate else {}
    kept = []
    for index, group in enumerate(groups):
        env: dict[str, Any] = {k.name: v for k, v in zip(plan.group_keys, group.keys, strict=True)}
        simulated: dict[str, Any] = dict(env)
        if simulate:
            row = index if draw_rows > 1 else 0
            for name, value in group.measures.items():
                spread = group.interval_factor.get(name, 1.0) * mechanisms[name].scale
                simulated[name] = value - spread * unit_draws[name][row] if name in unit_draws else value
        for agg in plan.aggregates:
            if agg.chosen:
                env[agg.name] = simulated[agg.name] = group.choices[agg.name]
                continue
            env[agg.name] = _finish_aggregate(agg, group.measures)
            if simulate:
                simulated[agg.name] = _finish_aggregate(agg, simulated)
        if plan.having is not None and not _truthy(evaluate(plan.having, env)):
            continue
        kept.append((group, env, simulated))
    if plan.windows:
        _compute_windows(plan.windows, [env for _, env, _ in kept], [s for _, _, s in kept] if simulate else [])
    rows, fixed = [], {}
    for group, env, simulated in kept:
        values, accuracy = [], []
        for output in plan.outputs:
            value = _typed(evaluate(output.expr, env), output.type_name)
            values.append(value)
            accuracy.append(_accuracy(output.expr, plan, calibration, value, simulated, group, fixed))
        order_keys = [evaluate(expr, env) for expr, _, _ in plan.order]
        rows.append((tuple(values), accuracy, order_keys))
    _simulated_intervals([accuracy for _, accuracy, _ in rows])
    rows = [(values, tuple(accuracy), order_keys) for values, accuracy, order_keys in rows]
    sort_rows(rows, lambda row, i: row[2][i], [(descending, nulls) for _, descending, nulls in plan.order])
    end = None if plan.limit is None else plan.offset + plan.limit
    rows = rows[plan.offset:end]
    return Result([o.name for o in plan.outputs], [o.type_name for o in plan.outputs],
                  [r[0] for r in rows], [r[1] for r in rows])


def _simulated_measures(plan: Plan) -> set[str]:
    """The measures whose noise an interval is simulated over: those of the aggregates in outputs whose interval
    is not one mechanism's (all of them where windows combine rows)."""
    if plan.windows:
        return set(plan.measure)
    noisy = plan.aggregate
    return {m for o in plan.outputs if not _exact_interval(o.expr, plan)
            for c in o.expr.find_all(exp.Column) if c.name in noisy for m in noisy[c.name].measures}


def _unit_draws(rows: int, names: set[str], mechanisms: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per measure in `names`, SIMULATIONS draws of its noise at unit scale for each of `rows`, in one batch."""
    size = (rows, SIMULATIONS)
    return {name: rng.normal(0.0, 1.0, size) if isinstance(mechanisms[name], GaussianMechanism)
            else rng.laplace(0.0, 1.0, size) for name in sorted(names) if name in mechanisms}


def _compute_windows(windows: list[tuple[str, exp.Window]], envs: list[dict[str, Any]],
                     simulations: list[dict[str, Any]]) -> None:
    """Each window's value for every released row, as PostgreSQL computes it over a query's rows: partitions and
    order from the released values; with ORDER BY the frame runs to the current row's last peer. Where intervals
    are simulated, aggregate windows combine the simulated draws over the same frames."""
    for name, window in windows:
        partition_by = window.args.get("partition_by") or []
        order = window.args["order"].expressions if window.args.get("order") else []
        partitions: dict[tuple, list[int]] = {}
        for index, env in enumerate(envs):
            key = tuple(_hashable(evaluate(e, env)) for e in partition_by)
            partitions.setdefault(key, []).append(index)
        for members in partitions.values():
            peers = _peer_groups(members, order, envs)
            _window_values(name, window.this, peers, envs)
            if simulations and not isinstance(window.this, RANKINGS):
                _window_values(name, window.this, peers, simulations)
            elif simulations:
                for index in members:
                    simulations[index][name] = envs[index][name]


RANKINGS = (exp.RowNumber, exp.Rank, exp.DenseRank)


def window_inputs(window: exp.Window) -> list[exp.Expression]:
    """What a window evaluates on each row: its function's argument, its PARTITION BY and ORDER BY values."""
    argument = window.this.this if isinstance(window.this.this, exp.Expression) else None
    order = window.args["order"].expressions if window.args.get("order") else []
    return [*([argument] if argument is not None and not isinstance(argument, exp.Star) else []),
            *(window.args.get("partition_by") or []), *(o.this for o in order)]


def _hashable(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _peer_groups(members: list[int], order: list[exp.Ordered], envs: list[dict[str, Any]]) -> list[list[int]]:
    """`members` in the window's order, in runs of peers (rows equal in every ORDER BY value)."""
    if not order:
        return [members]
    keyed = [(index, [evaluate(o.this, envs[index]) for o in order]) for index in members]
    for position in reversed(range(len(order))):
        descending = bool(order[position].args.get("desc"))
        nulls_first = order[position].args.get("nulls_first")
        nulls_first = descending if nulls_first is None else bool(nulls_first)
        keyed.sort(key=lambda r, p=position, d=descending, n=nulls_first: _sort_key(r[1][p], d, n), reverse=descending)
    runs: list[list[int]] = []
    for position, (index, values) in enumerate(keyed):
        if position and values == keyed[position - 1][1]:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


def _window_values(name: str, function: exp.Expression, peers: list[list[int]], envs: list[dict[str, Any]]) -> None:
    """Set envs[i][name] for the rows of one partition, given in runs of peers. Without ORDER BY there is one run,
    so every frame is the whole partition."""
    seen = 0
    frame: list[Any] = []
    for rank, run in enumerate(peers, start=1):
        if isinstance(function, exp.RowNumber):
            for offset, index in enumerate(run):
                envs[index][name] = seen + offset + 1
        elif isinstance(function, exp.Rank | exp.DenseRank):
            for index in run:
                envs[index][name] = seen + 1 if isinstance(function, exp.Rank) else rank
        else:
            argument = function.this
            frame.extend(None if isinstance(argument, exp.Star) else evaluate(argument, envs[index]) for index in run)
            value = _aggregate_frame(function, frame, star=isinstance(argument, exp.Star))
            for index in run:
                envs[index][name] = value
        seen += len(run)


def _aggregate_frame(function: exp.Expression, frame: list[Any], star: bool) -> Any:
    """SUM, AVG, MIN, MAX or COUNT of a frame's values, skipping NULLs as SQL does."""
    values = [v for v in frame if v is not None]
    if isinstance(function, exp.Count):
        return len(frame) if star else len(values)
    if not values:
        return None
    if isinstance(function, exp.Min | exp.Max):
        combine = np.minimum if isinstance(function, exp.Min) else np.maximum
        result = values[0]
        for v in values[1:]:
            result = combine(result, v)
        return result
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total / len(values) if isinstance(function, exp.Avg) else total


def _noise_first(groups: list[NoisyGroup], calibration: Calibration) -> list[NoisyGroup]:
    """Each measure's ordered bins merged by NoiseFirst (post-processing of the noisy values only)."""
    measures = {name: [g.measures[name] for g in groups] for name in calibration.mechanisms}
    smoothed, factors = {}, {}
    for name, values in measures.items():
        smoothed[name], partition = noise_first(values, calibration.mechanisms[name].variance)
        factors[name] = [1 / math.sqrt(end - start) for start, end in partition.buckets for _ in range(end - start)]
    return [replace(g, measures={name: smoothed[name][i] for name in measures},
                    interval_factor={name: factors[name][i] for name in measures}) for i, g in enumerate(groups)]


def _finish_aggregate(agg: Aggregate, measures: dict[str, Any]) -> Any:
    values = [measures[name] for name in agg.measures]
    if agg.kind in COUNTS:
        return np.maximum(values[0], 0)
    if agg.kind == "sum":
        return values[0]
    if agg.x_range is not None:
        return _finish_bivariate(agg, values)
    lo, hi = agg.arg_range.lo, agg.arg_range.hi
    mid, half = ((lo + hi) / 2 if agg.centred else 0.0), (hi - lo) / 2
    n = np.maximum(values[0], 1)
    mean_offset = values[1] / n
    if agg.kind == "avg":
        return np.clip(mid + mean_offset, lo, hi)
    var_pop = np.clip(values[2] / n - mean_offset**2, 0, half * half)
    if agg.kind in ("var_samp", "stddev_samp"):
        var = np.clip(var_pop * n / np.maximum(n - 1, 1), 0, 2 * half * half)
    else:
        var = var_pop
    return np.sqrt(var) if agg.kind.startswith("stddev") else var


def _finish_bivariate(agg: Aggregate, values: list[Any]) -> Any:
    """covar_pop/_samp, corr, regr_slope and regr_intercept of (Y, X) from the noisy count and centred sums, each
    kept where it can lie (|cov| within the half-ranges' product, variances ≥ 0, |corr| ≤ 1)."""
    (y_lo, y_hi), (x_lo, x_hi) = (agg.arg_range.lo, agg.arg_range.hi), (agg.x_range.lo, agg.x_range.hi)
    y_half, x_half = (y_hi - y_lo) / 2, (x_hi - x_lo) / 2
    n = np.maximum(values[0], 1)
    x_mean, y_mean = np.clip(values[1] / n, -x_half, x_half), np.clip(values[2] / n, -y_half, y_half)
    covariance = np.clip(values[3] / n - x_mean * y_mean, -y_half * x_half, y_half * x_half)
    if agg.kind == "covar_pop":
        return covariance
    if agg.kind == "covar_samp":
        return covariance * n / np.maximum(n - 1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):  # a noisy variance of 0 gives ±inf, as a ratio would
        x_variance = np.clip(values[4] / n - x_mean**2, 0, x_half * x_half)
        if agg.kind == "corr":
            y_variance = np.clip(values[5] / n - y_mean**2, 0, y_half * y_half)
            return np.clip(covariance / np.sqrt(x_variance * y_variance), -1, 1)
        slope = covariance / x_variance
        if agg.kind == "regr_slope":
            return slope
        return (y_mean + (y_lo + y_hi) / 2) - slope * (x_mean + (x_lo + x_hi) / 2)


def _exact_interval(expr: exp.Expression, plan: Plan) -> bool:
    """Whether an output's interval comes straight from one mechanism (a bare count or sum) or is exact."""
    noisy = plan.aggregate
    if isinstance(expr, exp.Column) and expr.name in noisy:
        return noisy[expr.name].kind in (*COUNTS, "sum", *CHOSEN)
    return not any(isinstance(n, exp.Column) and (n.name in noisy or n.name in plan.noisy_windows)
                   for n in expr.walk())


def _accuracy(expr: exp.Expression, plan: Plan, calibration: Calibration, value: Any,
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
        return Accuracy(None, None, None, gap) if agg.kind == "quantile" else Accuracy(None, None, None,
                                                                                         count_gap=gap)
    if isinstance(expr, exp.Column) and not windowed:
        agg = noisy[expr.name]
        if agg.kind in (*COUNTS, "sum"):
            mechanism = mechanisms[agg.measures[0]]
            factor = group.interval_factor.get(agg.measures[0], 1.0)
            if agg.name not in fixed:  # the same for every group: computed once per answer
                fixed[agg.name] = mechanism.ci_halfwidth(), lower_bounds(agg, plan, calibration)
            halfwidth, unscaled_bounds = fixed[agg.name]
            width = halfwidth * factor  # smoothed bins: the noise of a bucket's mean
            low, high = value - width, value + width
            if agg.kind in COUNTS:
                low, high = max(low, 0), max(high, 0)
            bounds = unscaled_bounds if factor == 1.0 else (None, None)
            return Accuracy(mechanism.scale if factor == 1.0 else None, float(low), float(high), None, None, *bounds)
    try:
        draws = np.asarray(evaluate(expr, simulated), dtype=float)
    except (TypeError, ValueError, KeyError, UnsupportedQuery):  # KeyError: no simulated windows
        return None
    if draws.ndim == 0 or not np.isfinite(draws).any():
        return None
    agg = noisy[expr.name] if isinstance(expr, exp.Column) and expr.name in noisy else None
    bounds = (None, None) if agg is None else lower_bounds(agg, plan, calibration, group.measures[agg.measures[0]])
    return _Simulated(np.broadcast_to(draws, (SIMULATIONS,)), bounds)


@dataclass
class _Simulated:
    """An interval still to be read off its simulated draws: every row's at once (`_simulated_intervals`)."""

    draws: np.ndarray
    bounds: tuple[float | None, float | None]


def _simulated_intervals(accuracies: list[list[Accuracy | _Simulated | None]]) -> None:
    """Each `_Simulated` in `accuracies` replaced by its 95% interval, all percentiles in one batch."""
    places = [(row, i) for row, values in enumerate(accuracies) for i, a in enumerate(values)
              if isinstance(a, _Simulated)]
    if not places:
        return
    draws = np.stack([accuracies[row][i].draws for row, i in places])
    with np.errstate(invalid="ignore"):  # draws at ±inf (a ratio over a noisy zero) leave a NaN bound
        # np.percentile works on all rows at once; the NaN-skipping one goes row by row
        percentile = np.nanpercentile if np.isnan(draws).any() else np.percentile
        lows, highs = percentile(draws, [2.5, 97.5], axis=1)
    for (row, i), low, high in zip(places, lows, highs, strict=True):
        accuracies[row][i] = Accuracy(None, float(low), float(high), None, None, *accuracies[row][i].bounds)


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
            epsilon, delta = 2 * epsilon, delta * (1 + math.exp(epsilon))
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


INTERVALS_COVER = ("the intervals cover the noise only: values clamped to their declared bounds, and rows or groups "
                   "a unit has beyond them, move the answer outside")


def describe_bounds_effect(effect: dict) -> list[str]:
    """The bounds' effect (`Engine.bounds_effect`) in lines for people: a heading, then each noisy count of
    units with its 95% interval and its share of the units read."""
    spent = "no more budget spent (kept from before)" if effect.get("cached") else f"ε = {effect['epsilon']:.4g} spent"
    lines = [f"bounds' effect (noisy counts of units, {spent}):"]
    for entry in effect["counts"]:
        share = "" if entry.get("share") is None else f" ({100 * entry['share']:.2g}% of the units read)"
        lines.append(f"  {entry['label']}: {entry['units']:.0f} [{entry['low']:.0f}, {entry['high']:.0f}]{share}")
    return lines


UNITS_OVER_WARNING = 0.01  # the share of the units read above which a chosen bound's loss is called out


def describe_units_over(over: UnitsOver | None, totals: bool) -> str | None:
    """What a bound chosen from the data leaves out (`RaceToTheTop.units_over`), for people: the released count of
    units holding more than it (their rows, or with `totals` their total), its 95% interval and share of the units
    read; a warning where even the interval's low end is over UNITS_OVER_WARNING of them."""
    if over is None:
        return None
    read = max(over.units_read, 1.0)
    low, high = max(0.0, over.units - over.halfwidth), max(0.0, over.units + over.halfwidth)
    what = f"a total of {over.bound:,} per unit" if totals else f"{over.bound:,} rows per unit"
    text = (f"bounded at {what}, chosen from the data; about {max(0.0, over.units):,.0f} of the {read:,.0f} units "
            f"read hold more (95%: {low:,.0f} to {high:,.0f}, {100 * low / read:.2g}-{100 * high / read:.2g}%; "
            f"counted at ε = {over.epsilon:.2g} of the query's)")
    if low / read > UNITS_OVER_WARNING:
        beyond = "totals beyond it" if totals else "rows beyond it"
        text += (f"; at least {100 * low / read:.2g}% of the units lose their {beyond}, so the answer is low by "
                 "what they hold there: a larger ε lets the race see them and choose a larger bound")
    return text


def describe_selection(plan: Plan, calibration: Calibration | None) -> str | None:
    """Why groups may be missing from an answer whose keys are private, and how to ask for every group: the
    threshold is public (it follows from ε, δ and the bounds), how many groups fell below it is not said."""
    selection = calibration.selection if calibration is not None else None
    if selection is None:
        return None
    counted = "units" if calibration.selected_by else plan.selection_counts
    text = (f"groups are released only where a noisy count of their {counted} reaches {selection.threshold} (DP "
            f"partition selection at ε = {calibration.selection_epsilon:.3g}), so groups with fewer may be missing")
    return f"{text}; to release every group, {plan.every_group}" if plan.every_group else text


def describe_accuracy(accuracy: Accuracy | None) -> str:
    """A value's accuracy for people: its 95% interval, rank error or count gap ("" for exact values)."""
    if accuracy is None:
        return ""
    if accuracy.rank_error is not None:
        return f"±{accuracy.rank_error:.3g} ranks"
    if accuracy.count_gap is not None:
        return f"count within {accuracy.count_gap:.3g} of the top"
    interval = f"[{format_value(accuracy.ci_low)}, {format_value(accuracy.ci_high)}]"
    ratio = accuracy.optimality_ratio
    if ratio is None:
        return interval
    return f"{interval} (≥ ±{accuracy.lower_bound:.3g} for any mechanism at this ε, δ: {ratio:.2g}×)"


def format_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):  # as psql shows an array
        return "{" + ",".join("NULL" if v is None else format_value(v) for v in value) + "}"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)


def _typed(value: Any, type_name: str) -> Any:
    if value is None:
        return None
    if type_name.endswith("[]"):
        return [_typed(v, type_name[:-2]) for v in value]
    if isinstance(value, np.generic | np.ndarray):
        value = value.item()
    if type_name in TEMPORAL_TYPES and isinstance(value, int | float):  # a quantile of dates, chosen as a number
        return temporal_value(type_name, value)
    if type_name == "int8" and isinstance(value, int | float) and math.isfinite(value):
        return int(round(value))
    if type_name == "float8" and isinstance(value, int | float):
        return float(value)
    return value


def _truthy(value: Any) -> bool:
    return value is not None and bool(value)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else value.isoformat() if hasattr(value, "isoformat") else str(value)


def sort_rows(rows: list, value_of: Callable[[Any, int], Any], order: Sequence[tuple[bool, bool]]) -> None:
    """Sort `rows` in place as PostgreSQL's ORDER BY would: by `value_of(row, i)` for each (descending, nulls
    first) of `order`, the first most significant."""
    for index in reversed(range(len(order))):
        descending, nulls_first = order[index]
        try:
            rows.sort(key=lambda r, i=index: _sort_key(value_of(r, i), descending, nulls_first), reverse=descending)
        except TypeError:  # a date Python cannot hold came as PostgreSQL's text ('infinity'): order by the text
            rows.sort(key=lambda r, i=index: _sort_key(_text_or_none(value_of(r, i)), descending, nulls_first),
                      reverse=descending)


def _sort_key(value: Any, descending: bool, nulls_first: bool) -> tuple:
    # with reverse=True the tuple order flips, so put NULLs where PostgreSQL would after the flip
    is_null = value is None
    null_rank = (0 if is_null else 1) if nulls_first != descending else (1 if is_null else 0)
    return (null_rank, 0 if is_null else value)


# --- a small evaluator for expressions over noisy values (scalars or numpy arrays) ----------------------------

_BINARY = {
    exp.Add: np.add, exp.Sub: np.subtract, exp.Mul: np.multiply,
    exp.EQ: np.equal, exp.NEQ: np.not_equal, exp.GT: np.greater, exp.GTE: np.greater_equal,
    exp.LT: np.less, exp.LTE: np.less_equal,
}
_UNARY = {exp.Abs: np.abs, exp.Floor: np.floor, exp.Ceil: np.ceil, exp.Neg: np.negative,
          exp.Sqrt: lambda v: np.sqrt(np.maximum(v, 0))}


def evaluate(node: exp.Expression, env: dict[str, Any]) -> Any:
    """Value of a post-processing expression; NULL is None and propagates as in SQL."""
    if isinstance(node, exp.Column):
        return env[node.name]
    if isinstance(node, exp.Literal):
        value = node.to_py()  # a decimal literal is a Decimal, which numpy will not mix with the noisy floats
        return float(value) if isinstance(value, Decimal) else value
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Paren):
        return evaluate(node.this, env)
    if isinstance(node, exp.And | exp.Or):
        left, right = evaluate(node.this, env), evaluate(node.expression, env)
        if isinstance(node, exp.And):
            return None if left is None or right is None else np.logical_and(left, right)
        return None if left is None or right is None else np.logical_or(left, right)
    if isinstance(node, exp.Not):
        value = evaluate(node.this, env)
        return None if value is None else np.logical_not(value)
    if type(node) in _BINARY:
        left, right = evaluate(node.this, env), evaluate(node.expression, env)
        return None if left is None or right is None else _BINARY[type(node)](left, right)
    if isinstance(node, exp.Div):
        left, right = evaluate(node.this, env), evaluate(node.expression, env)
        if left is None or right is None or (np.ndim(right) == 0 and right == 0):
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(left, right)
    if type(node) in _UNARY:
        value = evaluate(node.this, env)
        return None if value is None else _UNARY[type(node)](value)
    if isinstance(node, exp.Array):
        return [evaluate(e, env) for e in node.expressions]
    if isinstance(node, exp.Round):
        decimals = node.args.get("decimals")
        number = decimals.this if isinstance(decimals, exp.Neg) else decimals
        if decimals is not None and not (isinstance(number, exp.Literal) and not number.is_string):
            raise UnsupportedQuery("round()'s number of digits must be a constant",
                                   "write the digits as a constant: round(AVG(x), 2)")
        value = evaluate(node.this, env)
        digits = int(evaluate(decimals, env)) if decimals is not None else 0
        return None if value is None else np.round(value, digits)
    if isinstance(node, exp.Greatest | exp.Least):
        values = [v for v in (evaluate(e, env) for e in [node.this, *node.expressions]) if v is not None]
        if not values:
            return None
        combine = np.maximum if isinstance(node, exp.Greatest) else np.minimum
        result = values[0]
        for v in values[1:]:
            result = combine(result, v)
        return result
    if isinstance(node, exp.Nullif):
        value, other = evaluate(node.this, env), evaluate(node.expression, env)
        if value is None or other is None or np.ndim(value) != 0:
            return value
        return None if value == other else value
    if isinstance(node, exp.Coalesce):
        for e in [node.this, *node.expressions]:
            value = evaluate(e, env)
            if value is not None:
                return value
        return None
    if isinstance(node, exp.Cast):
        value = evaluate(node.this, env)
        if value is None:
            return None
        if node.to.this in (exp.DataType.Type.INT, exp.DataType.Type.BIGINT, exp.DataType.Type.SMALLINT):
            return np.round(value)
        if node.to.this in (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR):
            return str(value.item() if isinstance(value, np.generic) else value)
        scale = node.to.expressions[1:2] if node.to.this == exp.DataType.Type.DECIMAL else []
        if scale:  # numeric(p, s) rounds half away from zero to s digits, as PostgreSQL does
            factor = 10.0 ** int(scale[0].this.this)
            return np.sign(value) * np.floor(np.abs(value) * factor + 0.5) / factor
        return value
    if isinstance(node, exp.Case) and node.this is None:
        for branch in node.args.get("ifs", []):
            condition = evaluate(branch.this, env)
            if np.ndim(condition) != 0:
                raise UnsupportedQuery("CASE over noisy values has no simulated interval",
                                       "ask for the noisy value itself and apply the CASE to the answer")
            if _truthy(condition):
                return evaluate(branch.args["true"], env)
        default = node.args.get("default")
        return evaluate(default, env) if default is not None else None
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        return evaluate(node.this, env) is None
    raise UnsupportedQuery(f"{to_sql(node)} cannot be computed over noisy aggregates",
                           "use arithmetic, ROUND, ABS, GREATEST/LEAST, COALESCE, CASE or casts")
