"""The exponential mechanism, sampled exactly, with its privacy map and utility guarantee.

Candidate i is chosen with probability proportional to exp(ε·u_i / (2Δ)), where Δ bounds how much any
utility can move between neighbouring databases. When every utility moves in the same direction between
neighbours (counts under add-remove), exp(ε·u_i / Δ) is already ε-DP (McSherry-Talwar; "monotone").
Sampling is exact: draw a candidate uniformly and accept it with probability exp(-ε·(u* - u_i) / (2Δ))
(u* the best utility), using the exact Bernoulli(exp(-γ)) sampler on rationals; accepted draws follow the
mechanism's distribution exactly, with no floating-point sampling. `top_k` peels k candidates without
replacement, each round with ε/k (basic composition).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpsql.mechanisms.samplers import SYSTEM_RANDOM, Randomness, bernoulli_exp, check_positive


@dataclass(frozen=True)
class ExponentialMechanism:
    sensitivity: float  # Δ: the most any candidate's utility moves between neighbouring databases
    epsilon: float  # the privacy map: one selection is epsilon-DP
    monotone: bool = False  # all utilities move in the same direction between neighbours

    @property
    def _rate(self) -> Fraction:
        """ε / (2Δ), or ε / Δ for monotone utilities: the weight of a candidate is exp(rate · u)."""
        return Fraction(self.epsilon) / ((1 if self.monotone else 2) * Fraction(self.sensitivity))

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        check_positive("sensitivity", self.sensitivity)

    def probabilities(self, utilities: Sequence[float]) -> list[float]:
        """The selection probability of each candidate (for tests and accuracy reports)."""
        best = max(utilities)
        rate = float(self._rate)
        weights = [math.exp(rate * (u - best)) for u in utilities]
        total = sum(weights)
        return [w / total for w in weights]

    def select(self, utilities: Sequence[float], rng: Randomness = SYSTEM_RANDOM) -> int:
        """Index of the chosen candidate."""
        if not utilities:
            raise ValueError("no candidates to choose from")
        if not all(math.isfinite(u) for u in utilities):
            raise ValueError("utilities must be finite")
        best = Fraction(max(utilities))
        rate = self._rate
        while True:
            i = rng.randrange(len(utilities))
            if bernoulli_exp(rate * (best - Fraction(utilities[i])), rng):
                return i

    def utility_gap(self, candidates: int, beta: float = 0.05) -> float:
        """With probability 1 - β the chosen utility is within this of the best: (2Δ/ε)(ln|R| + ln(1/β)),
        or (Δ/ε)(...) for monotone utilities."""
        return (math.log(candidates) + math.log(1 / beta)) / float(self._rate)


def rank_scores(counts: Sequence[int], quantile: float) -> list[float]:
    """Score of each ordered cell as the `quantile` of the values counted in `counts`: minus the distance
    from the target rank to the ranks the cell spans. Adding or removing k values moves every score by at
    most k. The target rank is kept inside [0.5, n - 0.5], so MIN and MAX favour the first and last
    non-empty cells rather than every empty cell beyond them."""
    n = sum(counts)
    target = min(max(quantile * n, 0.5), n - 0.5) if n else 0.0
    scores, below = [], 0
    for count in counts:
        upto = below + count
        scores.append(-max(0.0, below - target, target - upto))
        below = upto
    return scores


def top_k(utilities: Sequence[float], k: int, sensitivity: float, epsilon: float, monotone: bool = False,
          rng: Randomness = SYSTEM_RANDOM) -> list[int]:
    """k distinct candidates, best first, by k rounds of the exponential mechanism at ε/k each."""
    k = min(k, len(utilities))
    if k < 1:
        return []
    round_mechanism = ExponentialMechanism(sensitivity, epsilon / k, monotone)
    remaining = list(range(len(utilities)))
    chosen = []
    for _ in range(k):
        pick = round_mechanism.select([utilities[i] for i in remaining], rng)
        chosen.append(remaining.pop(pick))
    return chosen
