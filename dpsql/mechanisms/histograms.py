"""Histograms over ordered bins: NoiseFirst and StructureFirst (Xu et al., "Differentially Private
Histogram Publication", ICDE 2012).

Both rest on the v-optimal partition: the split of n unit bins into k contiguous buckets that minimises the
sum of squared errors (SSE) when each bin is replaced by its bucket's mean, found by dynamic programming.
- NoiseFirst is pure post-processing of already-noisy counts: it picks the partition, and the number of
  buckets k, that minimise the *estimated* error, SSE(noisy) - (n - k)σ² + kσ², where σ² is the variance
  of the noise on one bin. It costs no budget.
- StructureFirst spends part of the budget choosing bucket boundaries on the true counts with the
  exponential mechanism (scores are SSEs, whose sensitivity is 2F + 1 when counts are clamped to F), and
  the rest noising each bucket's total.

dpsql's NoiseFirst departs from the paper in how candidate partitions are found, because the paper's
v-optimal partition of the raw noisy counts fits the noise: it isolates bins whose noise happens to be
large, so its estimated error is optimistic and, measured on the demo's age and income histograms, it was
worse than plain Laplace at ε = 0.1 and 1. Here candidates come from a 5-bin moving average of the noisy
counts (penalised optimal partitions over a range of penalties), each candidate is judged on the raw noisy
counts by the paper's estimate plus a selection penalty k·ln(n/k)·σ² (Birgé and Massart's form, zero for the
identity partition), and the identity partition (plain Laplace bins) is always a candidate.
All of it reads only noisy counts, so it is still free post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpsql.mechanisms.exponential import ExponentialMechanism
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.mechanisms.samplers import SYSTEM_RANDOM, Randomness

MAX_BINS = 1024


def sse_table(counts: Sequence[float]) -> np.ndarray:
    """sse[i, j]: squared error of bins i..j-1 (0-based, j exclusive) merged into one bucket; inf if j <= i."""
    values = np.asarray(counts, dtype=float)
    n = len(values)
    if n > MAX_BINS:
        raise ValueError(f"at most {MAX_BINS} bins")
    s = np.concatenate([[0.0], np.cumsum(values)])
    ss = np.concatenate([[0.0], np.cumsum(values * values)])
    i = np.arange(n + 1)[:, None]
    j = np.arange(n + 1)[None, :]
    width = (j - i).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        table = ss[j] - ss[i] - (s[j] - s[i]) ** 2 / width
    table[width <= 0] = np.inf
    return np.maximum(table, 0.0)


@dataclass(frozen=True)
class Partition:
    boundaries: tuple[int, ...]  # bucket b covers bins boundaries[b] .. boundaries[b+1]-1; starts at 0, ends at n
    sse: float

    @property
    def buckets(self) -> list[tuple[int, int]]:
        return list(zip(self.boundaries[:-1], self.boundaries[1:], strict=True))


def optimal_tables(counts: Sequence[float], max_buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """best[k, j]: least SSE splitting bins 0..j-1 into k buckets; arg[k, j]: where its last bucket starts."""
    sse = sse_table(counts)
    n = len(counts)
    best = np.full((max_buckets + 1, n + 1), np.inf)
    arg = np.zeros((max_buckets + 1, n + 1), dtype=int)
    best[0, 0] = 0.0
    for k in range(1, max_buckets + 1):
        candidates = best[k - 1][:, None] + sse  # [i, j]: first k-1 buckets end at i, last is i..j-1
        arg[k] = np.argmin(candidates, axis=0)
        best[k] = candidates[arg[k], np.arange(n + 1)]
    return best, arg, sse


def v_optimal(counts: Sequence[float], k: int) -> Partition:
    """The k-bucket partition with least SSE."""
    n = len(counts)
    k = max(1, min(k, n))
    best, arg, _ = optimal_tables(counts, k)
    return Partition(_trace(arg, k, n), float(best[k, n]))


def _trace(arg: np.ndarray, k: int, n: int) -> tuple[int, ...]:
    boundaries = [n]
    for buckets in range(k, 0, -1):
        boundaries.append(int(arg[buckets, boundaries[-1]]))
    return tuple(reversed(boundaries))


def smooth(counts: Sequence[float], partition: Partition) -> list[float]:
    """Each bin replaced by its bucket's mean."""
    out = []
    for start, end in partition.buckets:
        mean = float(np.mean(counts[start:end]))
        out.extend([mean] * (end - start))
    return out


PILOT_WINDOW = 5  # bins averaged by the moving average that proposes NoiseFirst's partitions
PENALTY_GRID = [2.0**j for j in range(-2, 14)]  # per-bucket penalties (in σ² / PILOT_WINDOW) that propose them


def noise_first(noisy_counts: Sequence[float], noise_variance: float) -> tuple[list[float], Partition]:
    """NoiseFirst: merge adjacent noisy bins into the histogram with least estimated error (free)."""
    values = np.asarray(noisy_counts, dtype=float)
    n = len(values)
    raw = sse_table(values)
    best_error, best = n * noise_variance, tuple(range(n + 1))  # the identity: every bin its own bucket
    pilot = sse_table(_moving_average(values, PILOT_WINDOW))
    for penalty in PENALTY_GRID:
        boundaries = _penalised_partition(pilot, penalty * noise_variance / PILOT_WINDOW)
        k = len(boundaries) - 1
        sse = float(sum(raw[a, b] for a, b in zip(boundaries[:-1], boundaries[1:], strict=True)))
        error = sse + (2 * k - n) * noise_variance + k * math.log(n / k) * noise_variance
        if error < best_error:
            best_error, best = error, boundaries
    partition = Partition(best, float(sum(raw[a, b] for a, b in zip(best[:-1], best[1:], strict=True))))
    return smooth(values, partition), partition


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Each bin replaced by the mean of the `window` bins around it (fewer at the ends)."""
    half = window // 2
    sums = np.concatenate([[0.0], np.cumsum(values)])
    index = np.arange(len(values))
    low, high = np.maximum(index - half, 0), np.minimum(index + half + 1, len(values))
    return (sums[high] - sums[low]) / (high - low)


def _penalised_partition(sse: np.ndarray, penalty: float) -> tuple[int, ...]:
    """The partition minimising SSE + penalty per bucket (optimal partitioning, O(n²))."""
    n = sse.shape[0] - 1
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    start = np.zeros(n + 1, dtype=int)
    for end in range(1, n + 1):
        costs = best[:end] + sse[:end, end] + penalty
        start[end] = int(np.argmin(costs))
        best[end] = costs[start[end]]
    boundaries = [n]
    while boundaries[-1] > 0:
        boundaries.append(int(start[boundaries[-1]]))
    return tuple(reversed(boundaries))


def structure_first(counts: Sequence[float], k: int, count_bound: float, structure_epsilon: float,
                    noise: LaplaceMechanism, score_sensitivity: float | None = None,
                    rng: Randomness = SYSTEM_RANDOM) -> tuple[list[float], Partition]:
    """StructureFirst: choose k buckets on the true counts (clamped to `count_bound` F) with the exponential
    mechanism, spending `structure_epsilon` over the k - 1 boundaries, then noise each bucket's total with
    `noise` (calibrated by the caller to a bucket total's sensitivity).

    `score_sensitivity` bounds how far one neighbour moves any SSE score. The paper's 2F + 1 (the default)
    holds for neighbours that move one bin's count by 1. When neighbours move counts by at most L in L1 norm,
    all in the same direction (add-remove), each score is Σx² - (Σx)²/s over clamped counts, and both terms
    move the same way by at most 2F·L, so 2F·L bounds the score's move; with mixed directions, 4F·L.
    """
    values = np.clip(np.asarray(counts, dtype=float), 0, count_bound)
    n = len(values)
    k = max(1, min(k, n))
    best, _, sse = optimal_tables(values, k)
    boundaries = [n]
    if k > 1:
        sensitivity = 2 * count_bound + 1 if score_sensitivity is None else score_sensitivity
        chooser = ExponentialMechanism(sensitivity, structure_epsilon / (k - 1))
        for buckets in range(k - 1, 0, -1):  # choose where the last of `buckets + 1` buckets starts
            end = boundaries[-1]
            starts = list(range(buckets, end))  # leaves at least one bin for each earlier bucket
            scores = [-(best[buckets, i] + sse[i, end]) for i in starts]
            boundaries.append(starts[chooser.select(scores, rng)])
    boundaries.append(0)
    partition = Partition(tuple(reversed(boundaries)), 0.0)
    out = []
    for start, end in partition.buckets:
        total = noise.release(float(values[start:end].sum()), rng)
        out.extend([total / (end - start)] * (end - start))
    sse_of_choice = float(sum(sse[a, b] for a, b in partition.buckets))
    return out, Partition(partition.boundaries, sse_of_choice)


STRUCTURE_PAYS = 4  # StructureFirst runs when the plain bins' noise variance is at least 4 × a mean bin's square
STRUCTURE_SPLIT = (0.05, 0.1, 0.35, 0.5)  # StructureFirst's shares: clamp F, total, boundaries, bucket totals
BINS_PER_BUCKET = 64  # StructureFirst merges n bins into ceil(n / 64) buckets: it runs where noise dominates


@dataclass(frozen=True)
class StructureFirstPlan:
    """The mechanisms of one StructureFirst release (calibrated by the caller to the bins' sensitivity)."""

    max_count: LaplaceMechanism  # the largest bin count, plus its 95% half-width: the clamp F of the scores
    total: LaplaceMechanism  # all bins' total: a mean bin count, to judge whether merging can pay
    structure_epsilon: float  # the boundaries' exponential mechanism, over the k - 1 of them
    score_factor: float  # a boundary score moves by at most score_factor · F
    buckets: int
    totals: LaplaceMechanism  # each bucket's total
    fallback: LaplaceMechanism  # plain bins, at the boundaries' and totals' ε together, then NoiseFirst

    @classmethod
    def calibrate(cls, bins: int, sensitivity: float, per_bin: float, epsilon: float,
                  steps: int = 1) -> StructureFirstPlan:
        """The release of `bins` ordered counts at `epsilon` in all, where one neighbour moves the counts by at
        most `sensitivity` in L1 and any one count by at most `per_bin`, over `steps` add-remove steps (2 under
        replace). Shares: 5% the clamp F, 10% the total, 35% the boundaries, 50% the bucket totals."""
        clamp, total, structure, totals = (epsilon * share for share in STRUCTURE_SPLIT)
        return cls(max_count=LaplaceMechanism.calibrate(per_bin, clamp, True),
                   total=LaplaceMechanism.calibrate(sensitivity, total, True),
                   structure_epsilon=structure,
                   score_factor=2 * steps * sensitivity,  # see structure_first
                   buckets=math.ceil(bins / BINS_PER_BUCKET),
                   totals=LaplaceMechanism.calibrate(sensitivity, totals, True),
                   fallback=LaplaceMechanism.calibrate(sensitivity, structure + totals, True))


def structure_first_or_noise_first(counts: Sequence[float], plan: StructureFirstPlan,
                                   rng: Randomness = SYSTEM_RANDOM) -> tuple[list[float], list[float], bool]:
    """StructureFirst where it can pay, else plain bins merged by NoiseFirst; returns the released bins, each
    bin's noise scale as a multiple of `plan.totals`' (for its interval), and whether StructureFirst ran.

    Where the error comes from (benchmarks/results/selection.md): the boundaries' exponential mechanism has
    score sensitivity about 2F with F near the largest count, and ε/(k − 1) each, so on bins of hundreds or
    thousands of units its boundaries fall nearly at random, and a bucket across a step in the data moves its
    bins by up to F: 30 to 10,000 times plain bins' error at 100,000 people. It pays only where the bins'
    noise dwarfs the counts themselves (few units per bin, small ε): there, merging anywhere costs less than
    the noise it averages away (12× below NoiseFirst on 101 age bins of 2,000 people at ε = 0.01). So it runs
    when a mean bin count m (from the noisy total) has m² ≤ plain variance / STRUCTURE_PAYS; elsewhere the
    same ε gives plain bins, smoothed by NoiseFirst."""
    values = np.asarray(counts, dtype=float)
    mean = max(0.0, plan.total.release(float(values.sum()), rng)) / max(len(values), 1)
    if mean**2 * STRUCTURE_PAYS > plan.fallback.variance:
        noisy = plan.fallback.release_many(list(values), rng)
        smoothed, partition = noise_first(noisy, plan.fallback.variance)
        ratio = plan.fallback.scale / plan.totals.scale
        return smoothed, [ratio / math.sqrt(end - start) for start, end in partition.buckets
                          for _ in range(end - start)], False
    clamp = max(1.0, math.ceil(plan.max_count.release(float(values.max(initial=0.0)), rng)
                               + plan.max_count.ci_halfwidth()))
    bucketed, partition = structure_first(values, plan.buckets, clamp, plan.structure_epsilon, plan.totals,
                                          score_sensitivity=plan.score_factor * clamp, rng=rng)
    return bucketed, [1 / (end - start) for start, end in partition.buckets for _ in range(end - start)], True


def onto_simplex(counts: np.ndarray, total: float) -> np.ndarray:
    """The nearest point (in L2) with counts >= 0 summing to `total`: post-processing of noisy counts into counts
    (for unary-encoded estimates, whose bits have no joint likelihood, and for perturbed contingency tables)."""
    if total <= 0:
        return np.zeros_like(counts)
    ordered = np.sort(counts)[::-1]
    cumulative = np.cumsum(ordered) - total
    index = np.arange(1, len(counts) + 1)
    rho = index[ordered - cumulative / index > 0][-1]
    return np.maximum(counts - cumulative[rho - 1] / rho, 0.0)
