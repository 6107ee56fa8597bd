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
    while gamma > 1:
        if not bernoulli_exp(Fraction(1), rng):
            return False
        gamma -= 1
    k = 1
    while bernoulli(gamma / k, rng):
        k += 1
    return k % 2 == 1


def discrete_laplace(scale: Fraction, rng: Randomness = SYSTEM_RANDOM) -> int:
    """One sample Z with P(Z = z) proportional to exp(-|z| / scale) (CKS Algorithm 2)."""
    if scale <= 0:
        raise ValueError("scale must be > 0")
    t, s = scale.numerator, scale.denominator  # scale = t / s
    while True:
        u = rng.randrange(t)
        if not bernoulli_exp(Fraction(u, t), rng):
            continue
        v = 0
        while bernoulli_exp(Fraction(1), rng):
            v += 1
        y = (u + t * v) // s
        negative = rng.randrange(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_gaussian(sigma_squared: Fraction, rng: Randomness = SYSTEM_RANDOM) -> int:
    """One sample Z with P(Z = z) proportional to exp(-z² / (2σ²)) (CKS Algorithm 3)."""
    if sigma_squared <= 0:
        raise ValueError("sigma_squared must be > 0")
    t = math.isqrt(math.floor(sigma_squared)) + 1  # floor(sigma) + 1
    while True:
        y = discrete_laplace(Fraction(t), rng)
        gamma = (abs(y) - sigma_squared / t) ** 2 / (2 * sigma_squared)
        if bernoulli_exp(gamma, rng):
            return y
