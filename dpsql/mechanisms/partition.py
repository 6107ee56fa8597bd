"""DP partition selection: which group keys may be released when the keys themselves are private.

Each group's count of distinct units gets discrete Laplace noise, and the group is released only when the
noisy count reaches a threshold. A unit touches at most `max_groups` groups, each by one, so the counts have
L1 sensitivity `max_groups` (pure ε part). A group that exists only because of one unit has count 1; the
threshold is set so that the chance that any of that unit's groups gets released is at most δ. Under row-level
privacy with joins the counts are of joined rows: one neighbour moves a group's count by up to `per_group` and
all counts by up to `total`, and a group that exists only because of it has count at most `per_group`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpsql.mechanisms.samplers import SYSTEM_RANDOM, Randomness, check_positive, discrete_laplace_batch


@dataclass(frozen=True)
class PartitionSelection:
    max_groups: int  # groups one unit may touch
    epsilon: float
    delta: float
    per_group: int = 1  # how far one unit moves one group's count (1: counts of distinct units)
    total: int | None = None  # how far it moves all counts together (default max_groups · per_group)
    min_units: int = 1  # the minimum frequency: a group of fewer units is released with probability ≤ δ

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        if not (0 < self.delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")

    @property
    def scale(self) -> Fraction:
        total = self.max_groups * self.per_group if self.total is None else self.total
        return Fraction(total) / Fraction(self.epsilon)

    @property
    def threshold(self) -> int:
        """Smallest T with max_groups · P(c + Z >= T) <= δ for the count c of a group with one unit, or with
        min_units − 1 units under a minimum frequency; a group is released when count + Z >= T.

        For discrete Laplace of scale t and q = exp(-1/t): P(Z >= m) = q^m / (1 + q) for m >= 1.
        """
        t = float(self.scale)
        q = math.exp(-1 / t)
        m = math.ceil(t * math.log(self.max_groups / (self.delta * (1 + q))))
        return self.per_group * max(self.min_units - 1, 1) + max(m, 1)

    def keep(self, distinct_units: int, rng: Randomness = SYSTEM_RANDOM) -> bool:
        """Whether to release a group that `distinct_units` units contributed to."""
        return self.keep_many([distinct_units], rng)[0]

    def keep_many(self, distinct_units: Sequence[int], rng: Randomness = SYSTEM_RANDOM) -> list[bool]:
        """`keep` for each group, with independent noise drawn in one batch."""
        threshold = self.threshold
        noise = discrete_laplace_batch(self.scale, len(distinct_units), rng)
        return [units + z >= threshold for units, z in zip(distinct_units, noise, strict=True)]
