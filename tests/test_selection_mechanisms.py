"""Exact-distribution tests of the exponential mechanism and top-k, and the histogram algorithms against
the worked example of Xu et al. (unit-bin counts 1, 2, 1, 3, 5, 1, 1)."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from dpsql.mechanisms import ExponentialMechanism, LaplaceMechanism, noise_first, structure_first, top_k, v_optimal
from dpsql.mechanisms.histograms import sse_table

EXAMPLE = [1, 2, 1, 3, 5, 1, 1]


def _assert_selects_with(mechanism: ExponentialMechanism, utilities: list[float], weights: list[float],
                         seed: int) -> None:
    """The mechanism's probabilities are the normalised weights, and its samples follow them (chi-square)."""
    expected = [w / sum(weights) for w in weights]
    assert mechanism.probabilities(utilities) == pytest.approx(expected)
    rng = random.Random(seed)
    n = 40_000
    counts = Counter(mechanism.select(utilities, rng) for _ in range(n))
    _, p_value = stats.chisquare([counts.get(i, 0) for i in range(len(utilities))], [p * n for p in expected])
    assert p_value > 1e-4


def test_exponential_mechanism_selection_probabilities():
    utilities = [0.0, -1.0, -2.5, -0.5, -6.0]
    _assert_selects_with(ExponentialMechanism(sensitivity=1.0, epsilon=1.0), utilities,
                         [math.exp(u / 2) for u in utilities], seed=8)


def test_exponential_mechanism_over_a_histogram_s_cells_follows_its_weights_at_every_level():
    """A median's histogram of 300 cells: the envelope's levels run from 0 past MAX_LEVEL, and the samples follow
    exp(ε u / 2Δ) exactly. Cells expected fewer than 20 times are pooled."""
    from dpsql.mechanisms import rank_scores
    from dpsql.mechanisms.exponential import MAX_LEVEL

    utilities = rank_scores([20] * 300, 0.5)
    mechanism = ExponentialMechanism(sensitivity=20.0, epsilon=1.0)
    assert max(utilities) - min(utilities) > 2 * 20.0 * (MAX_LEVEL + 2)  # candidates beyond the last level
    expected = mechanism.probabilities(utilities)
    rng, n = random.Random(15), 20_000
    picked = Counter(mechanism.select(utilities, rng) for _ in range(n))
    kept = [i for i, p in enumerate(expected) if p * n >= 20]
    observed = [picked.get(i, 0) for i in kept] + [n - sum(picked.get(i, 0) for i in kept)]
    wanted = [expected[i] * n for i in kept] + [n - sum(expected[i] * n for i in kept)]
    assert len(kept) > 10
    _, p_value = stats.chisquare(observed, wanted)
    assert p_value > 1e-4


def test_exponential_mechanism_utility_guarantee():
    mechanism = ExponentialMechanism(sensitivity=1.0, epsilon=0.5)
    utilities = [-float(abs(i - 50)) for i in range(101)]
    gap = mechanism.utility_gap(len(utilities), beta=0.05)
    rng = random.Random(9)
    misses = sum(utilities[mechanism.select(utilities, rng)] < -gap for _ in range(2000))
    assert misses / 2000 <= 0.05


def test_top_k_first_pick_and_distinctness():
    utilities = [5.0, 1.0, 4.0, 0.0]
    rng = random.Random(10)
    picks = [top_k(utilities, 2, sensitivity=1.0, epsilon=2.0, rng=rng) for _ in range(20_000)]
    assert all(len(set(p)) == 2 for p in picks)
    first = Counter(p[0] for p in picks)
    weights = [math.exp(1.0 * u / 2) for u in utilities]  # each round has ε / k = 1.0: exp(ε u / 2Δ)
    expected = [w / sum(weights) * len(picks) for w in weights]
    _, p_value = stats.chisquare([first.get(i, 0) for i in range(4)], expected)
    assert p_value > 1e-4


def test_monotone_exponential_mechanism_uses_epsilon_over_sensitivity():
    """For utilities that all move the same way (counts under add-remove), weights are exp(ε u / Δ)."""
    utilities = [10.0, 8.0, 9.0, 5.0]
    mechanism = ExponentialMechanism(sensitivity=2.0, epsilon=1.0, monotone=True)
    _assert_selects_with(mechanism, utilities, [math.exp(u / 2) for u in utilities], seed=13)
    assert mechanism.utility_gap(4) == pytest.approx(ExponentialMechanism(2.0, 1.0).utility_gap(4) / 2)


def test_top_k_monotone_rounds():
    rng = random.Random(14)
    picks = [top_k([3.0, 0.0, 1.0], 1, sensitivity=1.0, epsilon=1.0, monotone=True, rng=rng)[0] for _ in range(30_000)]
    weights = [math.exp(u) for u in (3.0, 0.0, 1.0)]
    expected = [w / sum(weights) * len(picks) for w in weights]
    counts = Counter(picks)
    _, p_value = stats.chisquare([counts.get(i, 0) for i in range(3)], expected)
    assert p_value > 1e-4


def test_single_bucket_sse_row_of_the_worked_example():
    row = sse_table(EXAMPLE)[0, 1:]
    assert row == pytest.approx([0, 0.5, 0.6667, 2.75, 11.2, 12.8333, 14.0], abs=0.01)


def test_optimal_three_bucket_histogram_of_the_worked_example():
    partition = v_optimal(EXAMPLE, 3)
    assert partition.buckets == [(0, 3), (3, 5), (5, 7)]  # bins 1-3, 4-5, 6-7
    means = [float(np.mean(EXAMPLE[a:b])) for a, b in partition.buckets]
    assert means == pytest.approx([1.3333, 4.0, 1.0], abs=1e-3)


def test_noise_first_never_merges_noiseless_bins_and_smooths_noisy_flat_runs():
    smooth_counts = [100.0] * 20 + [300.0] * 20
    rng = np.random.default_rng(11)
    noisy = list(np.array(smooth_counts) + rng.laplace(0, 10, 40))
    smoothed, partition = noise_first(noisy, noise_variance=2 * 10**2)
    assert len(partition.buckets) < 20  # far fewer buckets than bins
    assert np.mean((np.array(smoothed) - smooth_counts) ** 2) < np.mean((np.array(noisy) - smooth_counts) ** 2)
    exact, partition = noise_first([1.0, 50.0, 2.0, 80.0], noise_variance=1e-9)  # no noise: keep every bin
    assert exact == pytest.approx([1.0, 50.0, 2.0, 80.0]) and len(partition.buckets) == 4


def test_structure_first_with_a_large_structure_budget_finds_the_optimal_boundaries():
    noise = LaplaceMechanism.calibrate(sensitivity=1, epsilon=1e6, integer_valued=True)
    rng = random.Random(12)
    out, partition = structure_first(EXAMPLE, 3, count_bound=10, structure_epsilon=1e6, noise=noise, rng=rng)
    assert partition.buckets == [(0, 3), (3, 5), (5, 7)]
    assert out == pytest.approx([4 / 3] * 3 + [4.0] * 2 + [1.0] * 2, abs=1e-3)


def test_rank_scores():
    from dpsql.mechanisms import rank_scores

    assert rank_scores([0, 2, 3, 0], 0.5) == [-2.5, -0.5, 0.0, -2.5]
    assert rank_scores([0, 2, 3, 0], 0.0) == [-0.5, 0.0, -1.5, -4.5]  # MIN: the first non-empty cell
    assert rank_scores([0, 2, 3, 0], 1.0) == [-4.5, -2.5, 0.0, -0.5]  # MAX: the last non-empty cell
    assert rank_scores([0, 0, 0], 0.5) == [0.0, 0.0, 0.0]  # no data: every cell alike


def test_noise_first_beats_plain_bins_on_a_smooth_histogram_at_small_epsilon():
    """A smooth bell over 200 bins with Laplace noise of scale 100: NoiseFirst's mean squared error is far
    below the plain bins' (this is its use); with tiny noise it keeps almost every bin."""
    bins = np.arange(200)
    counts = 400 * np.exp(-((bins - 90) / 40.0) ** 2)
    rng = np.random.default_rng(15)
    plain, smoothed = [], []
    for _ in range(10):
        noisy = counts + rng.laplace(0, 100, len(counts))
        merged, _ = noise_first(list(noisy), 2 * 100**2)
        plain.append(np.mean((noisy - counts) ** 2))
        smoothed.append(np.mean((np.array(merged) - counts) ** 2))
    assert np.mean(smoothed) < np.mean(plain) / 3
    noisy = counts + rng.laplace(0, 0.01, len(counts))
    merged, partition = noise_first(list(noisy), 2 * 0.01**2)
    assert len(partition.buckets) > 150  # tiny noise: almost every bin kept
    assert np.mean((np.array(merged) - counts) ** 2) <= 2 * np.mean((noisy - counts) ** 2)


def test_structure_first_score_sensitivity_is_the_callers():
    """With a tiny structure budget relative to the given score sensitivity, boundaries are near uniform; with
    a huge one, optimal. The score sensitivity passed in is what the chooser uses."""
    noise = LaplaceMechanism.calibrate(sensitivity=1, epsilon=1e6, integer_valued=True)
    _, partition = structure_first(EXAMPLE, 3, count_bound=10, structure_epsilon=1e6, noise=noise,
                                   score_sensitivity=40.0, rng=random.Random(16))
    assert partition.buckets == [(0, 3), (3, 5), (5, 7)]


def test_structure_first_runs_only_where_the_noise_dwarfs_the_counts():
    """dpsql's StructureFirst: on 101 bins of about 20 units at ε = 0.01 (plain noise variance 20,000) it merges
    and beats plain bins and NoiseFirst; on bins of about 1,000 units at ε = 1 it would lose (its boundaries
    fall nearly at random across steps of the data), so plain bins at the same ε are released and smoothed by
    NoiseFirst; the decision reads only a noisy total, and the plan's ε adds up to the query's."""
    from dpsql.mechanisms import StructureFirstPlan, structure_first_or_noise_first

    rng = np.random.default_rng(21)
    small = np.bincount(rng.integers(0, 96, 2000), minlength=101).astype(float)
    large = np.bincount(rng.integers(0, 96, 100_000), minlength=101).astype(float)
    for counts, epsilon, runs_structure_first in ((small, 0.01, True), (large, 1.0, False)):
        release = StructureFirstPlan.calibrate(len(counts), 1, 1, epsilon)
        spent = release.max_count.epsilon + release.total.epsilon + release.fallback.epsilon
        assert spent == pytest.approx(epsilon)
        assert release.structure_epsilon + release.totals.epsilon == pytest.approx(release.fallback.epsilon)
        errors, plain, merged = [], [], []
        for seed in range(8):
            out, factors, ran = structure_first_or_noise_first(list(counts), release, random.Random(seed))
            assert ran == runs_structure_first and len(out) == len(factors) == len(counts)
            errors.append(np.mean((np.array(out) - counts) ** 2))
            noisy = counts + rng.laplace(0, 1 / epsilon, len(counts))
            plain.append(np.mean((noisy - counts) ** 2))
            merged.append(np.mean((np.array(noise_first(list(noisy), 2 / epsilon**2)[0]) - counts) ** 2))
        if runs_structure_first:
            assert np.mean(errors) < np.mean(merged) / 3 < np.mean(plain) / 3
        else:
            assert np.mean(errors) < 1.5 * np.mean(plain)
