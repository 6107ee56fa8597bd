"""Calibrating and adding noise: the plan's statistics become noisy, with the cost read off the mechanisms.

`calibrate` splits a query's ε explicitly: a share to DP partition selection when group keys are private,
the rest equally across the distinct measures and quantiles (basic composition). Each measure's mechanism is
built from its sensitivity and its share, and the cost charged is what the mechanisms' own privacy maps
report. With the Gaussian mechanism the measures' shares together form an (ε, δ) target, met by the ρ whose
zCDP conversion gives exactly that; ρ is split equally across the measures, each noised by its L2
sensitivity (δ is split in half when partition selection needs some too).
`add_noise` turns the backend's exact rows into noisy groups: declared domains release every key (missing
ones as exact zeros before noise) and nothing else; private keys pass partition selection or are dropped.
A key is read in one canonical form per type (`released_key`): the backend returns a group's key as the first of
its rows spells it, and a released key must be a function of the group alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from dpsql.accounting import NO_COST, Cost, zcdp
from dpsql.analysis import Plan
from dpsql.mechanisms import (
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    PartitionSelection,
    StructureFirstPlan,
    exp_capped,
    rank_scores,
    structure_first_or_noise_first,
    top_k,
)

Noise = LaplaceMechanism | GaussianMechanism




@dataclass(frozen=True)
class Calibration:
    mechanisms: dict[str, Noise]  # measure name -> its mechanism
    choosers: dict[str, ExponentialMechanism]  # quantile/mode aggregate name -> the mechanism choosing its cell
    selection: PartitionSelection | None
    top_k: ExponentialMechanism | None  # one round of the top-k selection (each of the k rounds costs its ε)
    cost: Cost  # what the answer costs, from the mechanisms' own privacy maps
    selection_epsilon: float  # the part of epsilon spent on partition selection
    mechanism: str = "laplace"  # laplace | gaussian: the noise on measures
    histogram: str = "plain"  # plain | noisefirst | structurefirst: how ordered bins are released
    structure: StructureFirstPlan | None = None
    selected_by: str | None = None  # a units measure whose noisy value is also its group's selection count

    @property
    def epsilon(self) -> float:
        return self.cost.epsilon

    @property
    def delta(self) -> float:
        return self.cost.delta


@dataclass(frozen=True)
class NoisyGroup:
    keys: tuple[Any, ...]
    measures: dict[str, float]
    choices: dict[str, Any]  # quantile/mode aggregate name -> the chosen value
    key_gap: float | None = None  # top-k: with 95% probability this key's count is within this of the best left
    interval_factor: dict[str, float] = field(default_factory=dict)  # measure -> how much narrower its noise
    # interval is than its mechanism's (smoothed histograms: noise averaged over a bucket; de-biased reports)
    noise_shared: bool = False  # smoothed bins: a bin's noise is its bucket's, shared with its neighbours, so
    # sums over released rows cannot add it up as each row's own


def calibrate(plan: Plan, epsilon: float, delta: float, selection_share: float | None,
              mechanism: str = "laplace", histogram: str = "plain") -> Calibration:
    """The mechanisms that answer `plan` for a total of `epsilon` (and `delta` if keys are private or the
    mechanism is Gaussian). `histogram` applies to ordered bins only; elsewhere it is plain. Partition selection
    takes `selection_share` of ε, or by default an equal share beside the released statistics (a half for one,
    a third for two, a quarter for more: selection needs only to find groups, each statistic must be precise)."""
    histogram = _histogram_method(plan, histogram)
    gaussian = mechanism == "gaussian" and bool(plan.measures) and histogram != "structurefirst"
    self_selected = _self_selected(plan, epsilon, delta) if not gaussian else None
    if self_selected is not None:
        return self_selected
    selection, selection_epsilon, cost, structure = None, 0.0, NO_COST, None
    if plan.partition_selection:
        if selection_share is None:
            released = len(plan.measures) + sum(a.chosen for a in plan.aggregates) + (plan.top_k is not None)
            selection_share = min(0.5, max(0.25, 1 / (released + 1))) if released else 1.0  # keys alone: all of it
        selection_epsilon = epsilon * selection_share
        selection_delta = delta / 2 if gaussian else delta
        # under "replace" a neighbour is a removal plus an addition: group privacy over two steps
        steps = 2 if plan.neighbouring == "replace" else 1
        step_epsilon = selection_epsilon / steps
        step_delta = selection_delta if steps == 1 else selection_delta / (1 + exp_capped(step_epsilon))
        per_group, total = plan.selection_moves  # what one neighbour moves in the counts selection reads
        selection = PartitionSelection(plan.selection_groups, step_epsilon, step_delta, per_group, total,
                                       plan.min_units)
        cost = Cost(selection_epsilon, selection_delta, selection_epsilon**2 / 2, selection_delta)
    chosen = [a for a in plan.aggregates if a.chosen]
    parts = len(plan.measures) + len(chosen) + (plan.top_k is not None)  # none when the keys' domain is listed
    share = (epsilon - selection_epsilon) / parts if parts else 0.0
    monotone = plan.neighbouring == "add-remove"  # counts only grow when a unit is added
    choosers = {a.name: ExponentialMechanism(plan.histogram[a.measures[0]].sensitivity, share,
                                             monotone=a.score == "count" and monotone) for a in chosen}
    for chooser in choosers.values():
        cost += Cost.pure(chooser.epsilon)
    top_k = None
    if plan.top_k is not None:
        top_k = ExponentialMechanism(plan.top_k.sensitivity, share / plan.top_k.k, plan.top_k.monotone)
        cost += Cost(share, 0.0, plan.top_k.k * top_k.epsilon**2 / 2, 0.0)
    if gaussian:
        measures_epsilon, measures_delta = share * len(plan.measures), delta - cost.delta
        rho = zcdp.rho_for(measures_epsilon, measures_delta) / len(plan.measures)
        mechanisms: dict[str, Noise] = {
            m.name: GaussianMechanism.calibrate(m.l2_sensitivity, rho, m.integer_valued, m.coordinates)
            for m in plan.measures}
        cost += Cost(measures_epsilon, measures_delta, sum(m.rho for m in mechanisms.values()), 0.0)
    elif histogram == "structurefirst":
        structure = _structure_first(plan, share)
        mechanisms = {plan.measures[0].name: structure.totals}
        # the fallback's one mechanism at the boundaries' and totals' ε together costs at least what they do
        cost += Cost.pure(structure.max_count.epsilon) + Cost.pure(structure.total.epsilon) \
            + Cost.pure(structure.fallback.epsilon)
    else:
        mechanisms = {m.name: LaplaceMechanism.calibrate(m.sensitivity, share, m.integer_valued, m.coordinates)
                      for m in plan.measures}
        for laplace in mechanisms.values():
            cost += Cost.pure(laplace.epsilon)
    return Calibration(mechanisms, choosers, selection, top_k, cost, selection_epsilon,
                       "gaussian" if gaussian else "laplace", histogram, structure)


def _counts_select_themselves(plan: Plan) -> bool:
    """Whether the query releases one count of units per group of private keys and nothing else: COUNT(DISTINCT
    unit), or COUNT(*) where a unit has at most one row in a group (a unit's own table). Then that noisy count
    can be the partition selection's too (one unit moves it by at most 1 in each of the max_groups groups it
    reaches, as selection assumes), and the count gets the whole ε instead of a share. A top-k over it is then
    post-processing: the released counts ordered and cut, as SmartNoise does, rather than peeling at a third of
    ε with the counts at another third (the peers' top 3 states: scale 1.5 -> 0.5 at ε = 2)."""
    if not plan.partition_selection or len(plan.measures) != 1 \
            or any(a.chosen for a in plan.aggregates) or plan.neighbouring != "add-remove":
        return False
    measure = plan.measures[0]
    one_per_group = measure.kind == "units" or (
        measure.kind == "count" and measure.expr is None and tuple(measure.unit_range) == (0, 1))
    return one_per_group and measure.sensitivity == plan.max_groups and plan.stability is None


def _self_selected(plan: Plan, epsilon: float, delta: float) -> Calibration | None:
    """The calibration where the count selects itself (`_counts_select_themselves`), or None. The threshold is
    the selection's for exactly the noise the count gets, so the two must have one scale."""
    if not _counts_select_themselves(plan):
        return None
    measure = plan.measures[0]
    selection = PartitionSelection(plan.max_groups, epsilon, delta, 1, None, plan.min_units)
    count = LaplaceMechanism.calibrate(measure.sensitivity, epsilon, True, measure.coordinates)
    if count.grid != 1 or Fraction(count.scale_units) != selection.scale:
        return None
    cost = Cost(epsilon, delta, epsilon**2 / 2, delta)
    return Calibration({measure.name: count}, {}, selection, None, cost, epsilon, "laplace", "plain",
                       selected_by=measure.name)


def _histogram_method(plan: Plan, requested: str) -> str:
    """The histogram method that applies: NoiseFirst to any ordered bins; StructureFirst to ordered bins of
    a single count with nothing else chosen or selected."""
    if requested == "plain" or not plan.ordered_bins or plan.top_k is not None or plan.partition_selection:
        return "plain"
    if requested == "structurefirst" and (len(plan.measures) != 1 or plan.measures[0].kind not in ("count", "units")
                                          or any(a.chosen for a in plan.aggregates)):
        return "plain"
    return requested


def _structure_first(plan: Plan, epsilon: float) -> StructureFirstPlan:
    measure = plan.measures[0]
    steps = 2 if plan.neighbouring == "replace" else 1
    per_bin = steps * max(abs(measure.unit_range[0]), abs(measure.unit_range[1]))
    return StructureFirstPlan.calibrate(len(plan.domain), measure.sensitivity, per_bin, epsilon, steps)


def add_noise(plan: Plan, calibration: Calibration, rows: Iterable[Sequence[Any]],
              histogram_rows: dict[str, Iterable[Sequence[Any]]]) -> list[NoisyGroup]:
    """Noisy measures and chosen quantiles per released group, from the backend rows (keys, measures,
    distinct units) and the histograms' rows (keys, cell, count)."""
    n_keys = len(plan.group_keys)
    names = [m.name for m in plan.measures]
    exact: dict[tuple, tuple[list[float], int]] = {}
    for row in rows:
        exact[released_key(row[:n_keys])] = ([_number(v) for v in row[n_keys:n_keys + len(names)]], int(row[-1] or 0))
    presampled: dict[tuple, dict[str, float]] = {}
    if calibration.selected_by is not None:  # the noisy count is released and selects its group
        index, mechanism = names.index(calibration.selected_by), calibration.mechanisms[calibration.selected_by]
        pool = [(key, exact.get(key, ([0.0] * len(names), 0))) for key in plan.domain] if plan.domain is not None \
            else list(exact.items())
        released = mechanism.release_many([values[index] for _, (values, _units) in pool])
        presampled = {key: {calibration.selected_by: value} for (key, _), value in zip(pool, released, strict=True)}
        candidates = [(key, value) for key, value in pool
                      if presampled[key][calibration.selected_by] >= calibration.selection.threshold]
    elif plan.domain is not None:
        zero = ([0.0] * len(names), 0)
        candidates = [(key, exact.get(key, zero)) for key in plan.domain]
        if plan.partition_selection:  # the minimum frequency: declared keys are selected too
            candidates = _selected(calibration.selection, candidates)
    elif not plan.grouped:
        candidates = [((), exact.get((), ([0.0] * len(names), 0)))]
    else:
        candidates = _selected(calibration.selection, list(exact.items()))
    if calibration.structure is not None:
        return _structure_first_release(plan, calibration.structure, candidates)
    key_gap = None
    if calibration.top_k is not None:  # (else the released counts select themselves: ORDER BY/LIMIT after)
        key_gap = calibration.top_k.utility_gap(max(len(candidates), 1))
        candidates = _top_k(plan, calibration, candidates, names.index(plan.top_k.measure))
    counts = {h.name: _cell_counts(h.cells, n_keys, histogram_rows[h.name]) for h in plan.histograms}
    chosen = [(a, plan.histogram[a.measures[0]], calibration.choosers[a.name]) for a in plan.aggregates if a.chosen]
    if calibration.selected_by is not None:
        noisy_groups = [presampled[key] for key, _ in candidates]
    else:  # each measure's noise for every released group in one batch
        columns = [calibration.mechanisms[name].release_many([values[i] for _, (values, _) in candidates])
                   for i, name in enumerate(names)]
        noisy_groups = [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)] if names \
            else [{} for _ in candidates]
    groups = []
    for (key, _), noisy in zip(candidates, noisy_groups, strict=True):
        choices = {}
        for agg, histogram, chooser in chosen:
            cells = counts[histogram.name].get(key, [0] * histogram.cells)
            scores = rank_scores(cells, agg.quantile) if agg.score == "rank" else cells
            choices[agg.name] = histogram.value(chooser.select(scores))
        groups.append(NoisyGroup(key, noisy, _in_rank_order(choices, chosen), key_gap))
    return groups


def _in_rank_order(choices: dict[str, Any], chosen: list) -> dict[str, Any]:
    """`choices` with the quantiles of one histogram and kind (percentile_cont(ARRAY[0.25, 0.5, 0.75]), or MIN
    beside MAX) in the order of their ranks: the chosen values sorted and handed out by rank. The truth is
    ordered so, and sorting estimates of an ordered truth moves none further from it (the rearrangement
    inequality); on 3,000 demo people a third of the quartile arrays by category came back out of order.
    Post-processing of released values: no ε."""
    runs: dict[tuple[str, str], list] = {}
    for agg, histogram, _ in chosen:
        if agg.score == "rank" and agg.quantile is not None:
            runs.setdefault((histogram.name, agg.kind), []).append(agg)
    for aggs in runs.values():
        if len(aggs) > 1:
            values = sorted(choices[a.name] for a in aggs)
            for agg, value in zip(sorted(aggs, key=lambda a: a.quantile), values, strict=True):
                choices[agg.name] = value
    return choices


def _selected(selection: PartitionSelection, candidates: list) -> list:
    """The candidates that partition selection releases, by their distinct units (or kept rows)."""
    kept = selection.keep_many([value[1] for _, value in candidates])
    return [candidate for candidate, keep in zip(candidates, kept, strict=True) if keep]


def _structure_first_release(plan: Plan, structure: StructureFirstPlan, candidates: list) -> list[NoisyGroup]:
    """Every bin's released value: StructureFirst's bucket means, or plain bins smoothed by NoiseFirst where
    StructureFirst would lose (`structure_first_or_noise_first`), each with its interval's scale factor."""
    name = plan.measures[0].name
    released, factors, _ = structure_first_or_noise_first([float(value[0][0]) for _, value in candidates], structure)
    return [NoisyGroup(key, {name: value}, {}, interval_factor={name: factor}, noise_shared=True)
            for (key, _), value, factor in zip(candidates, released, factors, strict=True)]


def _top_k(plan: Plan, calibration: Calibration, candidates: list, measure: int) -> list:
    """The candidates the top-k selection picks, best first, by their exact counts of the ordering measure."""
    one_round = calibration.top_k
    scores = [value[0][measure] for _, value in candidates]
    picks = top_k(scores, plan.top_k.k, one_round.sensitivity, one_round.epsilon * plan.top_k.k, one_round.monotone)
    return [candidates[i] for i in picks]


def _cell_counts(cells: int, n_keys: int, rows: Iterable[Sequence[Any]]) -> dict[tuple, list[int]]:
    """Dense per-group cell counts from (keys..., cell, count) rows."""
    out: dict[tuple, list[int]] = {}
    for row in rows:
        out.setdefault(released_key(row[:n_keys]), [0] * cells)[int(row[n_keys])] += int(row[n_keys + 1])
    return out


def released_key(values: Sequence[Any]) -> tuple:
    """A group's key as it is released: one spelling for every value its group's equality holds equal. The
    backend groups 5.0 with 5.00 (numeric) and -0 with 0 (float) and returns the spelling of the first row it met,
    so one unit's row would decide the text a client sees (probability 1 against 0, whatever ε). Numerics lose
    trailing fractional zeros (exactly: no rounding to a context's precision), -0.0 becomes 0.0 and every NaN one
    NaN. Text keys are grouped bytewise by the rewrite (`analysis.groups`); other types print one way per value."""
    return tuple(_canonical(v) for v in values)


def _canonical(value: Any) -> Any:
    if isinstance(value, float):
        return 0.0 if value == 0 else math.nan if math.isnan(value) else value
    if isinstance(value, Decimal) and value.is_finite():
        if value.is_zero():
            return Decimal(0)
        sign, digits, exponent = value.as_tuple()
        while exponent < 0 and digits[-1] == 0:
            digits, exponent = digits[:-1], exponent + 1
        return Decimal((sign, digits, exponent))
    if isinstance(value, Decimal) and value.is_nan():
        return Decimal("NaN")
    return value


def _number(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def noisy_bounds_effect(labels: list[str], counts: Sequence[Any], epsilon: float) -> dict:
    """The bounds' effect (`rewrite.bounds`) released: each count of units with discrete Laplace noise. One unit
    moves each count by at most 1, so the row's L1 sensitivity is the number of counts. Each count after the
    first is also given as a share of the first (the units read), with the interval of the ratio's ends."""
    mechanism = LaplaceMechanism.calibrate(len(labels), epsilon, True)
    noisy = [max(0.0, v) for v in mechanism.release_many([_number(c) for c in counts])]
    width = mechanism.ci_halfwidth()
    released = [{"label": label, "units": value, "low": max(0.0, value - width), "high": value + width}
                for label, value in zip(labels, noisy, strict=True)]
    total = noisy[0]
    for entry in released[1:]:
        entry["share"] = entry["units"] / total if total > 0 else None
    return {"epsilon": epsilon, "halfwidth": width, "counts": released}
