"""The privacy-loss-distribution (PLD) account: the optimal composition of the answers' (ε, δ) guarantees.

Each answer is (ε_i, δ_i)-DP (its basic-composition cost). The worst mechanism with that guarantee has a known
privacy loss distribution, and composing those distributions gives the exact worst case of the sequence: the
optimal composition theorem (Kairouz, Oh and Viswanath), tighter than basic composition always and than the
zCDP conversion for pure-ε answers. Google's `dp-accounting` composes them on a grid, rounding pessimistically,
so the ε it reports is an upper bound. It knows nothing of the mechanisms inside an answer (discrete Laplace,
Gaussian), which would be tighter still; the ledger charges the best of this, zCDP and basic composition.
"""

from __future__ import annotations

import math
from functools import lru_cache

MAX_KINDS = 64  # distinct (ε, δ) pairs composed; beyond, the account is skipped (each pair is one convolution)
GRID = 1e-3  # privacy-loss grid: each answer's ε rounds up by less than this (1e-4 costs 10× the time per charge)

Charges = tuple[tuple[float, float, int], ...]  # (ε, δ, how many answers cost that), sorted


@lru_cache(maxsize=512)
def epsilon_of(charges: Charges, delta: float) -> float:
    """The ε at `delta` of the composition of `charges`; ∞ when it cannot be had at that δ or is not computed."""
    if not charges:
        return 0.0
    if not 0 < delta < 1 or len(charges) > MAX_KINDS:
        return math.inf
    from dp_accounting.pld import common, privacy_loss_distribution

    total = None
    for epsilon, answer_delta, count in charges:
        one = privacy_loss_distribution.from_privacy_parameters(
            common.DifferentialPrivacyParameters(epsilon, answer_delta), value_discretization_interval=GRID
        ).self_compose(count)
        total = one if total is None else total.compose(one)
    return float(total.get_epsilon_for_delta(delta))


def add(charges: Charges, epsilon: float, delta: float, count: int = 1) -> Charges:
    """`charges` with `count` more answers costing (ε, δ) each."""
    counts = {(e, d): n for e, d, n in charges}
    counts[(epsilon, delta)] = counts.get((epsilon, delta), 0) + count
    return tuple(sorted((e, d, n) for (e, d), n in counts.items()))
