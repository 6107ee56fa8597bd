"""Exact samplers for the discrete Laplace and discrete Gaussian distributions.

These follow Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy" (2020),
Algorithms 1-3. They use only integer arithmetic on exact rationals, so no floating-point rounding can
leak information (Mironov 2012). Randomness comes from an object with `randrange(n)`; in production that
is `random.SystemRandom` (the OS CSPRNG). Tests inject a seeded `random.Random` to check exact
distributions; nothing outside `dpsql.mechanisms` passes one.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Protocol


class Randomness(Protocol):
    def randrange(self, stop: int) -> int: ...


SYSTEM_RANDOM: Randomness = random.SystemRandom()


def check_positive(name: str, value: float) -> None:
    """A mechanism parameter must be a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")


def bernoulli(p: Fraction, rng: Randomness) -> bool:
    """True with probability p (a rational in [0, 1])."""
    return rng.randrange(p.denominator) < p.numerator


def bernoulli_exp(gamma: Fraction, rng: Randomness) -> bool:
    """True with probability exp(-gamma) for a rational gamma >= 0 (CKS Algorithm 1)."""
    if gamma < 0:
        raise ValueError("gamma must be >= 0")
    return _bernoulli_exp(gamma.numerator, gamma.denominator, rng)


def _bernoulli_exp(num: int, den: int, rng: Randomness) -> bool:
    """True with probability exp(-num/den) (num >= 0, den > 0) in integers only: Bernoulli(γ/k) is
    randrange(den·k) < num, so no Fraction is built inside the loops, where the time went."""
    while num > den:  # exp(-γ) = exp(-1)·exp(-(γ - 1))
        if not _bernoulli_exp(1, 1, rng):
            return False
        num -= den
    k = 1
    while rng.randrange(den * k) < num:
        k += 1
    return k % 2 == 1


def discrete_laplace(scale: Fraction, rng: Randomness = SYSTEM_RANDOM) -> int:
    """One sample Z with P(Z = z) proportional to exp(-|z| / scale) (CKS Algorithm 2)."""
    return discrete_laplace_batch(scale, 1, rng)[0]


def discrete_laplace_batch(scale: Fraction, n: int, rng: Randomness = SYSTEM_RANDOM) -> list[int]:
    """`n` independent samples of `discrete_laplace(scale)`, drawn in one call (the noise of a whole query)."""
    if scale <= 0:
        raise ValueError("scale must be > 0")
    t, s = scale.numerator, scale.denominator  # scale = t / s
    out: list[int] = []
    while len(out) < n:
        u = rng.randrange(t)
        if not _bernoulli_exp(u, t, rng):
            continue
        v = 0
        while _bernoulli_exp(1, 1, rng):
            v += 1
        y = (u + t * v) // s
        negative = rng.randrange(2) == 1
        if negative and y == 0:
            continue
        out.append(-y if negative else y)
    return out


def discrete_gaussian(sigma_squared: Fraction, rng: Randomness = SYSTEM_RANDOM) -> int:
    """One sample Z with P(Z = z) proportional to exp(-z² / (2σ²)) (CKS Algorithm 3)."""
    return discrete_gaussian_batch(sigma_squared, 1, rng)[0]


def discrete_gaussian_batch(sigma_squared: Fraction, n: int, rng: Randomness = SYSTEM_RANDOM) -> list[int]:
    """`n` independent samples of `discrete_gaussian(sigma_squared)`, drawn in one call."""
    if sigma_squared <= 0:
        raise ValueError("sigma_squared must be > 0")
    a, b = sigma_squared.numerator, sigma_squared.denominator  # σ² = a / b
    t = math.isqrt(a // b) + 1  # floor(σ) + 1
    den = 2 * a * t * t * b  # γ = (|y| - σ²/t)² / (2σ²) = (|y|·t·b - a)² / (2·a·t²·b)
    out: list[int] = []
    while len(out) < n:
        y = discrete_laplace_batch(Fraction(t), 1, rng)[0]
        if _bernoulli_exp((abs(y) * t * b - a) ** 2, den, rng):
            out.append(y)
    return out
