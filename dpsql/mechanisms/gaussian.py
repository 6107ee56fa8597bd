"""The Gaussian mechanism on a power-of-two grid, with its zCDP privacy map next to its sampler.

Adding independent discrete Gaussian noise N_Z(0, σ²) to each coordinate of an integer vector whose L2
sensitivity is Δ is ρ-zCDP with ρ = Δ² / (2σ²) (Canonne, Kamath and Steinke 2020, Theorem 14). Real values
are rounded to the same kind of grid as the Laplace mechanism's; rounding can move each coordinate one more
grid step, so by Minkowski's inequality the L2 sensitivity in grid steps is Δ / grid + √coordinates.
L2 sensitivity is what makes Gaussian noise pay off: a unit that moves G groups by c each has L1 sensitivity
G·c but L2 sensitivity √G·c.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.laplace import CONFIDENCE, grid_for
from dpsql.mechanisms.samplers import SYSTEM_RANDOM, Randomness, check_positive, discrete_gaussian_batch

EXACT_TAIL_LIMIT = 1e6  # above this σ (in grid steps) the 95% interval uses the continuous normal's quantile


@dataclass(frozen=True)
class GaussianMechanism:
    """Adds discrete Gaussian noise of variance `sigma_squared_units` grid steps² to each coordinate."""

    sensitivity: float  # L2 sensitivity over all coordinates, in the statistic's own units
    grid: float  # spacing of the output grid: 1 for integer statistics, else a power of two
    sigma_squared_units: Fraction
    coordinates: int = 1  # how many coordinates (groups) one unit can move

    @classmethod
    def calibrate(cls, sensitivity: float, rho: float, integer_valued: bool,
                  coordinates: int = 1) -> GaussianMechanism:
        """The mechanism that is `rho`-zCDP (at most; within float rounding, never more) for the given
        L2 sensitivity."""
        check_positive("rho", rho)
        check_positive("sensitivity", sensitivity)
        exact = integer_valued and float(sensitivity).is_integer()
        grid = 1.0 if exact else grid_for(sensitivity / math.sqrt(2 * rho))
        mechanism = cls(sensitivity, grid, Fraction(1), coordinates)
        # round σ² up so that the reported ρ never exceeds the requested one
        sigma_squared = Fraction(mechanism.sensitivity_units**2 / (2 * rho)) * (1 + Fraction(1, 10**12))
        return cls(sensitivity, grid, sigma_squared, coordinates)

    @property
    def sensitivity_units(self) -> float:
        """L2 sensitivity in grid steps, including the step that rounding may add to each coordinate."""
        if self.grid == 1.0 and float(self.sensitivity).is_integer():
            return float(self.sensitivity)
        return self.sensitivity / self.grid + math.sqrt(self.coordinates)

    @property
    def rho(self) -> float:
        """The privacy map: this mechanism is rho-zCDP for the declared L2 sensitivity."""
        return self.sensitivity_units**2 / (2 * float(self.sigma_squared_units))

    @property
    def scale(self) -> float:
        """σ in the statistic's own units (the discrete Gaussian's standard deviation is at most σ)."""
        return math.sqrt(float(self.sigma_squared_units)) * self.grid

    @property
    def variance(self) -> float:
        return float(self.sigma_squared_units) * self.grid**2

    def release(self, value: float, rng: Randomness = SYSTEM_RANDOM) -> float:
        """The noisy value: the exact value rounded to the grid plus discrete Gaussian noise."""
        return self.release_many([value], rng)[0]

    def release_many(self, values: Sequence[float], rng: Randomness = SYSTEM_RANDOM) -> list[float]:
        """`release` of each value, with independent noise drawn in one batch."""
        noise = discrete_gaussian_batch(self.sigma_squared_units, len(values), rng)
        return [(round(value / self.grid) + z) * self.grid for value, z in zip(values, noise, strict=True)]

    def ci_halfwidth(self, confidence: float = CONFIDENCE) -> float:
        """Half-width w with P(|noise| > w) <= 1 - confidence, from the discrete Gaussian's exact tail."""
        sigma = math.sqrt(float(self.sigma_squared_units))
        if sigma > EXACT_TAIL_LIMIT:
            from scipy.stats import norm
            return math.ceil(norm.ppf(1 - (1 - confidence) / 2) * sigma) * self.grid
        z = np.arange(0, math.ceil(12 * sigma) + 2)
        weights = np.exp(-(z.astype(float) ** 2) / (2 * sigma * sigma))
        mass = np.where(z == 0, 1.0, 2.0) * weights  # P(|Z| = z), unnormalised
        beyond = np.cumsum(mass[::-1])[::-1] / mass.sum()  # beyond[m] = P(|Z| >= m)
        steps = int(np.argmax(beyond <= 1 - confidence)) - 1  # the last m with P(|Z| > m) <= 1 - confidence
        return max(steps, 0) * self.grid
