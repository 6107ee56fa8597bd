"""Local randomizers: each person's device randomizes its own value before it is stored, so the database never
holds it in the clear. Each randomizer carries its privacy guarantee (its ε, per report) next to its sampler,
and the estimator that undoes its known randomization over many reports.

- `randomized_response` (Warner 1965) over two values and `KaryResponse` (k-ary RR) over a declared domain:
  the true value is kept with probability e^ε / (e^ε + k - 1), else one of the other k - 1 values is reported,
  uniformly. Sampled exactly (Bernoulli(e^-ε) from CKS, rational ε), so the ratio of any two inputs' report
  probabilities is e^ε, not e^ε up to float rounding.
- `UnaryEncoding` (optimized unary encoding, Wang et al. 2017): a report is k bits; the true value's bit is 1
  with probability 1/2, every other bit with probability 1 / (e^ε + 1). Its variance does not grow with k.
- `PlanarLaplace` (geo-indistinguishability, Andrés et al. 2013): a point moved by a planar Laplace draw
  (angle uniform; radius Gamma(2, 1/ε), the sum of two exponentials) and remapped to the cell of a declared grid
  that holds it, or the nearest cell where it falls outside. The remapping is post-processing, so the reports
  of any two points x, x' differ in probability by at most e^(ε·d(x, x')); only a cell leaves the device,
  never a float's low bits.
- `OptimalObfuscation` (Bordenabe, Chatzikokolakis, Palamidessi 2014): a matrix over the grid's cells that
  minimises the expected distance error for a prior subject to ε·d-indistinguishability, found by linear
  programming and then stored as integer weights that are checked against the constraint as sampled.

Estimators: the counts of reports per output have expectation Mᵀn, where M[x, y] = P(report y | value x) and n
the true counts; the unbiased estimate solves Mᵀn̂ = c, with its exact covariance A·Cov(c)·Aᵀ (A = (Mᵀ)⁻¹,
Cov(c) = Σ_x n_x (diag M_x - M_x M_xᵀ), evaluated at the estimate clipped to ≥ 0) plus, where the counts carry
central noise, A·diag(noise variance)·Aᵀ. `simplex=True` gives instead the maximum-likelihood counts on the
simplex (EM, Agrawal & Aggarwal 2001): never negative and summing to n, but biased.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np

from dpsql.mechanisms.samplers import SYSTEM_RANDOM, Randomness, bernoulli_exp, check_positive

ANGLES = 8192  # quadrature points for the planar Laplace cell probabilities (error ~1e-7)
MAX_CELLS = 2500  # a grid's matrix has cells² entries
MAX_LP_CELLS = 49  # the LP has cells² variables and cells³ constraints (49 cells: ~15 s)
WEIGHT_BITS = 48  # an optimal obfuscation's rows are sampled from integer weights of this precision
EM_ITERATIONS = 20_000
EM_TOLERANCE = 1e-12


@dataclass(frozen=True)
class Estimate:
    """Estimated true counts per input value, with the variance of each estimate."""

    counts: np.ndarray
    variances: np.ndarray

    def intervals(self, z: float = 1.959963984540054) -> list[tuple[float, float]]:
        """Normal-approximation 95% intervals (the estimates are sums of many independent reports)."""
        spread = z * np.sqrt(np.maximum(self.variances, 0.0))
        return list(zip((self.counts - spread).tolist(), (self.counts + spread).tolist(), strict=True))


def uniform(rng: Randomness) -> float:
    """A float uniform on (0, 1), from 53 random bits, never 0 or 1."""
    return (rng.randrange(1 << 53) + 0.5) / (1 << 53)


class CategoricalRandomizer:
    """A randomizer whose reports take values in a finite set, described by its matrix M[x, y]."""

    epsilon: float
    inputs: tuple  # the values a person may hold
    outputs: tuple  # the values a report may take

    def matrix(self) -> np.ndarray:  # pragma: no cover - every randomizer defines it
        raise NotImplementedError

    @cached_property
    def transition(self) -> np.ndarray:
        return self.matrix()

    def accepts(self, report: Any) -> bool:
        """Whether `report` is in the output space (what `dpsql ingest` checks)."""
        return isinstance(report, Hashable) and report in self._output_index

    @cached_property
    def _output_index(self) -> dict:
        return {value: i for i, value in enumerate(self.outputs)}

    def estimate(self, reported: Sequence[float], simplex: bool = False,
                 noise_variance: float | Sequence[float] = 0.0) -> Estimate:
        """True counts per input from counts per output (in `outputs` order), which may carry central noise of
        the given variance."""
        return estimate_counts(self.transition, np.asarray(reported, dtype=float), simplex, noise_variance)


def _check_domain(epsilon: float, domain: tuple) -> None:
    check_positive("epsilon", epsilon)
    if len(domain) < 2 or len(set(domain)) != len(domain):
        raise ValueError(f"a randomizer over values needs at least two distinct ones, got {list(domain)}")


def _keep_probability_denominator(epsilon: float, others: int) -> float:
    return math.exp(epsilon) + others


def _exact_response(true_index: int, k: int, epsilon: float, rng: Randomness) -> int:
    """k-ary randomized response, exactly: each round keeps the value with probability 1/k, else reports the
    drawn other value with probability e^-ε; so the value is kept with probability 1 / (1 + (k-1)e^-ε) and each
    other value reported with probability e^-ε times that."""
    gamma = Fraction(epsilon)
    while True:
        drawn = rng.randrange(k)
        if drawn == 0:
            return true_index
        if bernoulli_exp(gamma, rng):
            return (true_index + drawn) % k


@dataclass(frozen=True)
class KaryResponse(CategoricalRandomizer):
    """k-ary randomized response over a declared domain (k = 2 is Warner's)."""

    epsilon: float
    domain: tuple

    def __post_init__(self) -> None:
        _check_domain(self.epsilon, self.domain)

    @property
    def inputs(self) -> tuple:
        return self.domain

    @property
    def outputs(self) -> tuple:
        return self.domain

    @property
    def keep_probability(self) -> float:
        return math.exp(self.epsilon) / _keep_probability_denominator(self.epsilon, len(self.domain) - 1)

    def matrix(self) -> np.ndarray:
        k = len(self.domain)
        other = 1.0 / _keep_probability_denominator(self.epsilon, k - 1)
        matrix = np.full((k, k), other)
        np.fill_diagonal(matrix, self.keep_probability)
        return matrix

    def randomize(self, value: Any, rng: Randomness = SYSTEM_RANDOM) -> Any:
        if value not in self._output_index:
            raise ValueError(f"{value!r} is not in the declared domain {list(self.domain)}")
        return self.domain[_exact_response(self._output_index[value], len(self.domain), self.epsilon, rng)]


def randomized_response(epsilon: float) -> KaryResponse:
    """Warner's randomized response on a boolean."""
    return KaryResponse(epsilon, (False, True))


@dataclass(frozen=True)
class UnaryEncoding:
    """Optimized unary encoding: a report is one bit per domain value."""

    epsilon: float
    domain: tuple

    def __post_init__(self) -> None:
        _check_domain(self.epsilon, self.domain)

    p = 0.5

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(self.epsilon) + 1.0)

    def randomize(self, value: Any, rng: Randomness = SYSTEM_RANDOM) -> tuple[bool, ...]:
        if value not in self.domain:
            raise ValueError(f"{value!r} is not in the declared domain {list(self.domain)}")
        # a 0 bit becomes 1 with probability 1/(e^ε+1): binary RR of a 0 (exact, as above)
        return tuple(rng.randrange(2) == 1 if v == value else _exact_response(0, 2, self.epsilon, rng) == 1
                     for v in self.domain)

    def accepts(self, report: Any) -> bool:
        return (isinstance(report, list | tuple) and len(report) == len(self.domain)
                and all(isinstance(bit, bool) for bit in report))

    def estimate(self, ones: Sequence[float], reports: float, noise_variance: float | Sequence[float] = 0.0
                 ) -> Estimate:
        """True counts per value from the number of 1 bits per value over `reports` reports. Bits of one report
        are independent given its value, so the estimates are uncorrelated."""
        ones = np.asarray(ones, dtype=float)
        p, q = self.p, self.q
        counts = (ones - reports * q) / (p - q)
        held = np.clip(counts, 0.0, reports)
        variances = (held * p * (1 - p) + (reports - held) * q * (1 - q) + np.asarray(noise_variance)) / (p - q) ** 2
        return Estimate(counts, variances)


@dataclass(frozen=True)
class Grid:
    """Square cells of side `step` over [x0, x1] × [y0, y1]; cell ids run along x first."""

    x0: float
    x1: float
    y0: float
    y1: float
    step: float

    def __post_init__(self) -> None:
        check_positive("grid step", self.step)
        for name, span in (("x", self.x1 - self.x0), ("y", self.y1 - self.y0)):
            cells = span / self.step
            if not cells >= 1 or abs(cells - round(cells)) > 1e-9:
                raise ValueError(f"the grid's {name} range must be a positive whole number of steps")
        if self.cells > MAX_CELLS:
            raise ValueError(f"a grid of {self.cells} cells is too fine (at most {MAX_CELLS}): use a larger step")

    @property
    def nx(self) -> int:
        return round((self.x1 - self.x0) / self.step)

    @property
    def ny(self) -> int:
        return round((self.y1 - self.y0) / self.step)

    @property
    def cells(self) -> int:
        return self.nx * self.ny

    def cell_of(self, x: float, y: float) -> int:
        """The cell holding (x, y), or the nearest cell for a point outside the grid."""
        ix = min(max(math.floor((x - self.x0) / self.step), 0), self.nx - 1)
        iy = min(max(math.floor((y - self.y0) / self.step), 0), self.ny - 1)
        return ix + self.nx * iy

    def centre(self, cell: int) -> tuple[float, float]:
        iy, ix = divmod(cell, self.nx)
        return self.x0 + (ix + 0.5) * self.step, self.y0 + (iy + 0.5) * self.step

    @cached_property
    def centres(self) -> np.ndarray:
        return np.array([self.centre(c) for c in range(self.cells)])

    @cached_property
    def distances(self) -> np.ndarray:
        """Euclidean distances between cell centres."""
        diff = self.centres[:, None, :] - self.centres[None, :, :]
        return np.sqrt((diff**2).sum(axis=2))


class GeoRandomizer(CategoricalRandomizer):
    """A location randomizer whose reports are cells of a grid."""

    grid: Grid

    @property
    def inputs(self) -> tuple:
        return tuple(range(self.grid.cells))

    @property
    def outputs(self) -> tuple:
        return tuple(range(self.grid.cells))

    def expected_distance_error(self, prior: Sequence[float] | None = None) -> float:
        """The expected distance between a person's cell centre and the reported one (uniform prior by default)."""
        prior = np.full(self.grid.cells, 1 / self.grid.cells) if prior is None else np.asarray(prior, dtype=float)
        return float(prior @ (self.transition * self.grid.distances).sum(axis=1))


@dataclass(frozen=True)
class PlanarLaplace(GeoRandomizer):
    epsilon: float  # per unit of distance
    grid: Grid

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)

    def randomize(self, location: tuple[float, float], rng: Randomness = SYSTEM_RANDOM) -> int:
        x, y = (float(v) for v in location)
        if not (math.isfinite(x) and math.isfinite(y)):
            raise ValueError("a location must be two finite numbers")
        radius = -(math.log(uniform(rng)) + math.log(uniform(rng))) / self.epsilon  # Gamma(2, 1/ε)
        angle = 2 * math.pi * uniform(rng)
        return self.grid.cell_of(x + radius * math.cos(angle), y + radius * math.sin(angle))

    def matrix(self) -> np.ndarray:
        """P(report cell | person at a cell's centre). A cell's reports come from a rectangle (unbounded for
        border cells, which take what falls outside), so each probability is four quadrant masses."""
        g, s = self.grid, self.grid.step
        offsets = lambda n: np.concatenate(([-np.inf], (np.arange(-n, n) + 0.5) * s, [np.inf]))  # noqa: E731
        ax, ay = offsets(g.nx), offsets(g.ny)
        masses = _quadrant_masses(ax, ay, self.epsilon)  # masses[i, j] = P(X <= ax[i], Y <= ay[j])
        # for a person in column c, the boundary between columns j-1 and j is at offset (j - c - 0.5)·s, which is
        # ax[j - c + n]; j = 0 and j = n are the infinite ends
        cols = np.arange(g.nx)
        lo_x = np.where(cols[None, :] == 0, 0, cols[None, :] - cols[:, None] + g.nx)  # [person col, report col]
        hi_x = np.where(cols[None, :] == g.nx - 1, 2 * g.nx + 1, cols[None, :] + 1 - cols[:, None] + g.nx)
        rows = np.arange(g.ny)
        lo_y = np.where(rows[None, :] == 0, 0, rows[None, :] - rows[:, None] + g.ny)
        hi_y = np.where(rows[None, :] == g.ny - 1, 2 * g.ny + 1, rows[None, :] + 1 - rows[:, None] + g.ny)
        # P[(px, py), (rx, ry)] by inclusion-exclusion over the rectangle's corners
        m = lambda x, y: masses[x[:, None, :, None], y[None, :, None, :]]  # noqa: E731
        rect = m(hi_x, hi_y) - m(lo_x, hi_y) - m(hi_x, lo_y) + m(lo_x, lo_y)  # [px, py, rx, ry]
        return np.clip(rect.transpose(1, 0, 3, 2).reshape(g.cells, g.cells), 0.0, 1.0)


def _quadrant_masses(ax: np.ndarray, ay: np.ndarray, epsilon: float) -> np.ndarray:
    """P(X <= a, Y <= b) for planar Laplace around the origin, for every a in ax and b in ay: along each
    direction the points of the quadrant form one interval of radii, whose mass the radial CDF
    1 - (1 + εr)e^(-εr) gives; the directions are integrated by the midpoint rule."""
    theta = (np.arange(ANGLES) + 0.5) * (2 * np.pi / ANGLES)
    cos, sin = np.cos(theta), np.sin(theta)

    def radii(limit: np.ndarray, direction: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The radii r >= 0 with r·direction <= limit, as [low, high], shaped [limit, angle]."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = limit[:, None] / direction[None, :]
        high = np.where(direction[None, :] > 0, ratio, np.inf)
        low = np.where(direction[None, :] < 0, np.maximum(ratio, 0.0), 0.0)
        return (np.nan_to_num(low, nan=0.0, posinf=np.inf, neginf=-np.inf),
                np.nan_to_num(high, nan=np.inf, posinf=np.inf, neginf=-np.inf))

    low_x, high_x = radii(ax, cos)
    low_y, high_y = radii(ay, sin)
    masses = np.empty((len(ax), len(ay)))
    for j in range(len(ay)):
        low = np.maximum(low_x, low_y[j][None, :])
        high = np.minimum(high_x, high_y[j][None, :])
        inside = _radial_cdf(high, epsilon) - _radial_cdf(low, epsilon)
        masses[:, j] = np.where(high > low, inside, 0.0).mean(axis=1)
    return masses


def _radial_cdf(r: np.ndarray, epsilon: float) -> np.ndarray:
    far = epsilon * np.abs(r) > 700  # where (1 + εr)e^(-εr) underflows: the whole mass
    with np.errstate(invalid="ignore", over="ignore"):
        cdf = 1.0 - (1.0 + epsilon * r) * np.exp(-epsilon * r)
    return np.where(far, 1.0, cdf)


@dataclass(frozen=True)
class OptimalObfuscation(GeoRandomizer):
    epsilon: float  # per unit of distance
    grid: Grid
    prior: tuple[float, ...] | None = None  # where people are, by cell; uniform if not given
    weights: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        if self.grid.cells > MAX_LP_CELLS:
            raise ValueError(f"an optimal obfuscation over {self.grid.cells} cells is too large to solve (at most "
                             f"{MAX_LP_CELLS}): use a coarser grid, or mechanism = \"geo\"")
        if self.prior is not None and (len(self.prior) != self.grid.cells or min(self.prior) < 0
                                       or not sum(self.prior) > 0):
            raise ValueError(f"the prior must give {self.grid.cells} weights >= 0, one per cell")
        object.__setattr__(self, "weights", _integer_weights(self._solve(), self.epsilon, self.grid.distances))

    def _solve(self) -> np.ndarray:
        """The matrix of least expected distance error under ε·d-indistinguishability (scipy's HiGHS)."""
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix

        n, d = self.grid.cells, self.grid.distances
        prior = np.full(n, 1 / n) if self.prior is None else np.asarray(self.prior) / sum(self.prior)
        cost = (prior[:, None] * d).ravel()  # variable K[x, y] is x * n + y
        # one constraint K[x, y] - e^(ε d(x, x')) K[x', y] <= 0 per x != x' and y
        x, other, y = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(n), np.arange(n), indexing="ij"))
        keep = x != other
        x, other, y = x[keep], other[keep], y[keep]
        count = len(x)
        rows = np.repeat(np.arange(count), 2)
        cols = np.stack([x * n + y, other * n + y], axis=1).ravel()
        vals = np.stack([np.ones(count), -np.exp(self.epsilon * d[x, other])], axis=1).ravel()
        upper = coo_matrix((vals, (rows, cols)), shape=(count, n * n)).tocsr()
        equal = coo_matrix((np.ones(n * n), (np.repeat(np.arange(n), n), np.arange(n * n))), shape=(n, n * n))
        result = linprog(cost, A_ub=upper, b_ub=np.zeros(count), A_eq=equal.tocsr(), b_eq=np.ones(n),
                         bounds=(0, 1), method="highs")
        if result.status != 0:
            raise ValueError(f"the obfuscation LP failed: {result.message}")
        return result.x.reshape(n, n)

    def matrix(self) -> np.ndarray:
        return self.weights / self.weights.sum(axis=1, keepdims=True)

    def randomize(self, location: tuple[float, float], rng: Randomness = SYSTEM_RANDOM) -> int:
        """The report for a person at `location`, who is taken to be at the centre of its cell (the guarantee is
        between cells: ε times the distance of their centres)."""
        row = self.weights[self.grid.cell_of(*(float(v) for v in location))]
        draw = rng.randrange(int(row.sum()))
        return int(np.searchsorted(np.cumsum(row), draw, side="right"))


def _integer_weights(solution: np.ndarray, epsilon: float, distances: np.ndarray) -> np.ndarray:
    """The LP's matrix as integer weights whose rows, as sampled, satisfy the constraint exactly. The solver
    meets each constraint only up to its tolerance τ; mixing in λ of the uniform matrix, with
    λ >= τ·n / (e^(ε·d_min) - 1), restores it with room to spare for rounding to 2^-48."""
    n = solution.shape[0]
    solution = np.clip(solution, 0.0, None)
    solution /= solution.sum(axis=1, keepdims=True)
    bound = np.exp(epsilon * distances)
    slack = max(0.0, float(np.max(solution[:, None, :] - bound[:, :, None] * solution[None, :, :])))
    d_min = float(distances[distances > 0].min())
    mix = min(1.0, max(1e-9, 4 * (slack + 2.0**-WEIGHT_BITS) * n / math.expm1(epsilon * d_min)))
    mixed = (1 - mix) * solution + mix / n
    weights = np.floor(mixed * 2.0**WEIGHT_BITS)
    probabilities = weights / weights.sum(axis=1, keepdims=True)
    ratio = probabilities[:, None, :] / probabilities[None, :, :]  # [x, x', y]
    if not np.all(ratio <= bound[:, :, None] * (1 + 1e-12)):
        raise ValueError("the obfuscation matrix fails ε·d-indistinguishability after rounding; use a larger ε "
                         "or a coarser grid")
    return weights


def estimate_counts(matrix: np.ndarray, reported: np.ndarray, simplex: bool = False,
                    noise_variance: float | Sequence[float] = 0.0) -> Estimate:
    """True counts per input from counts per output of reports drawn with `matrix` (see the module's text)."""
    inputs, outputs = matrix.shape
    if reported.shape != (outputs,):
        raise ValueError(f"expected {outputs} counts, one per output, got {reported.shape}")
    inverse = _inverse_transpose(matrix)
    if simplex:
        counts = _em(matrix, np.clip(reported, 0.0, None))
    else:
        if inverse is None:
            raise ValueError("this randomization cannot be undone exactly (its matrix is singular); ask for the "
                             "estimate on the simplex (SET dpsql.local_estimate = 'simplex')")
        counts = inverse @ reported
    held = np.clip(counts, 0.0, None)
    covariance = np.diag(held @ matrix) - (matrix.T * held) @ matrix  # Σ_x n_x (diag M_x - M_x M_xᵀ)
    covariance = covariance + np.diag(np.broadcast_to(np.asarray(noise_variance, dtype=float), (outputs,)))
    if inverse is None:  # the linear estimator's variance is the simplex estimate's only as an approximation
        inverse = np.linalg.pinv(matrix.T)
    variances = np.einsum("ij,jk,ik->i", inverse, covariance, inverse)
    return Estimate(counts, variances)


def _inverse_transpose(matrix: np.ndarray) -> np.ndarray | None:
    if matrix.shape[0] != matrix.shape[1] or np.linalg.cond(matrix) > 1e12:
        return None
    return np.linalg.inv(matrix.T)


def _em(matrix: np.ndarray, reported: np.ndarray) -> np.ndarray:
    """Maximum-likelihood true counts on the simplex (iterative Bayesian update)."""
    total = reported.sum()
    if total <= 0:
        return np.zeros(matrix.shape[0])
    share = np.full(matrix.shape[0], 1.0 / matrix.shape[0])
    frequencies = reported / total
    for _ in range(EM_ITERATIONS):
        predicted = share @ matrix
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(predicted > 0, frequencies / predicted, 0.0)
        updated = share * (matrix @ ratio)
        updated /= updated.sum()
        if np.abs(updated - share).sum() < EM_TOLERANCE:
            share = updated
            break
        share = updated
    return share * total


__all__ = ["Estimate", "Grid", "KaryResponse", "OptimalObfuscation", "PlanarLaplace",
           "UnaryEncoding", "estimate_counts",
           "randomized_response"]
