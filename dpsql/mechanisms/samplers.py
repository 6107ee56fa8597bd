"""Exact samplers for the discrete Laplace and discrete Gaussian distributions.

These follow Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy" (2020),
Algorithms 1-3. They use only integer arithmetic on exact rationals, so no floating-point rounding can
leak information (Mironov 2012). Randomness comes from an object with `randrange(n)`; in production that
is `BufferedSystemRandom` (the OS CSPRNG, as `random.SystemRandom`, read in blocks). Tests inject a seeded
`random.Random` to check exact distributions; nothing outside `dpsql.mechanisms` passes one.
"""

from __future__ import annotations

import functools
import math
import os
import random
import threading
from fractions import Fraction
from typing import Protocol


class Randomness(Protocol):
    def randrange(self, stop: int) -> int: ...


_forks = [0]  # how many forks this process descends through: a buffer read before the last one is the parent's
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class BufferedSystemRandom(random.Random):
    """The OS CSPRNG, as `random.SystemRandom`, read 4 KiB at a time instead of one system call per draw: a
    query's noise takes thousands of small draws (a Bernoulli(exp(-γ)) loop per sample). With `_randbelow`
    below, the noise of the peers' count by state and sex (150 groups, 100,000 people) took 2.2 ms instead of
    4.4. Each thread reads its own buffer; a forked child discards what it inherited, so
    that parent and child never draw the same bytes."""

    BUFFER = 4096

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def getrandbits(self, k: int) -> int:
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        size = (k + 7) // 8
        local = self._local
        if getattr(local, "generation", None) != _forks[0]:
            local.buffer, local.position, local.generation = b"", 0, _forks[0]
        start, end = local.position, local.position + size
        if end > len(local.buffer):
            local.buffer, start, end = os.urandom(max(self.BUFFER, size)), 0, size
        local.position = end
        return int.from_bytes(local.buffer[start:end], "big") >> (size * 8 - k)

    def _randbelow(self, n: int) -> int:
        """Uniform in [0, n) by rejection, as Random's, but with the bits of n - 1: a power of two takes one
        draw (Random's takes n's bits and rejects half), and n = 1 none. The samplers' Bernoulli loops ask for
        randrange(1), (2), (4)… most of the time."""
        bits = (n - 1).bit_length()
        if not bits:
            return 0
        r = self.getrandbits(bits)
        while r >= n:
            r = self.getrandbits(bits)
        return r

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        if stop is None and step == 1 and type(start) is int and start > 0:  # the samplers' one call
            return self._randbelow(start)
        return super().randrange(start, stop, step)

    def random(self) -> float:
        return self.getrandbits(53) * 2.0 ** -53

    def seed(self, *args: object, **kwargs: object) -> None:  # the OS seeds it; as SystemRandom, ignored
        return None

    def getstate(self) -> None:
        raise NotImplementedError("the OS CSPRNG has no state to save")

    setstate = getstate  # type: ignore[assignment]


SYSTEM_RANDOM: Randomness = BufferedSystemRandom()


def check_positive(name: str, value: float) -> None:
    """A mechanism parameter must be a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")


def bernoulli(p: Fraction, rng: Randomness) -> bool:
    """True with probability p (a rational in [0, 1])."""
    return rng.randrange(p.denominator) < p.numerator


def bernoulli_times_inverse_e(c: Fraction, rng: Randomness) -> bool:
    """True with probability c / e, for a rational 0 <= c <= e: a uniform, drawn 64 bits at a time, is compared
    with rational bounds on c / e that narrow as it lengthens, until it falls clear of them (almost always at
    the first 64 bits). Exact: no rounding decides the outcome."""
    if not 0 <= c <= Fraction(271828, 100000):
        raise ValueError("c must lie in [0, e]")
    u, bits = 0, 0
    while True:
        u, bits = (u << 64) | rng.randrange(1 << 64), bits + 64
        low, high = _inverse_e_bounds(bits + 2)
        if (u + 1) * c.denominator <= c.numerator * low * (1 << bits):
            return True  # the whole of [u, u + 1) / 2^bits lies below c·low <= c / e
        if u * c.denominator >= c.numerator * high * (1 << bits):
            return False


@functools.lru_cache(maxsize=16)
def _inverse_e_bounds(bits: int) -> tuple[Fraction, Fraction]:
    """Rationals low <= 1/e <= high, each within 2^-bits of it: partial sums of Σ (-1)^k / k! alternate about 1/e,
    each within the next term of it."""
    total, term, k = Fraction(0), Fraction(1), 0
    while term >= Fraction(1, 1 << bits):
        total += term if k % 2 == 0 else -term
        k += 1
        term /= k
    return total - term, total + term


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
