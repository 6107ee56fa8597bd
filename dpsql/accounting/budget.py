"""Budget arithmetic: what an answer costs in each account, and what an analyst has spent and has left.

Every charge is kept in three accounts of the same answers, and the analyst's spending is the best of them:
- basic composition: the εs and δs of the answers add up;
- zCDP: the ρs add up (ε-DP parts count ε²/2, Gaussian noise its own ρ), beside the δs of DP partition
  selection; the total converts to ε at what is left of the analyst's δ (`zcdp`);
- PLD: the answers' (ε, δ) pairs composed optimally through their privacy loss distributions, at the
  analyst's δ (`pld`).
Each is a valid guarantee of the whole sequence, so the smallest ε among them (at a δ within the budget) is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from dpsql.accounting import pld, zcdp
from dpsql.errors import InvalidParameter

TOLERANCE = 1e-9  # relative slack for floating-point sums of ε
# basic composition stays the account in use unless another saves more than 1% of ε: a smaller saving is not
# worth a guarantee at the whole δ (one answer at ε = 0.5 would otherwise read as 0.498 spent at δ = 1e-5)
BASIC_MARGIN = 1.01


@dataclass(frozen=True)
class Cost:
    """What one answer costs, in both accounts."""

    epsilon: float  # basic composition: the answer is (epsilon, delta)-DP
    delta: float
    rho: float  # zCDP: the answer is approx_delta-approximately rho-zCDP
    approx_delta: float

    @classmethod
    def pure(cls, epsilon: float) -> Cost:
        """An ε-DP part: ε²/2-zCDP."""
        return cls(epsilon, 0.0, epsilon * epsilon / 2, 0.0)

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.epsilon + other.epsilon, self.delta + other.delta, self.rho + other.rho,
                    self.approx_delta + other.approx_delta)


NO_COST = Cost(0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Budget:
    analyst: str
    epsilon_total: float
    delta_total: float
    epsilon_basic: float  # basic composition of every charge
    delta_basic: float
    rho: float  # zCDP composition of every charge
    approx_delta: float
    charges: pld.Charges = ()  # every charge's (ε, δ), counted: the PLD account composes them optimally

    @property
    def epsilon_zcdp(self) -> float:
        """ε of the zCDP account, converted at the δ left beside the partition selections' δs."""
        return zcdp.epsilon_of(self.rho, self.delta_total - self.approx_delta)

    @property
    def epsilon_pld(self) -> float:
        """ε of the PLD account: the optimal composition of the charges' (ε, δ), at the whole δ; ∞ unless the
        charges account for all that basic composition counts (spending recorded without its charges, as by
        ledgers older than the charges table, is not composed as if it were nothing)."""
        epsilon = sum(e * n for e, _, n in self.charges)
        delta = sum(d * n for _, d, n in self.charges)
        if not (math.isclose(epsilon, self.epsilon_basic, rel_tol=1e-9, abs_tol=1e-12)
                and math.isclose(delta, self.delta_basic, rel_tol=1e-9, abs_tol=1e-15)):
            return math.inf
        return pld.epsilon_of(self.charges, self.delta_total)

    @property
    def account(self) -> str:
        """The account whose guarantee is spent: basic composition while its δ fits and nothing is tighter, else
        the tighter of zCDP and PLD (both convert at the analyst's δ)."""
        basic = self.epsilon_basic if self.delta_basic <= self.delta_total * (1 + TOLERANCE) else math.inf
        if self.rho <= 0 or basic <= BASIC_MARGIN * min(self.epsilon_zcdp, self.epsilon_pld):
            return "basic"
        return "PLD" if self.epsilon_pld < self.epsilon_zcdp else "zCDP"

    @property
    def zcdp_is_better(self) -> bool:
        return self.account == "zCDP"

    @property
    def epsilon_spent(self) -> float:
        """ε spent: the best of the accounts."""
        return {"basic": self.epsilon_basic, "zCDP": self.epsilon_zcdp, "PLD": self.epsilon_pld}[self.account]

    @property
    def delta_spent(self) -> float:
        """δ of the guarantee so far: zCDP and PLD convert at the whole δ (zCDP at every δ that queries have not
        taken for themselves, PLD with theirs inside), so their guarantee is at the whole δ."""
        return self.delta_basic if self.account == "basic" else self.delta_total

    @property
    def delta_committed(self) -> float:
        """δ that answers took for themselves: partition selections' (and, under basic composition, Gaussian
        noise's). The rest is what later queries may still take; under zCDP it is also where ε is converted, so
        more δ (a grant, or fewer selections) lowers ε spent."""
        return self.approx_delta if self.account == "zCDP" else self.delta_basic

    @property
    def epsilon_left(self) -> float:
        return max(self.epsilon_total - self.epsilon_spent, 0.0)

    @property
    def delta_left(self) -> float:
        return max(self.delta_total - self.delta_committed, 0.0)

    def repeated(self, cost: Cost, times: int) -> Budget:
        """The budget once `times` more answers cost `cost` each."""
        return replace(self, epsilon_basic=self.epsilon_basic + times * cost.epsilon,
                       delta_basic=self.delta_basic + times * cost.delta, rho=self.rho + times * cost.rho,
                       approx_delta=self.approx_delta + times * cost.approx_delta,
                       charges=pld.add(self.charges, cost.epsilon, cost.delta, times))

    def answers_left(self, cost: Cost, most: int = 100_000) -> int:
        """How many more answers costing `cost` each the budget can pay for (up to `most`)."""
        low, high = 0, 1
        while high <= most and self.repeated(cost, high).within:
            low, high = high, high * 2
        high = min(high, most + 1)
        while high - low > 1:  # within at low, not at high
            middle = (low + high) // 2
            low, high = (middle, high) if self.repeated(cost, middle).within else (low, middle)
        return low

    def epsilon_after(self, cost: Cost) -> float:
        """How much more ε is spent once one more answer costs `cost` (less than its ε under zCDP)."""
        return max(self.plus(cost).epsilon_spent - self.epsilon_spent, 0.0)

    @property
    def within(self) -> bool:
        """Whether the spending fits the budget (under basic composition first: it needs no conversion)."""
        if (self.epsilon_basic <= self.epsilon_total * (1 + TOLERANCE)
                and self.delta_basic <= self.delta_total * (1 + TOLERANCE)):
            return True
        return (self.epsilon_spent <= self.epsilon_total * (1 + TOLERANCE)
                and self.delta_spent <= self.delta_total * (1 + TOLERANCE))

    def plus(self, cost: Cost) -> Budget:
        return self.repeated(cost, 1)


def group_guarantee(epsilon: float, delta: float, size: int) -> tuple[float, float]:
    """What an (ε, δ)-DP guarantee gives a group of `size` units (a household): (kε, k·e^{(k−1)ε}·δ), group
    privacy by the triangle inequality over the k single-unit steps."""
    if size <= 1:
        return epsilon, delta
    return size * epsilon, min(size * math.exp((size - 1) * epsilon) * delta, 1.0)


MIN_EPSILON = 1e-6  # of one query
MAX_DELTA = 1e-3  # of one query


def describe_budget(budget: Budget, next_epsilon: float | None = None, group_size: int = 1) -> str:
    """For people: spent and left, which account that comes from and what it guarantees (also to groups of
    `group_size` units), and (with `next_epsilon`) what one more query at that ε would spend."""
    line = (f"ε spent {budget.epsilon_spent:.4g} of {budget.epsilon_total:.4g} (left {budget.epsilon_left:.4g}), "
            f"δ taken {budget.delta_committed:.3g} of {budget.delta_total:.3g} (left {budget.delta_left:.3g}); ")
    guarantee = f"the guarantee so far is ({budget.epsilon_spent:.4g}, {budget.delta_spent:.3g})-DP"
    basic = f"basic composition would give ({budget.epsilon_basic:.4g}, {budget.delta_basic:.3g})"
    if budget.account == "zCDP":
        line += (f"zCDP account: ρ = {budget.rho:.4g}"
                 + (f" beside δ = {budget.approx_delta:.3g}" if budget.approx_delta else "")
                 + f", converted to ε at the δ not taken ({budget.delta_total - budget.approx_delta:.3g}), so "
                 f"{guarantee}; {basic}")
    elif budget.account == "PLD":
        line += (f"PLD account: the optimal composition of {sum(n for _, _, n in budget.charges)} answers' (ε, δ) at "
                 f"the whole δ, so {guarantee}; zCDP would give {budget.epsilon_zcdp:.4g}, {basic}")
    else:
        line += f"basic composition: {guarantee}"
    if group_size > 1:
        group_epsilon, group_delta = group_guarantee(budget.epsilon_spent, budget.delta_spent, group_size)
        line += f"; for groups of up to {group_size} units: ({group_epsilon:.4g}, {group_delta:.3g})-DP"
    if next_epsilon is not None:
        line += (f"; one more query at ε = {next_epsilon:g} without δ spends "
                 f"{budget.epsilon_after(Cost.pure(next_epsilon)):.4g}")
    return line


def validate_epsilon(epsilon: Any, what: str = "epsilon", allow_zero: bool = False) -> float:
    """A finite, positive ε (or δ), else InvalidParameter."""
    try:
        value = float(epsilon)
    except (TypeError, ValueError):
        raise InvalidParameter(f"{what} must be a number, got {epsilon!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise InvalidParameter(f"{what} must be a finite number {'>=' if allow_zero else '>'} 0, got {epsilon!r}")
    return value


def validate_query_privacy(epsilon: Any, delta: Any = None) -> float:
    """One query's ε, within [MIN_EPSILON, ∞) (and its δ within [0, MAX_DELTA]), else InvalidParameter. Below
    MIN_EPSILON an answer is noise alone, and the samplers' grids would leave the range of a float."""
    value = validate_epsilon(epsilon)
    if value < MIN_EPSILON:
        raise InvalidParameter(f"epsilon {epsilon!r} is below the minimum of {MIN_EPSILON:g} per query",
                               f"ask for an epsilon of at least {MIN_EPSILON:g}; smaller ones give answers of noise")
    if delta is not None and validate_epsilon(delta, "delta", allow_zero=True) > MAX_DELTA:
        raise InvalidParameter(f"delta {delta!r} is above the maximum of {MAX_DELTA:g} per query",
                               "a query may fail its guarantee with probability delta; keep it far below 1/n")
    return value
