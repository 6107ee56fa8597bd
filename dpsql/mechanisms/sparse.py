"""The sparse vector technique's AboveThreshold, turned to find the first of a fixed sequence of statistics that
falls below a threshold (Lyu, Su and Li, "Understanding the Sparse Vector Technique for Differential Privacy",
VLDB 2017, Algorithm 1 with one positive answer).

The threshold gets noise ρ of scale Δ/ε₁ once; each statistic in turn gets fresh noise ν of scale 2Δ/ε₂ and is
compared with the noisy threshold; the first below it is reported and the search stops. However many
statistics are compared, the report is (ε₁ + ε₂)-DP: this is what makes it cheaper than releasing each of J
statistics at ε/J when only the place where a curve flattens is wanted.

Where the statistics are monotone (on any two neighbours, every one of them moves the same way, as the counts
of units above each τ do when one unit is added or removed), ν needs only scale Δ/ε₂ (Lyu et al., Section 3):
against a neighbour whose statistics are larger, shifting ρ by Δ keeps every comparison before the reported one
and shifting the reported one's ν by Δ keeps it below; against one whose statistics are smaller, the earlier
comparisons hold unshifted and the reported one's ν shifts by Δ. Such a search gives the threshold two thirds
of ε and the comparisons one third (`calibrate`): its noise ρ is what lets a search run on past the end of the
data (with ρ low, statistics of 0 must each draw their own way below it), so it takes the larger share. On the
demo's totals at 3,000 people (`race.units_above`, 6,000 seeded searches at ε = 0.2, the threshold at one
scale of an even split's comparisons) the searches that stopped at 4 or more times the usual τ went from 6.9%
to 4.3%, those that ran to the end from 0.9% to 0.5%, and the usual τ stayed the usual one. Through the
engine, SUM(amount) by category at 3,000 people and ε = 1 (200 answers each, `race.decide`'s fallback): bounds
of twice the one that keeps every total (8,192) or more went from 26% of answers (4 at the cap) to 13.5% (none),
and the errors' 99th percentile from 220% to 144%, their root mean square from 74% to 65%, at the same median
(9.1% and 9.4%) and coverage (95.3% and 94.5%). TPC-H SF1 at ε = 0.1 (1,000 of the engine's choices over
the race's exact values, `bounded_by_race`): bounds of 16,384 or more went from 2.5% to 1.2% of choices for Q11
(usual bound 1,024) and from 7.9% to 4.2% for Q20 (usual 4,096), the cap from 0.4% and 0.9% to 0.2% and 0.2%;
at ε = 0.8 from 0.4% to 0.7% (4 at the cap against 2) and from 2.0% to 1.6%.

Values and threshold are compared on one power-of-two grid, as the Laplace mechanism releases them: each value
is rounded to the grid, which moves it by at most one grid step more than its exact change between
neighbours, so the sensitivity in grid steps is floor(Δ / grid) + 1. The noise is discrete Laplace in grid steps;
the proof's shifts (the threshold by the sensitivity, the reported statistic's noise by twice it) are whole grid
steps, so the density ratios are exactly e^ε₁ and e^ε₂ as in the continuous proof.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from dpsql.mechanisms.laplace import grid_for
from dpsql.mechanisms.samplers import SYSTEM_RANDOM, Randomness, check_positive, discrete_laplace_batch


@dataclass(frozen=True)
class FirstBelowThreshold:
    """Reports the index of the first statistic below a threshold, each of L1 sensitivity Δ, at ε in all."""

    sensitivity: float
    grid: float  # values and threshold are compared in steps of this spacing
    threshold_scale: Fraction  # ρ's scale, in grid steps
    value_scale: Fraction  # each ν's scale, in grid steps
    monotone: bool = False  # the statistics move together on neighbours: ν's scale is Δ/ε₂, not 2Δ/ε₂

    @classmethod
    def calibrate(cls, sensitivity: float, epsilon: float, monotone: bool = False) -> FirstBelowThreshold:
        """ε split evenly between the threshold's noise and the statistics' (Lyu et al.'s choice for one
        positive answer is close to this; an even split keeps the proof plain); for `monotone` statistics,
        two thirds to the threshold and ν at Δ/ε₂ (the module's text)."""
        check_positive("epsilon", epsilon)
        check_positive("sensitivity", sensitivity)
        unscaled = cls(sensitivity, grid_for(sensitivity / epsilon), Fraction(1), Fraction(1))
        steps, total = Fraction(unscaled.sensitivity_units), Fraction(epsilon)
        if monotone:
            return cls(sensitivity, unscaled.grid, steps / (total * 2 / 3), steps / (total / 3), True)
        return cls(sensitivity, unscaled.grid, steps / (total / 2), 2 * steps / (total / 2))

    @property
    def sensitivity_units(self) -> int:
        """Δ in grid steps, with the step that rounding may add."""
        return int(self.sensitivity // self.grid) + 1

    @property
    def value_noise(self) -> float:
        """ν's scale in the statistics' own units (a public constant: ε and Δ only)."""
        return float(self.value_scale) * self.grid

    @property
    def epsilon(self) -> float:
        """The privacy map: ε₁ + ε₂, from the two noise scales."""
        steps = self.sensitivity_units
        return float(steps / self.threshold_scale + (1 if self.monotone else 2) * steps / self.value_scale)

    def first_below(self, values: Sequence[float], threshold: float, rng: Randomness = SYSTEM_RANDOM) -> int | None:
        """The index of the first value whose noisy copy lies below the noisy threshold; None if none does.
        Draws the threshold's noise, then one draw per value compared, in order."""
        (rho,) = discrete_laplace_batch(self.threshold_scale, 1, rng)
        noisy_threshold = round(threshold / self.grid) + rho
        for index, value in enumerate(values):
            (nu,) = discrete_laplace_batch(self.value_scale, 1, rng)
            if round(value / self.grid) + nu < noisy_threshold:
                return index
        return None


__all__ = ["FirstBelowThreshold"]
