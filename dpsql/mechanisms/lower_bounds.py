"""Lower bounds on the error of any (ε, δ)-DP mechanism, to set beside the error a released value has.

Both come from neighbouring databases on which the statistic differs by its sensitivity Δ (one unit added):
- Expected error (the two-point bound of the metric-space DP literature): for D, D' with |f(D) − f(D')| = Δ,
  the events "within Δ/2 of f(D)" and "within Δ/2 of f(D')" are disjoint, so on one of the two databases any
  (ε, δ)-DP mechanism misses by at least Δ/2 with probability at least (1 − δ)/(1 + e^ε), and its expected
  absolute error is at least (1 − δ)·Δ / (2(1 + e^ε)).
- Confidence half-width: along a chain D_0, …, D_m of neighbours, f moving by Δ at each step, group privacy
  gives P_m(S) ≤ e^{mε}·P_0(S) + δ·(1 + e^ε + … + e^{(m−1)ε}). A mechanism within γ of f with probability
  1 − β on every database has disjoint accuracy sets for D_0 and D_m once mΔ > 2γ, so then
  1 − β ≤ e^{mε}·β + δ·Σ e^{iε}. With m₀ the least m for which that holds, γ ≥ (m₀ − 1)·Δ/2.
Neither depends on the data; both are minimax (the worst case over databases), as the noise is.
"""

from __future__ import annotations

import math

MAX_CHAIN = 10**7  # ε ≥ 1e-6 per query keeps m₀ far below this
MAX_EXPONENT = 700.0  # e^700 is past any 1 − β or δ bound, and below the float's range


def exp_capped(exponent: float) -> float:
    """e^exponent, at most e^MAX_EXPONENT: the privacy arithmetic stays finite at any ε an owner allows (at
    ε = 1,000, e^ε overflowed and an answer already charged failed)."""
    return math.exp(min(exponent, MAX_EXPONENT))


def expected_error_lower_bound(sensitivity: float, epsilon: float, delta: float = 0.0) -> float:
    """The least expected absolute error any (ε, δ)-DP mechanism can have on every database, for a statistic
    that one neighbour moves by `sensitivity`."""
    return (1 - delta) * sensitivity / (2 * (1 + exp_capped(epsilon)))


def halfwidth_lower_bound(sensitivity: float, epsilon: float, delta: float = 0.0, confidence: float = 0.95) -> float:
    """The least half-width γ that any (ε, δ)-DP mechanism can promise at `confidence` on every database (the
    value within γ of the truth with that probability), for a statistic one neighbour moves by `sensitivity`."""
    beta = 1 - confidence
    high = 1
    while high < MAX_CHAIN and not _possible(high, epsilon, delta, beta):
        high *= 2
    low = high // 2  # not possible at low (or low is 0); possible at high: the least m₀ lies in (low, high]
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if _possible(middle, epsilon, delta, beta) else (middle, high)
    return (high - 1) * sensitivity / 2


def _possible(steps: int, epsilon: float, delta: float, beta: float) -> bool:
    """Whether databases `steps` neighbours apart can both be answered within the half-width at 1 − β."""
    exponent = min(steps * epsilon, MAX_EXPONENT)
    chain_delta = delta * steps if epsilon == 0 else delta * math.expm1(exponent) / math.expm1(
        min(epsilon, MAX_EXPONENT))
    return 1 - beta <= math.exp(exponent) * beta + chain_delta
