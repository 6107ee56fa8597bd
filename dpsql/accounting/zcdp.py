"""Zero-concentrated DP (zCDP) and its conversion to (ε, δ)-DP, through Google's `dp-accounting`.

ρ-zCDP composes by adding ρ, and any ε-DP mechanism is ε²/2-zCDP (Bun and Steinke 2016), so the ledger can
compose Laplace, exponential-mechanism and Gaussian answers in one currency. An (ε, δ)-DP mechanism (DP
partition selection) is δ-approximately ε²/2-zCDP: the δs add up beside the ρs. The conversion of a total ρ
to ε at a given δ is dp-accounting's RDP conversion (RDP of order α is αρ; Balle et al. 2020's conversion),
which is tighter than ρ + 2√(ρ ln(1/δ)).
"""

from __future__ import annotations

import math
from functools import lru_cache

BISECTION_STEPS = 60


@lru_cache(maxsize=4096)
def epsilon_of(rho: float, delta: float) -> float:
    """The ε of (ε, δ)-DP implied by ρ-zCDP."""
    if rho <= 0:
        return 0.0
    if not 0 < delta < 1:
        return math.inf
    import dp_accounting  # imported here: it takes about a second and only budgets need it
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    accountant.compose(dp_accounting.ZCDpEvent(rho))
    return float(accountant.get_epsilon(delta))


@lru_cache(maxsize=1024)
def rho_for(epsilon: float, delta: float) -> float:
    """The largest ρ (to within 1e-12 relative) whose conversion at δ gives at most ε."""
    low, high = 0.0, max(epsilon, 1.0)
    while epsilon_of(high, delta) <= epsilon:
        high *= 2
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        if epsilon_of(middle, delta) <= epsilon:
            low = middle
        else:
            high = middle
    return low
