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
"""

from __future__ import annotations

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


def noise_first(noisy_counts: Sequence[float], noise_variance: float) -> tuple[list[float], Partition]:
    """NoiseFirst: merge adjacent noisy bins into the histogram with least estimated error (free)."""
    n = len(noisy_counts)
    best, arg, _ = optimal_tables(noisy_counts, n)
    ks = np.arange(1, n + 1)
    estimated = best[1:, n] - (n - ks) * noise_variance + ks * noise_variance
    k = int(ks[int(np.argmin(estimated))])
    partition = Partition(_trace(arg, k, n), float(best[k, n]))
    return smooth(noisy_counts, partition), partition


def structure_first(counts: Sequence[float], k: int, count_bound: float, structure_epsilon: float,
                    noise: LaplaceMechanism, rng: Randomness = SYSTEM_RANDOM) -> tuple[list[float], Partition]:
    """StructureFirst: choose k buckets on the true counts (clamped to `count_bound`) with the exponential
    mechanism, spending `structure_epsilon` over the k - 1 boundaries, then noise each bucket's total with
    `noise` (calibrated by the caller to a bucket total's sensitivity).

    The score sensitivity 2F + 1 holds for neighbours that move one bin's count by at most 1 (the paper's
    setting); a caller whose unit can move several bins or move one by more must scale its budget.
    """
    values = np.clip(np.asarray(counts, dtype=float), 0, count_bound)
    n = len(values)
    k = max(1, min(k, n))
    best, _, sse = optimal_tables(values, k)
    boundaries = [n]
    if k > 1:
        chooser = ExponentialMechanism(2 * count_bound + 1, structure_epsilon / (k - 1))
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
