"""The exponential mechanism, sampled exactly, with its privacy map and utility guarantee.

Candidate i is chosen with probability proportional to exp(ε·u_i / (2Δ)), where Δ bounds how much any
utility can move between neighbouring databases. When every utility moves in the same direction between
neighbours (counts under add-remove), exp(ε·u_i / Δ) is already ε-DP (McSherry-Talwar; "monotone").
Sampling is exact: propose a candidate from rational weights just above its own (`ENVELOPE`) and accept it
with the ratio, using the exact Bernoulli(exp(-γ)) sampler on rationals (u* the best utility, γ = ε·(u* - u_i)
/ (2Δ)); accepted draws follow the mechanism's distribution exactly, with no floating-point sampling. `top_k`
peels k candidates without replacement, each round with ε/k (basic composition).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpsql.mechanisms.samplers import (
    SYSTEM_RANDOM,
    Randomness,
    bernoulli_exp,
    bernoulli_times_inverse_e,
    check_positive,
)


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
        """Index of the chosen candidate, by rejection from an envelope that already follows the weights to
        within a factor e (see ENVELOPE): a uniform proposal over a histogram's 2,000 cells, most of them
        far from the asked rank, was accepted once in about 1,600 draws (93 ms per median at 100,000 people)."""
        if not utilities:
            raise ValueError("no candidates to choose from")
        if not all(math.isfinite(u) for u in utilities):
            raise ValueError("utilities must be finite")
        best = max(utilities)
        rate = self._rate
        levels = [_level(float(rate) * (best - u)) for u in utilities]
        cumulative = list(itertools.accumulate(_ENVELOPE_WEIGHTS[level] for level in levels))
        exact_best = Fraction(best)
        while True:
            i = bisect.bisect_right(cumulative, rng.randrange(cumulative[-1]))
            level = levels[i]
            # accepted with probability exp(-γ) / ENVELOPE^level = exp(-(γ - level)) · (e^-1 / ENVELOPE)^level
            if bernoulli_exp(rate * (exact_best - Fraction(utilities[i])) - level, rng) and all(
                    bernoulli_times_inverse_e(1 / ENVELOPE, rng) for _ in range(level)):
                return i

    def utility_gap(self, candidates: int, beta: float = 0.05) -> float:
        """With probability 1 - β the chosen utility is within this of the best: (2Δ/ε)(ln|R| + ln(1/β)),
        or (Δ/ε)(...) for monotone utilities."""
        return (math.log(candidates) + math.log(1 / beta)) / float(self._rate)


# The envelope: a candidate whose exponent γ = rate·(best - u) is at least `level` is proposed with weight
# ENVELOPE^level, a rational just above e^-level, so weights are exact integers; its acceptance then needs one
# Bernoulli(exp(-(γ - level))) and `level` coins of e^-1 / ENVELOPE (0.994 each). Levels stop at MAX_LEVEL:
# beyond, a candidate's weight is below 10^-17 of the best's, and it is proposed as rarely.
ENVELOPE = Fraction(37, 100)
MAX_LEVEL = 40
_ENVELOPE_WEIGHTS = [ENVELOPE.numerator ** level * ENVELOPE.denominator ** (MAX_LEVEL - level)
                     for level in range(MAX_LEVEL + 1)]


def _level(gamma: float) -> int:
    """An integer at most the exact γ that `gamma` approximates (one below its floor, against rounding)."""
    return MAX_LEVEL if gamma >= MAX_LEVEL + 2 else max(0, int(gamma) - 1)


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
