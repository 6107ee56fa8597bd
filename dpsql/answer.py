"""What the engine returns: a query's answer (noisy rows with their accuracy, and what they cost), a release's
output, and the exact statistics a release's own mechanism reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dpsql.accounting import Budget, Cost
from dpsql.analysis import Plan
from dpsql.postprocess import INTERVALS_COVER, Accuracy


@dataclass
class Answer:
    """Noisy rows with their accuracy, and what they cost."""

    names: list[str]
    types: list[str]
    rows: list[tuple]
    accuracy: list[tuple[Accuracy | None, ...]]
    epsilon: float  # charged for this answer (0 when it came from the cache)
    delta: float
    cached: bool = False
    budget: Budget | None = None
    noisy: list[bool] | None = None  # per column: computed from noisy aggregates
    intervals_cover: str = INTERVALS_COVER  # what the 95% intervals account for, said beside them
    bounds_effect: dict | None = None  # asked for (dpsql.bounds_epsilon): how many units the bounds cut or clamp
    notes: list[str] = field(default_factory=list)  # for the analyst, beside the rows (why groups may be missing)
    explained: tuple[str, ...] = ()  # noisy columns without an interval whose note says what they are instead
    # (a decision read off an interval, a count of the values present)

    def cost(self) -> dict[str, Any]:
        """What this answer cost and what is left, for scripts (JSON output, a DataFrame's attrs)."""
        cost: dict[str, Any] = {"epsilon_spent": self.epsilon, "delta_spent": self.delta, "cached": self.cached}
        if self.budget is not None:
            cost["budget_left"] = {"epsilon": self.budget.epsilon_left, "delta": self.budget.delta_left}
        if self.bounds_effect is not None:
            cost["bounds_effect"] = self.bounds_effect
        return cost

    def with_intervals(self, every_measure: bool = False) -> Answer:
        """The answer with two more columns after each noisy one: the bounds of its 95% confidence interval
        (NULL where the value has none, such as a quantile, which reports a rank error instead). With
        `every_measure`, also `<name>_rank_error` and `<name>_count_gap` after the columns that report them."""
        noisy = self.noisy or [False] * len(self.names)
        names, types, picks = [], [], []
        for i, (name, type_name) in enumerate(zip(self.names, self.types, strict=True)):
            names.append(name)
            types.append(type_name)
            picks.append((i, None))
            measures = ["ci_low", "ci_high"] if noisy[i] else []
            if every_measure:  # also a top-n key's count gap
                measures += [m for m in ("rank_error", "count_gap")
                             if any(acc[i] is not None and getattr(acc[i], m) is not None for acc in self.accuracy)]
            names += [f"{name}_{measure}" for measure in measures]
            types += ["float8"] * len(measures)
            picks += [(i, measure) for measure in measures]
        rows = [tuple(row[i] if measure is None else getattr(acc[i], measure, None) if acc[i] else None
                      for i, measure in picks) for row, acc in zip(self.rows, self.accuracy, strict=True)]
        accuracy = [tuple(acc[i] if measure is None else None for i, measure in picks) for acc in self.accuracy]
        return replace(self, names=names, types=types, rows=rows, accuracy=accuracy,
                       noisy=[measure is None and noisy[i] for i, measure in picks])

    def without_interval_noted(self) -> Answer:
        """The answer with a note naming each noisy column that has no interval, rank error or count gap in any
        row (an expression over released rows whose noise is not combined), unless its own note says what it is
        (`explained`): its uncertainty is not shown, and the analyst should know that rather than read the value
        as exact."""
        noisy = self.noisy or [False] * len(self.names)
        bare = [name for i, name in enumerate(self.names) if noisy[i] and self.rows and name not in self.explained
                and all(acc[i] is None or acc[i].ci_low is None and acc[i].rank_error is None
                        and acc[i].count_gap is None for acc in self.accuracy)]
        if not bare:
            return self
        return replace(self, notes=[*self.notes, f"{without_interval(bare)}: the noise of the values it is computed "
                                    "from is not combined here; ask for those values themselves to see their "
                                    "intervals"])


def without_interval(names: Sequence[str]) -> str:
    """The start of a note on columns shown without an interval: "a has no 95% interval", "a, b have ..."."""
    return f"{', '.join(names)} {'has' if len(names) == 1 else 'have'} no 95% interval"


@dataclass(frozen=True)
class Statistic:
    """The exact, bounded rows of one query of a release (group keys, then measures, then distinct units), for
    the release's own mechanism: they never leave the process unnoised."""

    plan: Plan
    rows: list[tuple]

    def totals(self, measure: int = 0) -> dict[tuple, float]:
        """Each group's value of one measure (every key of the declared domain, 0 where no row fell)."""
        n_keys = len(self.plan.group_keys)
        found = {tuple(r[:n_keys]): float(r[n_keys + measure] or 0) for r in self.rows}
        keys = self.plan.domain if self.plan.domain is not None else [()]
        return {tuple(k): found.get(tuple(k), 0.0) for k in keys}

    @property
    def sensitivity(self) -> float:
        """How far one unit moves the first measure over all groups together (L1)."""
        return self.plan.measures[0].sensitivity


@dataclass(frozen=True)
class Released:
    output: dict
    budget: Budget | None
    cost: Cost
    cached: bool
