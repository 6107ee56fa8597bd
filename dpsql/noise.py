"""Calibrating and adding noise: the plan's statistics become noisy, with the cost read off the mechanisms.

`calibrate` splits a query's ε explicitly: a share to DP partition selection when group keys are private,
the rest equally across the distinct measures and quantiles (basic composition). Each measure's mechanism is
built from its sensitivity and its share, and the cost charged is what the mechanisms' own privacy maps
report. With the Gaussian mechanism the measures' shares together form an (ε, δ) target, met by the ρ whose
zCDP conversion gives exactly that; ρ is split equally across the measures, each noised by its L2
sensitivity (δ is split in half when partition selection needs some too).
`add_noise` turns the backend's exact rows into noisy groups: declared domains release every key (missing
ones as exact zeros before noise) and nothing else; private keys pass partition selection or are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dpsql.accounting import NO_COST, Cost, zcdp
from dpsql.analysis import Plan
from dpsql.mechanisms import (
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    PartitionSelection,
    rank_scores,
)

Noise = LaplaceMechanism | GaussianMechanism


@dataclass(frozen=True)
class Calibration:
    mechanisms: dict[str, Noise]  # measure name -> its mechanism
    choosers: dict[str, ExponentialMechanism]  # quantile aggregate name -> the mechanism choosing its cell
    selection: PartitionSelection | None
    cost: Cost  # what the answer costs, from the mechanisms' own privacy maps
    selection_epsilon: float  # the part of epsilon spent on partition selection
    mechanism: str = "laplace"  # laplace | gaussian: the noise on measures

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
    choices: dict[str, float]  # quantile aggregate name -> the chosen value


def calibrate(plan: Plan, epsilon: float, delta: float, selection_share: float,
              mechanism: str = "laplace") -> Calibration:
    """The mechanisms that answer `plan` for a total of `epsilon` (and `delta` if keys are private or the
    mechanism is Gaussian)."""
    gaussian = mechanism == "gaussian" and bool(plan.measures)
    selection, selection_epsilon, cost = None, 0.0, NO_COST
    if plan.partition_selection:
        selection_epsilon = epsilon * selection_share
        selection_delta = delta / 2 if gaussian else delta
        # under "replace" a neighbour is a removal plus an addition: group privacy over two steps
        steps = 2 if plan.neighbouring == "replace" else 1
        step_epsilon = selection_epsilon / steps
        step_delta = selection_delta if steps == 1 else selection_delta / (1 + math.exp(step_epsilon))
        selection = PartitionSelection(plan.max_groups, step_epsilon, step_delta)
        cost = Cost(selection_epsilon, selection_delta, selection_epsilon**2 / 2, selection_delta)
    quantiles = [a for a in plan.aggregates if a.kind == "quantile"]
    share = (epsilon - selection_epsilon) / (len(plan.measures) + len(quantiles))
    choosers = {a.name: ExponentialMechanism(plan.histogram[a.measures[0]].sensitivity, share) for a in quantiles}
    for chooser in choosers.values():
        cost += Cost.pure(chooser.epsilon)
    if gaussian:
        measures_epsilon, measures_delta = share * len(plan.measures), delta - cost.delta
        rho = zcdp.rho_for(measures_epsilon, measures_delta) / len(plan.measures)
        mechanisms: dict[str, Noise] = {
            m.name: GaussianMechanism.calibrate(m.l2_sensitivity, rho, m.integer_valued, m.coordinates)
            for m in plan.measures}
        cost += Cost(measures_epsilon, measures_delta, sum(m.rho for m in mechanisms.values()), 0.0)
    else:
        mechanisms = {m.name: LaplaceMechanism.calibrate(m.sensitivity, share, m.integer_valued, m.coordinates)
                      for m in plan.measures}
        for laplace in mechanisms.values():
            cost += Cost.pure(laplace.epsilon)
    return Calibration(mechanisms, choosers, selection, cost, selection_epsilon,
                       "gaussian" if gaussian else "laplace")


def add_noise(plan: Plan, calibration: Calibration, rows: Iterable[Sequence[Any]],
              histogram_rows: dict[str, Iterable[Sequence[Any]]]) -> list[NoisyGroup]:
    """Noisy measures and chosen quantiles per released group, from the backend rows (keys, measures,
    distinct units) and the histograms' rows (keys, cell, count)."""
    n_keys = len(plan.group_keys)
    names = [m.name for m in plan.measures]
    exact: dict[tuple, tuple[list[float], int]] = {}
    for row in rows:
        exact[tuple(row[:n_keys])] = ([_number(v) for v in row[n_keys:n_keys + len(names)]], int(row[-1] or 0))
    if plan.domain is not None:
        zero = ([0.0] * len(names), 0)
        candidates = [(key, exact.get(key, zero)) for key in plan.domain]
    elif not plan.grouped:
        candidates = [((), exact.get((), ([0.0] * len(names), 0)))]
    else:
        candidates = [(key, value) for key, value in exact.items()
                      if calibration.selection.keep(value[1])]
    counts = {h.name: _cell_counts(h.cells, n_keys, histogram_rows[h.name]) for h in plan.histograms}
    quantiles = [(a, plan.histogram[a.measures[0]], calibration.choosers[a.name])
                 for a in plan.aggregates if a.kind == "quantile"]
    groups = []
    for key, (values, _units) in candidates:
        noisy = {name: calibration.mechanisms[name].release(value) for name, value in zip(names, values, strict=True)}
        choices = {}
        for agg, histogram, chooser in quantiles:
            cells = counts[histogram.name].get(key, [0] * histogram.cells)
            choices[agg.name] = histogram.value(chooser.select(rank_scores(cells, agg.quantile)))
        groups.append(NoisyGroup(key, noisy, choices))
    return groups


def _cell_counts(cells: int, n_keys: int, rows: Iterable[Sequence[Any]]) -> dict[tuple, list[int]]:
    """Dense per-group cell counts from (keys..., cell, count) rows."""
    out: dict[tuple, list[int]] = {}
    for row in rows:
        out.setdefault(tuple(row[:n_keys]), [0] * cells)[int(row[n_keys])] += int(row[n_keys + 1])
    return out


def _number(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value
