"""R2T's race to the top (Dong, Fang, Yi, Tao and Machanavajjhala, "R2T: Instance-optimal Truncation for
Differentially Private Query Evaluation with Foreign Keys", SIGMOD 2022), used to choose a per-unit bound from
the data instead of a guessed one.

Given Q(τ) = Σ_u min(c_u, τ), the query's rows with each unit's c_u rows capped at τ, for τ = 1, 2, 4, … up to a
declared cap, one unit moves each Q(τ) by at most τ (it adds or removes at most τ capped rows). Each of the J
values is released with Laplace noise for sensitivity τ at ε/J, shifted down by the noise's bound at
confidence 1 − β/J, and the τ whose shifted value is largest is chosen: below it truncation loses more than
the noise would cost, above it the shift (proportional to τ) outweighs what little more it keeps. The choice
is post-processing of J pure (ε/J)-DP releases, so it is ε-DP by basic composition; R2T shows the released
value is within O(log(cap)·log(log(cap)/β)·τ*/ε) of the truth, τ* the instance's best cap. dpsql uses four times
the chosen τ (at most the cap) as the bound the rewrite enforces for the query itself, answered with the rest of
its ε (`bound`). The shift covers the race's own noise, J/share times coarser than the answer's, so the race
stops where truncation still loses about that much, a bias the answer's interval does not cover; the margin
buys that loss back at a few times a small noise. Measured on the demo data (`tests/test_accuracy.py`, 20,000
people, 60 answers per class): with twice the chosen τ a filter that keeps a few rows per person (lab and dental
visits) came back 0.45% low with 71% coverage; with four times, 0.03% and 97%, at a monthly median error of 1.6%
instead of 0.9%. At 3,000 people the count bias went from −10% (twice) to −1.3% (four times). β = 0.01: at 0.1
one race in twenty let a large τ win on its noise.

The same race chooses the bound on each unit's total of a sum (c_u its total of non-negative values, τ up to
its declared rows times the largest value): one unit moves Σ_u min(c_u, τ) by at most τ as well. Totals are
released on a grid (`integer_valued` False) and their answer keeps eight times the chosen τ (`margin`): a
unit's totals spread over more scales than its rows, and at four times the demo's sum of all visits came back
0.3% low, beyond its 0.12% noise.

Where the query reads few units for the race's ε (its first value, Q(1) = the units read, under MIN_RESOLUTION
times its shift at τ = 1), the race cannot tell a bound that keeps most rows from one that drops most. Before
this rule, at ε = 0.1, TPC-H Q11 and Q20 over 10,000 suppliers (ratio about 1) came back 96% and 99% low and the
demo's sums and averages over 20,000 people (ratio 2) 34% low; Q18 over 100,000 customers (ratio 9) was within
0.1%. The threshold, 4, is measured, not derived; the ratio counts units, not how many rows each holds. A
threshold of 8 would send the demo's counts at ε = 0.1 (ratio 5.3) to the fallback below, but also a 2,000-unit
database at ε = 1 (ratio 5.7, tests/test_owner.py's clinic), where the fallback's search ran to the cap in 7.5%
of answers (its noise at ε = 0.2 is 20 units, and it continues past each empty τ half the time).

Between MIN_RESOLUTION and COARSE_RESOLUTION shifts the race resolves the data, but coarsely: its noise hides
more of the tail above the chosen τ than MARGIN buys back, so the answer keeps twice the margin (`margin_at`,
post-processing of the released Q(1)). Measured with `benchmarks/bench_accuracy.py --people 20000 --runs 60
--epsilon 0.1`: the demo's counts by quarter, month and category (ratio 5.3; their race chooses τ = 4 or 8, and
Q(16) is 8.6% below Q(64)) went from 5.2%, 5.1% and 3.3% low with 36%, 85% and 75% coverage to within 1.2% with
94-96% coverage, and their median errors from 7.7-8.6% to 2.9-7.3%. The price is twice the noise where the
tail is light: TPC-H's customer queries at ε = 0.1 (ratios 9 and up, nothing lost at four times) went from
0.05-0.08% to 0.11-0.28% median error (two runs), Q11 and Q20 at ε = 0.8 from 0.13% to 0.12-0.23%
(benchmarks/results/tpch_r2t.md). At 16 shifts and more (the demo at ε = 1: 53) nothing changes.

Where the race cannot resolve the data, answering at the cap would cost noise thousands of times the answer (TPC-H
Q11 and Q20 at ε = 0.1: 4,650% and 100% median error when it did). `decide` spends a share of the answer's ε on the
sparse vector technique instead (`FirstBelowThreshold`, one ε however many τ it compares): for each τ but the last,
how many units hold more than τ, counted fractionally as (Q(τ') − Q(τ)) / (τ' − τ) with τ' the next τ (each unit
adds between 0 and 1 to each, so each has sensitivity 1, 2 under replace), and the first τ where that count falls
below one scale of the comparisons' noise (FALLBACK_THRESHOLD; the noise an even split of the ε gives them, though
under add-remove the counts move together and the search draws less, `sparse`), where the noise can no longer tell
it from a few units, is taken, times FALLBACK_MARGIN. With a threshold of 0 an empty τ was passed half the time, so
the search ran on through the empty τ above the data, doubling the bound each time, and reached the cap in one
answer in 2^(empty τ): TPC-H Q11 at ε = 0.1 chose from 512 to 262,144 (0.87% median error) and Q20 up to 262,144
(1.17%); at one scale they choose 512 to 2,048 (0.45% and 0.48%), and on the demo at ε = 0.1 SUM(amount) by quarter
went from 8.1% median error (worst answer 1,007%) to 4.8-6.3% (152-744%), AVG(amount) from 8.2% to 2.5-4.7%, the
lab and dental count from 5.7% to 2.4-3.1% (`bench_accuracy.py --epsilon 0.1`, three runs of 60 answers;
`bench_tpch_r2t.py`, 25). The price is coverage where the tail is heavy: the demo's sums' intervals held the truth
in 83-93% of answers (92-95% before), since the search now stops where about one noise scale of units still hold
more. Measured alternatives: half a scale gave 87-95% coverage but Q11 and Q20 at 0.69% and 0.76% with a run to
8,388,608; a margin of 4 gave 95-98% coverage but the demo's median errors back at 5-12% and Q20 at 1.14%. The
search still stops late rather than early (its noise is larger than the counts it stops at), so the margin is
smaller than the race's: on the demo data at ε = 0.1 (tests/test_accuracy.py's classes, 40 answers each, with
MIN_RESOLUTION at 8 so that counts took this path too) twice the chosen τ kept coverage at 91-97% with median
errors of 2-12%, the race's margins (4 and 8) gave 7-31%, and the τ itself (no margin) let coverage fall to 70-88%.
The race's own values cost their ε either way; this choice is (the share)-DP, taken from the answer's ε, so the
query's ε is unchanged. Measured in benchmarks/results/tpch_r2t.md and accuracy_eps0.1.md.

An answer of a few cells (one without GROUP BY, or at most FEW_CELLS declared groups: `cells`) keeps twice that
margin. A grouped answer spreads what the bound cuts over its groups while each group keeps the whole noise, so
with many groups the cut hides in the noise; with few, each cell's noise is small beside its share of the cut,
which then shows beyond the interval. Measured on the demo data with 3,000 people at ε = 0.25 (ratio about 2:
this path; `bench_accuracy.py --people 3000 --runs 40 --epsilon 0.25`), twice the τ left the few-cell answers
biased with intervals that missed: SUM(amount) −3.6% with 60% coverage, AVG(amount) −10.8% with 78%, the lab and
dental counts (2 groups) 82%, visits by quarter (4) −6.2% with 88%, COUNT(*) of visits −3.5% (median of 300)
with 60%. Four times gave 90-94% coverage and no bias beyond two standard errors
(benchmarks/results/accuracy_3000_eps0.25.md), at median errors 0.5-1.6 times as large; for 8 and 12 groups (by
category, by month) it doubled them (13% to 26%, 24% to 43%) at the coverage twice had (95-97%), so those keep
twice. At 20,000 people and ε = 0.1 (accuracy_eps0.1.md) the few-cell sums and averages went from 90% coverage to
93-97%, their median errors from 1.7-5.3% to 3.0-10.7%. On TPC-H, whose contributions end sharply so that twice
the τ cut nothing, it is only the price: Q11 and Q20 at ε = 0.1 went from 0.34% and 0.66% to 0.56-0.70% and
1.3-1.6% median error (25 answers each, two runs, tpch_r2t.md).

The same reasoning sets the margin of a race over totals where it resolves the data (`many_cells_margin`, set
in `dpsql.chosen_bounds`): an answer of more than FEW_CELLS cells, or of private keys, keeps half the totals'
margin, since eight times the chosen τ keeps every unit's total at twice the noise each cell needs.

An answer of more than MANY_CELLS cells (a day's counts over a year: 366) keeps half the margin again, rows or
totals. Its cells' relative noise grows with their number while the share a bound cuts from each stays that of
the whole, so there the noise of a wide margin costs more than the cut it saves. Measured on the demo data at
ε = 1 (/tmp scripts of the session, 10-20 answers of 366 cells): COUNT(*) by day over 100,000 people went from
11.2% to 7.7% median error (coverage 95% and 94%; the race chose τ = 32 and kept the cap of 100, where a person
holds at most 51 visits), and with SUM and AVG beside it from 40%, 45% and 68% to 25%, 19% and 35% (coverage
95-97%); over 20,000 people from 64% and 86% (count and sum) to 37% and 43%, median bias −2.2% and −3.4% (from
0.0% and +0.9%) at coverage 97% and 95%. Weekly counts (53 cells, 20,000 people) keep the margin: halved, their
median error went from 9.8% to 7.3% but with a −1.7% bias and 91% coverage.

Below the cap, `decide` can also count the units that hold more than the bound it chose (`units_over`): the
fractional count of `units_above` at that τ (sensitivity 1, 2 under replace) released with Laplace noise at a
share of the answer's ε (EFFECT_SHARE), so that the answer can say what its bound leaves out. The race's own
released Q(1) stands for the units read (no further ε).

Where the race resolved the data and that count shows many units over its bound (the count's 95% interval's low end
above the fallback's threshold at RAISE_SHARE of the answer's ε, or above `visible_cut`: the units, each holding at
least the bound more, whose cut the answer's noise cannot hide), `decide` spends that share on the fallback's sparse
vector from the bound upward (`raised`): the first τ that fewer units exceed. (Where the race could not resolve the
data, the bound already is that search's choice, at a larger share and a lower threshold: a raise from it would
follow the count's noise; CI caught one at ε = 0.1.) R2T's shift at ε/J a step stops where about ln(J/β)·J/ε units
still exceed τ (2,135 at ε = 0.1 over 27 τ), which the margins buy back where units' totals end near it but not
where they are heavy-tailed: the demo's per-person total averaged per visit (Tableau's FIXED, `AVG(t.total)` over
visits joined to each person's `SUM(amount)`) over 20,000 people kept 32,768 of per-person totals up to 289,184, 463
persons over it holding 35% of the mass, and came back 37% low with 4% coverage; raised (to 131,072 in 13 of 20
answers), 6.9% median error, bias −4.2%, coverage 85% (ε = 1, /tmp scripts of the session). Where the race's bound
holds nearly every unit the count is small and nothing more is spent: `bench_accuracy.py --people 20000 --runs 40`
moved within its noise (no bound was raised in 10-20 answers each of SUM, AVG and stddev of the amounts, in all and
by category, and of visits by month, by category and, over 100,000 people, by day). The trigger reads a released
count and public constants (post-processing); the search is the sparse vector's ε. The fallback's threshold alone
kept `SUM(t.total)` of the same (8 cells), whose race keeps 65,536 with about 120 persons' worth of totals over it,
raised in about a third of answers and 5.9% low (coverage 59%); beside the visible cut (11 units there) 3.2% low,
coverage 78% (40 answers each).

A raise compares at most RAISE_REACH τ from the bound (up to 8 times it) and keeps the next where all show many
units (16 times it). The sparse vector's threshold noise, drawn low, can carry a search past the data's end, each
comparison of nearly no units then drawing its own way above the threshold: over the per-person total averaged
per visit (2,000 seeded choices from its race's exact values at 20,000 people), 1% of raises went from 65,536 to
between 2 million and the cap of 50 million, a noise up to 760 times the usual bound's (one answer of 40 came
back +3,851%). With the reach, none goes past 1,048,576 and the usual bounds are chosen as often.

All of this reads the differences of Q(τ) as counts of units, which holds where Q(τ) is Σ over units of min(the
unit's rows or total, τ). A race over how many distinct values the rows each unit keeps at τ find (a count of
distinct values, `counts_units` False) moves each Q(τ) by at most τ, one way, but a unit may find early a value
others find later, so its differences are not counts of units: there only the race's own choice is made.

The privacy map is the mechanisms' own: `epsilon` is the sum of theirs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.mechanisms.samplers import SYSTEM_RANDOM, Randomness, check_positive
from dpsql.mechanisms.sparse import FirstBelowThreshold

BETA = 0.01  # the shift covers each value's noise with probability 1 - β/J
MARGIN = 4  # the answer keeps up to MARGIN times the chosen τ rows per unit (see the module docstring)
MIN_RESOLUTION = 4  # the units read, in shifts of τ = 1, below which the race cannot resolve the data (`resolves`)
COARSE_RESOLUTION = 16  # below this many shifts the race resolves the data coarsely: the answer keeps twice the margin
FALLBACK_MARGIN = 2  # the sparse vector's choice overshoots already: the answer keeps twice it (module docstring)
FEW_CELLS = 4  # an answer of at most this many cells keeps twice FALLBACK_MARGIN
MANY_CELLS = 100  # an answer of more cells than this keeps half the race's margin (the module docstring)
FALLBACK_SHARE = 0.25  # of the answer's ε, spent choosing the bound where the race cannot resolve the data
FALLBACK_THRESHOLD = 1  # the fallback stops below this many noise scales of an even split's comparisons (module
# docstring; `fallback_threshold`)
EFFECT_SHARE = 0.05  # of the answer's ε, spent counting the units that hold more than the chosen bound
RAISE_SHARE = 0.1  # of the answer's ε, spent raising a bound that the count over it shows many units exceed
RAISE_REACH = 4  # the τ a raise compares: it reaches at most 16 times the race's bound (the module's docstring)


@dataclass(frozen=True)
class UnitsOver:
    """How many units hold more than the answer's bound, released (`RaceToTheTop.units_over`)."""
    bound: int
    units: float  # counted fractionally up to the next τ, as `units_above`
    halfwidth: float  # of its 95% interval
    units_read: float  # the race's own released Q(1): the units the query reads (no further ε)
    epsilon: float


class Decision(NamedTuple):
    """What `RaceToTheTop.decide` chose for the answer."""
    bound: int  # what the rewrite enforces for the answer
    spent: float  # the ε taken from the answer's (the fallback's choice, the units over the bound, the raise)
    over: UnitsOver | None = None  # the units over the race's bound (`over.bound`, below `bound` where raised)
    tau: int | None = None  # the τ chosen, before the margin (None: the cap stands)
    raise_epsilon: float = 0.0  # the sparse vector's ε where it raised the bound (`RaceToTheTop.raised`)


def few_cells(cells: int | None) -> bool:
    """Whether an answer of `cells` cells (None: its keys are private, so not known before the data) has at most
    FEW_CELLS: a bound's cut then shows beside each cell's noise (the module docstring)."""
    return cells is not None and cells <= FEW_CELLS


def taus(cap: int) -> tuple[int, ...]:
    """1, 2, 4, … below `cap`, and `cap` itself."""
    found, tau = [], 1
    while tau < cap:
        found.append(tau)
        tau *= 2
    return (*found, cap)


@dataclass(frozen=True)
class RaceToTheTop:
    taus: tuple[int, ...]
    mechanisms: tuple[LaplaceMechanism, ...]  # one per τ: sensitivity steps·τ at ε/J
    beta: float = BETA
    margin: int = MARGIN  # the answer's bound is this many times the chosen τ
    many_cells_margin: int | None = None  # the margin of an answer of more than FEW_CELLS cells, where it differs
    # Q(τ) is Σ over units of min(the unit's rows or total, τ), so its differences count units (`units_above`),
    # which the fallback, the count over the bound and the raise read; False: only the race's own choice
    counts_units: bool = True

    @classmethod
    def calibrate(cls, cap: int, epsilon: float, steps: int = 1, beta: float = BETA,
                  integer_valued: bool = True, margin: int = MARGIN,
                  many_cells_margin: int | None = None, counts_units: bool = True) -> RaceToTheTop:
        """The race over τ = 1, 2, 4, …, cap at `epsilon` in all (`steps` = 2 under replace neighbours);
        `integer_valued` False for truncated sums of values (released on a grid); `counts_units` False where
        Q(τ) is not a sum over units of min(its value, τ) (a count of distinct values found at τ)."""
        check_positive("epsilon", epsilon)
        chosen = taus(cap)
        share = epsilon / len(chosen)
        return cls(chosen, tuple(LaplaceMechanism.calibrate(steps * t, share, integer_valued) for t in chosen), beta,
                   margin, many_cells_margin, counts_units)

    @property
    def epsilon(self) -> float:
        """The privacy map: the J releases compose to the sum of their ε."""
        return sum(m.epsilon for m in self.mechanisms)

    def shift(self, index: int) -> float:
        """How far the index-th noisy value is moved down: its noise exceeds this with probability β/J at most
        (discrete Laplace: P(Z > m) <= exp(-m/t))."""
        mechanism = self.mechanisms[index]
        return mechanism.scale * math.log(len(self.taus) / self.beta)

    def choose(self, truncated: Sequence[float], rng: Randomness = SYSTEM_RANDOM) -> int:
        """The chosen τ, from Q(τ) for each τ of the race (in order)."""
        return self._best(self._shifted(truncated, rng))

    @property
    def steps(self) -> int:
        """How far one neighbour moves Q(τ), in τ: 1 (add or remove a unit) or 2 (replace one)."""
        return round(self.mechanisms[0].sensitivity / self.taus[0])

    def bound(self, truncated: Sequence[float], rng: Randomness = SYSTEM_RANDOM) -> int:
        """The bound to enforce for the answer: `margin` times the chosen τ, at most the cap; the cap itself where
        the race cannot resolve the data (`resolves`)."""
        return self.decide(truncated, 0.0, rng)[0]

    def decide(self, truncated: Sequence[float], fallback_epsilon: float, rng: Randomness = SYSTEM_RANDOM,
               effect_epsilon: float = 0.0, cells: int | None = None, raise_epsilon: float = 0.0,
               visible_cut: float = math.inf) -> Decision:
        """The bound to enforce for the answer, and the ε it took from the answer's: where the race resolves the
        data, nothing; where it does not, `fallback_epsilon` spent on the first τ that few units exceed (the
        module's docstring; twice the margin for an answer of at most FEW_CELLS `cells`, None where the groups
        are not known before the data), or nothing and the cap when `fallback_epsilon` is 0. With
        `effect_epsilon`, also the units holding more than a bound below the cap (`units_over`), at that ε more;
        and where the race chose the bound and that count shows many units over it (more than the fallback's
        threshold at `raise_epsilon`, or than `visible_cut`: the units whose cut the answer's noise cannot hide),
        `raise_epsilon` more on a higher bound (`raised`)."""
        shifted = self._shifted(truncated, rng)
        tau, resolved = None, self.resolves(shifted)
        if not self.counts_units:  # nothing but the race's own choice reads Q(τ) (`counts_units`)
            fallback_epsilon = effect_epsilon = raise_epsilon = 0.0
        if resolved:
            tau = self._best(shifted)
            bound, spent = min(self.margin_at(shifted, cells) * tau, self.taus[-1]), 0.0
        elif fallback_epsilon <= 0 or len(self.taus) < 2:
            bound, spent = self.taus[-1], 0.0
        else:
            # one unit added or removed moves every count of units above τ the same way (`units_above`)
            sparse = FirstBelowThreshold.calibrate(self.steps, fallback_epsilon, monotone=self.steps == 1)
            index = sparse.first_below(self.units_above(truncated), self.fallback_threshold(fallback_epsilon), rng)
            tau = None if index is None else self.taus[index]
            margin = FALLBACK_MARGIN * (2 if few_cells(cells) else 1)
            bound = self.taus[-1] if tau is None else min(margin * tau, self.taus[-1])
            spent = sparse.epsilon
        if effect_epsilon <= 0 or bound >= self.taus[-1]:
            return Decision(bound, spent, tau=tau)
        over = self.units_over(truncated, bound, effect_epsilon, shifted[0] + self.shift(0), rng)
        spent += over.epsilon
        # the fallback's bound is already the sparse vector's first τ that few units exceed, searched at more ε
        # and a lower threshold: a raise from it would answer the count's noise
        many = min(self.fallback_threshold(raise_epsilon), visible_cut) if raise_epsilon > 0 else math.inf
        if not resolved or over.units - over.halfwidth <= many:
            return Decision(bound, spent, over, tau)
        sparse, higher = self.raised(truncated, bound, raise_epsilon, rng)
        return Decision(higher, spent + sparse, over, tau, sparse)

    def raised(self, truncated: Sequence[float], bound: int, epsilon: float,
               rng: Randomness = SYSTEM_RANDOM) -> tuple[float, int]:
        """A bound above `bound` (a τ below the cap) where the count over it showed many units exceed it (the
        module's docstring): the first of the RAISE_REACH τ from `bound` on that fewer than one noise scale of
        units exceed (the fallback's sparse vector and threshold, at `epsilon`), else the τ after them (at most
        the cap). Its ε and the bound: (ε, bound)."""
        start = self.taus.index(bound)
        sparse = FirstBelowThreshold.calibrate(self.steps, epsilon, monotone=self.steps == 1)
        compared = self.units_above(truncated)[start:start + RAISE_REACH]
        index = sparse.first_below(compared, self.fallback_threshold(epsilon), rng)
        return sparse.epsilon, self.taus[min(start + (len(compared) if index is None else index), len(self.taus) - 1)]

    def fallback_threshold(self, epsilon: float) -> float:
        """Where the sparse vector's search stops: FALLBACK_THRESHOLD scales of the noise an even split of
        `epsilon` gives each comparison, where it was measured (a monotone search draws less, `sparse`)."""
        return FALLBACK_THRESHOLD * FirstBelowThreshold.calibrate(self.steps, epsilon).value_noise

    def units_over(self, truncated: Sequence[float], bound: int, epsilon: float, units_read: float,
                   rng: Randomness = SYSTEM_RANDOM) -> UnitsOver:
        """The units holding more than `bound` (a τ of the race below the cap), counted fractionally up to the
        next τ (`units_above`: sensitivity 1 per neighbouring step), released with Laplace noise at `epsilon`.
        `units_read` is the race's released Q(1), already paid for."""
        mechanism = LaplaceMechanism.calibrate(self.steps, epsilon, False)
        units = mechanism.release(self.units_above(truncated)[self.taus.index(bound)], rng)
        return UnitsOver(bound, units, mechanism.ci_halfwidth(), units_read, mechanism.epsilon)

    def units_above(self, truncated: Sequence[float]) -> list[float]:
        """For each τ but the last, the units holding more than τ, counted fractionally: (Q(τ') − Q(τ)) / (τ' − τ)
        for the next τ'. One unit adds between 0 and 1 to each."""
        return [(float(truncated[i + 1]) - float(truncated[i])) / (self.taus[i + 1] - self.taus[i])
                for i in range(len(self.taus) - 1)]

    def margin_for(self, cells: int | None) -> int:
        """The margin an answer of `cells` cells keeps above the chosen τ: `many_cells_margin` beyond FEW_CELLS,
        where set, and half of that beyond MANY_CELLS (the cells are public: the declared domain's size, None
        for private keys, which keep the margin)."""
        margin = self.margin if self.many_cells_margin is None or few_cells(cells) else self.many_cells_margin
        return max(margin // 2, 1) if cells is not None and cells > MANY_CELLS else margin

    def margin_at(self, shifted: Sequence[float], cells: int | None = 1) -> int:
        """`margin_for(cells)`, twice it where the race resolves the data only coarsely (the units read under
        COARSE_RESOLUTION shifts of τ = 1; post-processing, no ε)."""
        coarse = shifted[0] + self.shift(0) < COARSE_RESOLUTION * self.shift(0)
        return (2 if coarse else 1) * self.margin_for(cells)

    def may_resolve(self, most: float) -> bool:
        """Whether the race could resolve data whose Q(1) is at most `most` (a public bound): else `resolves` holds
        only where the noise lifts Q(1), and the race is the cap's."""
        return most >= MIN_RESOLUTION * self.shift(0)

    def resolves(self, shifted: Sequence[float]) -> bool:
        """Whether the race can tell bounds apart on this data: Q(1), the units the query reads (each adds at most
        1), released, against the shift of τ = 1, the growth per unit of τ that the race may miss at each step.
        Below MIN_RESOLUTION times it, the race would stop where most rows are still ahead (post-processing of
        the released values: no ε)."""
        return shifted[0] + self.shift(0) >= MIN_RESOLUTION * self.shift(0)

    def _shifted(self, truncated: Sequence[float], rng: Randomness) -> list[float]:
        if len(truncated) != len(self.taus):
            raise ValueError("one truncated value per τ")
        return [m.release(float(value), rng) - self.shift(i)
                for i, (m, value) in enumerate(zip(self.mechanisms, truncated, strict=True))]

    def _best(self, shifted: Sequence[float]) -> int:
        best = max(range(len(shifted)), key=lambda i: (shifted[i], -i))  # ties: the smaller τ
        return self.taus[best]


__all__ = ["EFFECT_SHARE", "FALLBACK_SHARE", "FEW_CELLS", "MANY_CELLS", "RAISE_REACH", "RAISE_SHARE", "Decision",
           "RaceToTheTop", "UnitsOver", "taus"]
