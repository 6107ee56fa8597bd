"""Post-processing of noisy groups: finish aggregates, evaluate the select list, HAVING, windows, ORDER BY and LIMIT.

All of it runs on noisy values only, so it costs no budget. Every released number carries its accuracy:
the noise scale where the value is one noisy statistic, and a 95% confidence interval (exact for counts
and sums; for averages, variances and expressions over aggregates, the 2.5-97.5% range of the finishing
formula over the noise distribution, drawn by simulation around the released values).

`finish` is the stage's one public entry; `accuracy` gives each value its interval, `windows` computes window
functions over released rows, `evaluate` computes expressions and orders rows, `presentation` words it all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.analysis import COUNTS, Aggregate, Plan
from dpsql.analysis.kinds import KINDS
from dpsql.mechanisms import noise_first
from dpsql.noise import Calibration, NoisyGroup
from dpsql.postprocess.accuracy import (
    Accuracy,
    Simulated,
    accuracy_of,
    draw_unit_noise,
    exact_interval,
    lower_bounds,
    simulated_intervals,
    simulated_measures,
)
from dpsql.postprocess.evaluate import evaluate, sort_rows, truthy, typed
from dpsql.postprocess.presentation import (
    INTERVALS_COVER,
    describe_accuracy,
    describe_bounds_effect,
    describe_cap,
    describe_chosen,
    describe_selection,
    describe_units_over,
    format_value,
)
from dpsql.postprocess.windows import compute_windows, window_inputs
from dpsql.schema import temporal_value


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
    simulate = any(not exact_interval(o.expr, plan) for o in plan.outputs)
    if calibration.histogram == "noisefirst":
        groups = _noise_first(groups, calibration)
    # a row's interval needs only its own noise's law, so rows share one set of draws, except where windows
    # combine rows (their draws must be independent across rows)
    draw_rows = len(groups) if plan.windows else 1
    unit_draws = draw_unit_noise(draw_rows, simulated_measures(plan), mechanisms, rng) if simulate else {}
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
                env[agg.name] = simulated[agg.name] = chosen_value(agg, group.choices[agg.name])
                continue
            env[agg.name] = _finish_aggregate(agg, group.measures)
            if simulate:
                simulated[agg.name] = _finish_aggregate(agg, simulated)
        if plan.having is not None and not truthy(evaluate(plan.having, env)):
            continue
        kept.append((group, env, simulated))
    if plan.windows:  # (their sums read counts as drawn: `compute_windows`)
        compute_windows(plan.windows, [env for _, env, _ in kept], [s for _, _, s in kept] if simulate else [],
                        [_unclamped(plan, env, group.measures) for group, env, _ in kept],
                        [_unclamped(plan, s, s) for _, _, s in kept] if simulate else [])
    rows, fixed = [], {}
    for group, env, simulated in kept:
        values, accuracy = [], []
        for output in plan.outputs:
            value = typed(evaluate(output.expr, env), output.type_name)
            values.append(value)
            accuracy.append(_with_unclamped(accuracy_of(output.expr, plan, calibration, value, simulated, group, fixed),
                                            output.expr, plan, group))
        order_keys = [evaluate(expr, env) for expr, _, _ in plan.order]
        rows.append((tuple(values), accuracy, order_keys))
    simulated_intervals([accuracy for _, accuracy, _ in rows])
    rows = [(values, tuple(accuracy), order_keys) for values, accuracy, order_keys in rows]
    sort_rows(rows, lambda row, i: row[2][i], [(descending, nulls) for _, descending, nulls in plan.order])
    end = None if plan.limit is None else plan.offset + plan.limit
    rows = rows[plan.offset:end]
    return Result([o.name for o in plan.outputs], [o.type_name for o in plan.outputs],
                  [r[0] for r in rows], [r[1] for r in rows])


def _noise_first(groups: list[NoisyGroup], calibration: Calibration) -> list[NoisyGroup]:
    """Each measure's ordered bins merged by NoiseFirst (post-processing of the noisy values only)."""
    measures = {name: [g.measures[name] for g in groups] for name in calibration.mechanisms}
    smoothed, factors = {}, {}
    for name, values in measures.items():
        smoothed[name], partition = noise_first(values, calibration.mechanisms[name].variance)
        factors[name] = [1 / math.sqrt(end - start) for start, end in partition.buckets for _ in range(end - start)]
    return [replace(g, measures={name: smoothed[name][i] for name in measures},
                    interval_factor={name: factors[name][i] for name in measures}, noise_shared=True)
            for i, g in enumerate(groups)]


def _with_unclamped(accuracy: Accuracy | Simulated | None, expr: exp.Expression, plan: Plan,
                    group: NoisyGroup) -> Accuracy | Simulated | None:
    """A bare count's accuracy, with its noisy value where the clamp at 0 hid it (`Accuracy.unclamped`)."""
    agg = plan.aggregate.get(expr.name) if isinstance(expr, exp.Column) else None
    if not isinstance(accuracy, Accuracy) or agg is None or agg.kind not in COUNTS or agg.chosen:
        return accuracy
    noisy = group.measures[agg.measures[0]]
    return replace(accuracy, unclamped=float(noisy)) if noisy < 0 else accuracy


def _unclamped(plan: Plan, env: dict[str, Any], measures: dict[str, Any]) -> dict[str, Any]:
    """`env` with each count as drawn rather than clamped at 0, which a sum over counts reads so as not to run high
    (a week of daily counts of 20 with noise of ±120)."""
    return {**env, **{agg.name: measures[agg.measures[0]] for agg in plan.aggregates
                      if agg.kind in COUNTS and not agg.chosen}}


def chosen_value(agg: Aggregate, value: Any) -> Any:
    """A value chosen from a histogram as post-processing reads it: a date as a date (EXTRACT(YEAR FROM MIN(day)),
    CURRENT_DATE - MAX(day)), anything else as the number it was chosen as."""
    if agg.arg_type == "date" and isinstance(value, int | float | np.number):
        return temporal_value("date", float(value))
    return value


def _finish_aggregate(agg: Aggregate, measures: dict[str, Any]) -> Any:
    values = [measures[name] for name in agg.measures]
    if agg.kind in COUNTS:
        return np.maximum(values[0], 0)
    return KINDS[agg.kind].finish(agg, values)


__all__ = ["INTERVALS_COVER", "Accuracy", "Result", "chosen_value", "describe_accuracy", "describe_bounds_effect",
           "describe_cap", "describe_chosen", "describe_selection", "describe_units_over", "evaluate", "finish",
           "format_value", "lower_bounds", "sort_rows", "window_inputs"]
