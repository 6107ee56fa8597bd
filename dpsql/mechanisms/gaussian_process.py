"""The Gaussian-process mechanism (Hall, Rinaldo and Wasserman, "Differential privacy for functions and functional
data", JMLR 2013): a function f in the reproducing-kernel Hilbert space of a kernel K, whose RKHS norm one unit
moves by at most Δ, is released on any finite set of points as f + σ·G, where G is a zero-mean Gaussian process
with covariance K.

Why it is private: on points x₁..x_m with Gram matrix M, the change v = f_D - f_D' satisfies vᵀM⁻¹v ≤ ‖f_D -
f_D'‖²_H ≤ Δ² (Hall et al., Prop. 7), so the release is the Gaussian mechanism in the Mahalanobis norm of M with
sensitivity Δ: ρ-zCDP with ρ = Δ² / (2σ²), on every set of points at once. dpsql converts the release's (ε, δ)
to ρ as it does for Gaussian counts.

The process is sampled on the points from M's eigendecomposition with normal draws from a generator seeded by the
OS (tests inject a seeded one); the released values are rounded to a power-of-two grid about 1/1024 of σ, so no
float's low bits carry more than the noise allows (the rounding is post-processing).

The covariance sampled is never less than the proof's. A Gram matrix on a fine grid is numerically singular: its
computed eigenvalues run down to about ±n·ε_machine·‖M‖, some negative. Clipping them at 0 would draw *no* noise
along those directions, where the proof assumes σ²·λ (tiny, but the released values would then hold f's exact
component there, and float error in f is not bounded by λ). So every eigenvalue is raised by JITTER·‖M‖, a
thousand times the eigendecomposition's error: the covariance drawn is σ²(M + E) with E positive semidefinite,
which is the proof's mechanism plus independent Gaussian noise (post-processing), at a cost in accuracy of a
standard deviation σ·√(JITTER·‖M‖), about 10⁻⁵σ.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np

from dpsql.mechanisms.laplace import grid_for
from dpsql.mechanisms.samplers import check_positive

JITTER = 1e-10  # relative to the Gram matrix's largest eigenvalue (its eigendecomposition errs by about 1e-14)


def gaussian_kernel(x: np.ndarray, y: np.ndarray, bandwidth: float) -> np.ndarray:
    """K(x, y) = exp(-(x - y)² / (2h²)) for every pair of points of x and y (one-dimensional)."""
    return np.exp(-((np.asarray(x)[:, None] - np.asarray(y)[None, :]) ** 2) / (2 * bandwidth**2))


@dataclass(frozen=True)
class GaussianProcessMechanism:
    sensitivity: float  # Δ: how far one unit moves the function in the RKHS norm
    bandwidth: float  # h of the Gaussian kernel whose RKHS holds the function
    scale: float  # σ: the released function is f + σ·G

    @classmethod
    def calibrate(cls, sensitivity: float, bandwidth: float, rho: float) -> GaussianProcessMechanism:
        """The mechanism that is `rho`-zCDP for the given RKHS sensitivity."""
        for name, value in (("sensitivity", sensitivity), ("bandwidth", bandwidth), ("rho", rho)):
            check_positive(name, value)
        return cls(sensitivity, bandwidth, sensitivity / math.sqrt(2 * rho))

    @property
    def rho(self) -> float:
        """The privacy map: ρ-zCDP."""
        return self.sensitivity**2 / (2 * self.scale**2)

    def covariance(self, points: np.ndarray) -> np.ndarray:
        """The noise's covariance in the proof: σ²·K on `points`."""
        return self.scale**2 * gaussian_kernel(points, points, self.bandwidth)

    def root(self, points: np.ndarray) -> np.ndarray:
        """R with R·Rᵀ = K + E, E ⪰ 0 (JITTER above the eigendecomposition's error): the noise drawn is σ·R·z."""
        values, vectors = np.linalg.eigh(gaussian_kernel(points, points, self.bandwidth))
        raised = np.clip(values, 0.0, None) + JITTER * max(float(values.max(initial=0.0)), 1.0)
        return vectors * np.sqrt(raised)

    def noise(self, points: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """One draw of σ·G on `points` (with the covariance `root` gives)."""
        rng = rng or np.random.default_rng(secrets.randbits(128))
        return self.scale * (self.root(points) @ rng.standard_normal(len(points)))

    def release(self, values: np.ndarray, points: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """f + σ·G on `points`, given f's exact values there, rounded to the output grid."""
        grid = grid_for(self.scale)
        return np.round((np.asarray(values, dtype=float) + self.noise(points, rng)) / grid) * grid


__all__ = ["GaussianProcessMechanism", "gaussian_kernel"]
