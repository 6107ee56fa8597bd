"""Budget arithmetic: what an answer costs in each account, and when the ledger must stop an analyst.

The ledger is a privacy filter: analysts choose each query's ε after seeing earlier answers, and stop when they
like, so a composition theorem for parameters fixed in advance does not apply (Rogers, Roth, Ullman and Vadhan,
"Privacy Odometers and Filters", NeurIPS 2016). It uses only filters proved valid under such fully adaptive
composition, each with a target (ε, δ) fixed by the analyst's budget alone (never by what was spent):

- basic composition: admit while Σε_i <= ε and Σδ_i <= δ_basic. The basic composition filter is valid (Rogers
  et al. 2016; Whitehouse, Ramdas, Rogers and Wu, "Fully-Adaptive Composition in Differential Privacy", ICML
  2023, restate it): the whole interaction is (ε, δ_basic)-DP.
- zCDP: admit while Σρ_i <= ρ and Σδ'_i <= δ_selection, where each answer is δ'_i-approximately ρ_i-zCDP (ε-DP
  parts count ε²/2, Gaussian noise its own ρ, DP partition selection its δ beside). Whitehouse et al. (2023)
  prove this approximate-zCDP filter valid: the interaction is δ_selection-approximately ρ-zCDP (for exact zCDP
  it is the Rényi filter of Feldman and Zrnic, "Individual Privacy Accounting via a Rényi Filter", NeurIPS 2021,
  at every order at once). ρ is the largest whose conversion at δ_conversion is ε (`zcdp`), so the interaction is
  (ε, δ_selection + δ_conversion)-DP.
- the ledger admits a query when either filter admits it. That is itself a valid filter at (ε, δ_basic +
  δ_selection + δ_conversion), with the three shares of the analyst's δ fixed below: both targets are monotone, so
  a run that ends admitted by basic composition was admitted by it throughout, and equals its run under the basic
  filter alone; for any set S of outcomes, P_D(S) = P_D(S, basic held) + P_D(S, basic failed and zCDP held), the
  first at most e^ε·P_D'(S, basic held) + δ_basic by the basic filter's guarantee and the second at most
  e^ε·P_D'(S, …) + δ_selection + δ_conversion by the zCDP filter's (the event is decided by the run's own
  outcomes, so it is a set of outcomes of each stopped run). Summing gives (ε, δ).
- not used: the optimal composition of the answers' (ε, δ) through their privacy loss distributions (PLD). It is
  not a valid filter: an adaptive analyst can push the natural approximate-DP and f-DP filters past their target
  (Tran, Koskela, Räisä and Honkela 2026, "f-Differential Privacy Filters: Validity and Approximate Solutions";
  "Privacy Filters are Captured by Residues", 2026). It was dropped from the ledger for that reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from dpsql.accounting import zcdp
from dpsql.errors import InvalidParameter
from dpsql.mechanisms import exp_capped

TOLERANCE = 1e-9  # relative slack for floating-point sums of ε
# basic composition stays the account shown unless zCDP saves more than 1% of ε
BASIC_MARGIN = 1.01
# the analyst's δ, split once between the filters (see the module docstring): basic composition's answers' δs;
# the zCDP filter's answers' δs (partition selection); the zCDP filter's conversion of ρ to ε
BASIC_DELTA_SHARE, SELECTION_DELTA_SHARE, CONVERSION_DELTA_SHARE = 0.5, 0.25, 0.25


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

    @property
    def basic_delta_room(self) -> float:
        """The basic composition filter's δ: what its answers' δs may add up to."""
        return self.delta_total * BASIC_DELTA_SHARE

    @property
    def selection_delta_room(self) -> float:
        """The zCDP filter's room for its answers' own δs (DP partition selection)."""
        return self.delta_total * SELECTION_DELTA_SHARE

    @property
    def conversion_delta(self) -> float:
        """The δ at which the zCDP filter converts ρ to ε."""
        return self.delta_total * CONVERSION_DELTA_SHARE

    @property
    def epsilon_zcdp(self) -> float:
        """ε of the zCDP account, converted at the zCDP filter's fixed δ."""
        return zcdp.epsilon_of(self.rho, self.conversion_delta)

    @property
    def basic_holds(self) -> bool:
        """Whether the basic composition filter admits the spending."""
        return (self.epsilon_basic <= self.epsilon_total * (1 + TOLERANCE)
                and self.delta_basic <= self.basic_delta_room * (1 + TOLERANCE))

    @property
    def zcdp_holds(self) -> bool:
        """Whether the approximate-zCDP filter admits the spending."""
        return (self.approx_delta <= self.selection_delta_room * (1 + TOLERANCE)
                and self.epsilon_zcdp <= self.epsilon_total * (1 + TOLERANCE))

    @property
    def account(self) -> str:
        """The filter whose account is shown: basic composition while it holds and zCDP is not clearly tighter."""
        if self.basic_holds and (not self.zcdp_holds or self.rho <= 0
                                 or self.epsilon_basic <= BASIC_MARGIN * self.epsilon_zcdp):
            return "basic"
        return "zCDP" if self.zcdp_holds else "basic"

    @property
    def zcdp_is_better(self) -> bool:
        return self.account == "zCDP"

    @property
    def epsilon_spent(self) -> float:
        """ε spent by the account shown."""
        return self.epsilon_basic if self.account == "basic" else self.epsilon_zcdp

    @property
    def delta_spent(self) -> float:
        """δ of the account shown: the answers' δs under basic composition; under zCDP, its filter's δ."""
        if self.account == "basic":
            return self.delta_basic
        return self.selection_delta_room + self.conversion_delta

    @property
    def delta_committed(self) -> float:
        """δ that answers took for themselves, in the account shown (partition selections', and under basic
        composition Gaussian noise's)."""
        return self.approx_delta if self.account == "zCDP" else self.delta_basic

    @property
    def epsilon_left(self) -> float:
        return max(self.epsilon_total - self.epsilon_spent, 0.0)

    @property
    def delta_left(self) -> float:
        """What later answers may still take for themselves, in the account shown."""
        room = self.selection_delta_room if self.account == "zCDP" else self.basic_delta_room
        return max(room - self.delta_committed, 0.0)

    def repeated(self, cost: Cost, times: int) -> Budget:
        """The budget once `times` more answers cost `cost` each."""
        return replace(self, epsilon_basic=self.epsilon_basic + times * cost.epsilon,
                       delta_basic=self.delta_basic + times * cost.delta, rho=self.rho + times * cost.rho,
                       approx_delta=self.approx_delta + times * cost.approx_delta)

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
        """Whether either filter admits the spending (see the module docstring for why that is a filter)."""
        return self.basic_holds or self.zcdp_holds

    def plus(self, cost: Cost) -> Budget:
        return self.repeated(cost, 1)


def group_guarantee(epsilon: float, delta: float, size: int) -> tuple[float, float]:
    """What an (ε, δ)-DP guarantee gives a group of `size` units (a household): (kε, k·e^{(k−1)ε}·δ), group
    privacy by the triangle inequality over the k single-unit steps."""
    if size <= 1:
        return epsilon, delta
    return size * epsilon, min(size * exp_capped((size - 1) * epsilon) * delta, 1.0)


MIN_EPSILON = 1e-6  # of one query
MAX_DELTA = 1e-3  # of one query


def describe_budget(budget: Budget, next_epsilon: float | None = None, group_size: int = 1) -> str:
    """For people: spent and left, which account that comes from and what it guarantees (also to groups of
    `group_size` units), and (with `next_epsilon`) what one more query at that ε would spend."""
    line = (f"ε spent {budget.epsilon_spent:.4g} of {budget.epsilon_total:.4g} (left {budget.epsilon_left:.4g}), "
            f"δ taken {budget.delta_committed:.3g} (left {budget.delta_left:.3g}); ")
    guarantee = f"the guarantee so far is ({budget.epsilon_spent:.4g}, {budget.delta_spent:.3g})-DP"
    basic = f"basic composition would give ({budget.epsilon_basic:.4g}, {budget.delta_basic:.3g})"
    if budget.account == "zCDP":
        line += (f"zCDP account: ρ = {budget.rho:.4g}"
                 + (f" beside δ = {budget.approx_delta:.3g}" if budget.approx_delta else "")
                 + f", converted to ε at δ = {budget.conversion_delta:.3g}, so {guarantee}; {basic}")
    else:
        line += f"basic composition: {guarantee}"
    line += (f"; the ledger stops at ({budget.epsilon_total:.4g}, {budget.delta_total:.3g})-DP whatever is asked "
             "(two privacy filters, basic composition and zCDP, each with its share of δ)")
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
