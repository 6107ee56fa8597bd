"""Exact-distribution tests of the samplers and the mechanisms' privacy maps (seeded generators)."""

from __future__ import annotations

import math
import random
from collections import Counter
from fractions import Fraction

import pytest
from scipy import stats

from dpsql.mechanisms import (
    LaplaceMechanism,
    PartitionSelection,
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
)

SAMPLES = 60_000


def _assert_matches_pmf(samples: list[int], pmf) -> None:
    """Chi-square goodness of fit over the central support, tails pooled; also each cell within 5 sigma."""
    counts = Counter(samples)
    n = len(samples)
    support = [z for z in range(-60, 61) if pmf(z) * n >= 20]
    observed = [counts.get(z, 0) for z in support]
    expected = [pmf(z) * n for z in support]
    observed.append(n - sum(observed))
    expected.append(n - sum(expected))
    for o, e in zip(observed, expected, strict=True):
        assert abs(o - e) <= 5 * math.sqrt(e) + 1, (o, e)
    _, p_value = stats.chisquare(observed, expected)
    assert p_value > 1e-4


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2)])
def test_bernoulli_exp_probability(gamma: Fraction) -> None:
    rng = random.Random(1)
    hits = sum(bernoulli_exp(gamma, rng) for _ in range(SAMPLES))
    p = math.exp(-float(gamma))
    assert abs(hits - p * SAMPLES) <= 5 * math.sqrt(SAMPLES * p * (1 - p)) + 1


@pytest.mark.parametrize("scale", [Fraction(1), Fraction(3, 2), Fraction(7, 10), Fraction(10, 3)])
def test_discrete_laplace_pmf(scale: Fraction) -> None:
    rng = random.Random(2)
    q = math.exp(-1 / float(scale))
    samples = [discrete_laplace(scale, rng) for _ in range(SAMPLES)]
    _assert_matches_pmf(samples, lambda z: (1 - q) / (1 + q) * q ** abs(z))


@pytest.mark.parametrize("sigma_squared", [Fraction(1), Fraction(5, 2), Fraction(9)])
def test_discrete_gaussian_pmf(sigma_squared: Fraction) -> None:
    rng = random.Random(3)
    s2 = float(sigma_squared)
    norm = sum(math.exp(-z * z / (2 * s2)) for z in range(-200, 201))
    samples = [discrete_gaussian(sigma_squared, rng) for _ in range(SAMPLES)]
    _assert_matches_pmf(samples, lambda z: math.exp(-z * z / (2 * s2)) / norm)


def test_count_mechanism_is_exactly_epsilon_with_scale_one_over_epsilon() -> None:
    for epsilon in (0.1, 0.3, 1.0, 2.5):
        mech = LaplaceMechanism.calibrate(sensitivity=1, epsilon=epsilon, integer_valued=True)
        assert mech.grid == 1.0
        assert mech.epsilon == pytest.approx(epsilon, rel=1e-15)
        assert mech.scale == pytest.approx(1 / epsilon, rel=1e-15)


def test_integer_release_distribution_is_shifted_discrete_laplace() -> None:
    mech = LaplaceMechanism.calibrate(sensitivity=2, epsilon=1.0, integer_valued=True)
    rng = random.Random(4)
    q = math.exp(-1 / float(mech.scale_units))
    samples = [int(mech.release(17, rng)) - 17 for _ in range(SAMPLES)]
    _assert_matches_pmf(samples, lambda z: (1 - q) / (1 + q) * q ** abs(z))


def test_real_outputs_lie_on_a_power_of_two_grid() -> None:
    mech = LaplaceMechanism.calibrate(sensitivity=250_000.0, epsilon=0.5, integer_valued=False)
    exponent = math.log2(mech.grid)
    assert exponent == int(exponent)
    assert mech.scale / mech.grid == pytest.approx(1024, rel=1.0)  # about 1024 grid steps per scale
    assert mech.epsilon == pytest.approx(0.5, rel=1e-15)
    rng = random.Random(5)
    for value in (0.1, 12345.678, -3.3e5):
        out = mech.release(value, rng)
        assert (out / mech.grid).is_integer()


def test_rounding_to_the_grid_is_paid_for_in_the_sensitivity() -> None:
    mech = LaplaceMechanism.calibrate(sensitivity=1.0, epsilon=1.0, integer_valued=False)
    assert mech.sensitivity_units == math.floor(1.0 / mech.grid) + 1
    assert mech.scale == pytest.approx(mech.sensitivity_units * mech.grid / 1.0)


def test_confidence_interval_covers() -> None:
    mech = LaplaceMechanism.calibrate(sensitivity=1, epsilon=0.5, integer_valued=True)
    rng = random.Random(6)
    width = mech.ci_halfwidth()
    misses = sum(abs(mech.release(0, rng)) > width for _ in range(20_000))
    assert misses / 20_000 <= 0.05


@pytest.mark.parametrize("epsilon,delta,groups", [(1.0, 1e-6, 1), (0.5, 1e-5, 4), (0.1, 1e-9, 10)])
def test_partition_threshold_bounds_delta_and_is_minimal(epsilon: float, delta: float, groups: int) -> None:
    sel = PartitionSelection(max_groups=groups, epsilon=epsilon, delta=delta)
    q = math.exp(-1 / float(sel.scale))

    def leak(threshold: int) -> float:  # P(a group of count 1 is released) summed over the unit's groups
        return groups * q ** (threshold - 1) / (1 + q)

    assert leak(sel.threshold) <= delta
    assert sel.threshold == 2 or leak(sel.threshold - 1) > delta


def test_partition_keep_probability() -> None:
    sel = PartitionSelection(max_groups=1, epsilon=1.0, delta=1e-2)
    rng = random.Random(7)
    q = math.exp(-1.0)
    count = sel.threshold  # P(Z >= 0) = 1 - P(Z <= -1) = 1 - q/(1+q)
    kept = sum(sel.keep(count, rng) for _ in range(SAMPLES))
    p = 1 - q / (1 + q)
    assert abs(kept - p * SAMPLES) <= 5 * math.sqrt(SAMPLES * p * (1 - p))


def test_invalid_parameters_are_refused() -> None:
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            LaplaceMechanism.calibrate(1, bad, True)
        with pytest.raises(ValueError):
            PartitionSelection(1, bad, 1e-6)
