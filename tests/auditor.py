"""A black-box statistical auditor of what leaves the door: a query is answered many times on a database and on a
neighbour, and from the two samples of what the client received an ε is found that the mechanism must at least
spend, with a stated confidence. Sensitivity tests check the SQL; this checks the released rows, with the key
spelling, rounding, clamping, partition selection, HAVING, LIMIT and every other post-processing step included.

The method is the one of DP-Auditorium's and the SQL-level testers' hockey-stick estimates, reduced to events:
(ε, δ)-DP says P[M(D) ∈ S] ≤ e^ε · P[M(D') ∈ S] + δ for every set S of outputs, so an event S that one side
shows far more often than the other bounds ε from below:

    ε ≥ ln((p_D(S) − δ) / p_D'(S)).

The draws are split in two. The first half chooses, among candidate events, the one with the largest estimate in
each direction (which side is D is part of the choice); the second half measures the two chosen events afresh,
with one-sided Clopper-Pearson bounds (the lower one for the numerator, the upper one for the denominator) at
confidence 1 − α/4 each, so the reported bound holds with probability at least 1 − α whichever events were
chosen. A bound above the claimed ε is then a violation at that confidence, not sampling error.

Candidate events read an output as the client does, as text: the exact text of every key column and the number
of rows (an output's *shape*: `5.0` and `5.00` are different outputs), and for each noisy cell thresholds at the
pooled sample's quantiles (`value ≤ t` and `value ≥ t`, a missing cell counting as neither).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scipy.stats import beta

Output = tuple[tuple[str, ...], ...]  # the rows a client received, every value as its text
THRESHOLDS = 16  # per noisy cell, quantiles of the pooled sample


@dataclass(frozen=True)
class Audit:
    name: str
    draws: int  # per database
    epsilon_lower_bound: float  # with probability >= 1 - alpha, the mechanism spends at least this
    claimed_epsilon: float
    claimed_delta: float
    event: str  # the event that gave the bound

    @property
    def violated(self) -> bool:
        return self.epsilon_lower_bound > self.claimed_epsilon * (1 + 1e-9)

    def row(self) -> str:
        bound = "∞" if math.isinf(self.epsilon_lower_bound) else f"{self.epsilon_lower_bound:.3f}"
        return (f"| {self.name} | {self.draws} | {bound} | {self.claimed_epsilon:g} | {self.claimed_delta:g} | "
                f"{'VIOLATED' if self.violated else 'ok'} | {self.event} |")


HEADER = ("| query class | draws per database | ε lower bound (95%) | claimed ε | claimed δ | verdict | event |\n"
          "|---|---|---|---|---|---|---|")


def as_text(rows: Sequence[Sequence[object]]) -> Output:
    """Rows as a client reads them: each value's text (None as NULL)."""
    return tuple(tuple("NULL" if v is None else str(v) for v in row) for row in rows)


def audit(name: str, draw: Callable[[str], Output], draws: int, keys: int, claimed_epsilon: float,
          claimed_delta: float = 0.0, alpha: float = 0.05) -> Audit:
    """Draw `draws` outputs from each side (`draw("base")`, `draw("neighbour")`), whose first `keys` columns are
    exact and the others noisy, and bound ε from below at confidence 1 - alpha."""
    base = [draw("base") for _ in range(draws)]
    neighbour = [draw("neighbour") for _ in range(draws)]
    half = draws // 2
    events = _events(base[:half] + neighbour[:half], keys)
    best = max(epsilon_lower_bound(base, neighbour, half, events, claimed_delta, alpha),
               epsilon_lower_bound(neighbour, base, half, events, claimed_delta, alpha, swapped=True))
    return Audit(name, draws, best[0], claimed_epsilon, claimed_delta, best[1])


def epsilon_lower_bound(first: list[Output], second: list[Output], half: int,
                        events: list[tuple[str, Callable[[Output], bool]]], delta: float, alpha: float,
                        swapped: bool = False) -> tuple[float, str]:
    """The event that most separates `first` from `second` on the first `half` draws, and the bound its
    frequencies on the remaining draws give (ln((p1 − δ)/p2) with Clopper-Pearson ends at 1 − alpha/4)."""
    chosen, best = None, -math.inf
    for label, test in events:
        hits1 = sum(map(test, first[:half]))
        hits2 = sum(map(test, second[:half]))
        estimate = math.log((hits1 + 0.5) / (hits2 + 0.5))  # a smoothed estimate, for choosing only
        if estimate > best:
            chosen, best = (label, test), estimate
    if chosen is None:
        return 0.0, "no event"
    label, test = chosen
    n1, n2 = len(first) - half, len(second) - half
    hits1, hits2 = sum(map(test, first[half:])), sum(map(test, second[half:]))
    low1 = _clopper_pearson_low(hits1, n1, alpha / 4)
    high2 = _clopper_pearson_high(hits2, n2, alpha / 4)
    if low1 - delta <= 0:
        return 0.0, label
    bound = math.inf if high2 == 0 else max(0.0, math.log((low1 - delta) / high2))
    side = "neighbour" if swapped else "base"
    return bound, f"{label} ({hits1}/{n1} on the {side}, {hits2}/{n2} on the other)"


def _clopper_pearson_low(hits: int, n: int, alpha: float) -> float:
    return 0.0 if hits == 0 else float(beta.ppf(alpha, hits, n - hits + 1))


def _clopper_pearson_high(hits: int, n: int, alpha: float) -> float:
    return 1.0 if hits == n else float(beta.ppf(1 - alpha, hits + 1, n - hits))


def _shape(output: Output, keys: int) -> tuple:
    return tuple(row[:keys] for row in output)


def _cells(output: Output, keys: int) -> dict[tuple, float]:
    """Each noisy value by (its row's key text, its column)."""
    cells = {}
    for row in output:
        for j, text in enumerate(row[keys:]):
            try:
                cells[(row[:keys], j)] = float(text)
            except ValueError:
                continue
    return cells


def _events(sample: list[Output], keys: int) -> list[tuple[str, Callable[[Output], bool]]]:
    """Candidate events from a pooled sample: each shape seen, and thresholds on each noisy cell."""
    events: list[tuple[str, Callable[[Output], bool]]] = []
    for shape in dict.fromkeys(_shape(o, keys) for o in sample):
        events.append((f"keys {list(shape)[:4]}{'…' if len(shape) > 4 else ''}",
                       lambda o, s=shape: _shape(o, keys) == s))
    values: dict[tuple, list[float]] = {}
    for output in sample:
        for cell, value in _cells(output, keys).items():
            values.setdefault(cell, []).append(value)
    for cell, seen in values.items():
        seen.sort()
        for t in dict.fromkeys(seen[int(q * (len(seen) - 1) / THRESHOLDS)] for q in range(1, THRESHOLDS)):
            events.append((f"{cell} <= {t:g}", lambda o, c=cell, t=t: _cells(o, keys).get(c, math.nan) <= t))
            events.append((f"{cell} >= {t:g}", lambda o, c=cell, t=t: _cells(o, keys).get(c, math.nan) >= t))
    return events
