"""The plan the analysis builds: the noisy statistics a query needs, with their bounds and sensitivities.

The rewrite turns a plan into SQL, `noise` calibrates its mechanisms, `postprocess` finishes its answers;
nothing here reads data or knows how a plan was found.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqlglot import exp

from dpsql.analysis.expressions import Range
from dpsql.schema.model import LocalRandomizer
from dpsql.sql import to_sql

COUNTS = ("count", "count_units")
# what each unit's kept rows weigh in all in partition selection's counts, where they are weighted
# (`Plan.selects_on_weights`): each row W // (the unit's kept rows), exact for up to 16 rows (lcm of 1..16)
SELECTION_WEIGHT = 720720


@dataclass(frozen=True)
class Measure:
    """A per-group sum of a bounded per-row expression; one noisy statistic per group."""

    name: str
    label: str
    kind: str  # sum: SUM(expr) | count: COUNT(expr), COUNT(*) if expr is None | units: distinct units
    #          | distinct: COUNT(DISTINCT expr), row-level privacy only
    expr: exp.Expression | None  # guarded per-row value
    row_range: Range  # every row's value lies here (the rewrite clamps to it)
    unit_range: tuple[float, float]  # one unit's total lies here (the rewrite clamps to it)
    sensitivity: float  # L1 over all groups for neighbouring databases
    l2_sensitivity: float  # L2 over all groups
    coordinates: int  # how many groups one neighbour can change
    centre: float = 0.0  # sum only: the statistic is SUM(expr - centre), computed as SUM(expr) - centre·COUNT(expr)
    # sum only: the name of the plain sum whose values this one sums the squares of (a variance's); where a race
    # bounds each unit's total of a sum, this is the sum it bounds (`Plan.bounded_sums`)
    squares_of: str | None = None
    # sum only: the most a unit's total reaches by the declared bounds of what it sums, where that is below
    # unit_range (a subquery's count of a unit's groups adds up to its k rows, not k groups of k): the top of the
    # race's ladder, whose chosen bound the rewrite enforces (`chosen_bounds.plan_race`)
    natural_total: float | None = None
    values: int | None = None  # distinct only: how many values its expression may take, where they are public

    @property
    def integer_valued(self) -> bool:
        return self.row_range.integer


@dataclass(frozen=True)
class Histogram:
    """Exact counts of a bounded value per cell of a fixed grid over its declared range, per group. The
    exponential mechanism chooses a cell from them (quantiles, MIN, MAX); one unit moves at most `rows`
    counts of each group's histogram, in at most `groups` groups."""

    name: str
    label: str
    cell: exp.Expression  # guarded per-row cell index in 0 .. cells - 1 (NULL when the value is NULL)
    cells: int
    lower: float  # cell j covers [lower + j·width, lower + (j+1)·width); integer grids hold one value each
    width: float
    integer: bool
    rows: int  # the most rows one unit keeps per group (the rewrite keeps at most this many)
    groups: int  # the most groups one unit touches
    sensitivity: float  # how far one unit moves any candidate's rank score, over all groups

    values: tuple | None = None  # categorical cells (mode over a declared domain): cell j holds values[j]
    graded: GradedGrid | None = None  # real values: cells even in `graded.position(x)`, not in x

    def value(self, cell: int) -> Any:
        """The value reported for a chosen cell: the domain value, the integer itself, or the cell's midpoint."""
        if self.values is not None:
            return self.values[cell]
        if self.graded is not None:
            return self.graded.value(self.lower + (cell + 0.5) * self.width)
        return self.lower + cell * self.width + (0 if self.integer else self.width / 2)


@dataclass(frozen=True)
class GradedGrid:
    """A histogram's grid for real values, fine where values are small and no coarser than twice an even grid
    where they are large: cells are even in position(x) = asinh(x / knee) + x · slope. Below the knee the grid
    is even; above it, asinh grows as ln, so each cell spans a fixed share of its values, and the linear term
    keeps the cells near the range's ends from growing past twice an even grid's. Heavy-tailed values (costs,
    incomes) sit far below the caps declared above them, where an even grid of the cap's range is coarse: the
    median cost of the demo (20, cap 1000) came back as its even cell's midpoint, 20.5, 2.1% high.
    The grid is a function of the declared range alone, so which cell a value falls in reveals nothing."""

    knee: float
    slope: float

    @classmethod
    def over(cls, lo: float, hi: float) -> GradedGrid:
        """The grid for values in [lo, hi]: the knee 10⁻⁴ of the largest magnitude, and the linear term as
        long over the range as the logarithmic one."""
        top = max(abs(lo), abs(hi)) or 1.0
        knee = top * 1e-4
        return cls(knee, math.asinh(top / knee) / top)

    def position(self, x: float) -> float:
        return math.asinh(x / self.knee) + x * self.slope

    def value(self, position: float) -> float:
        """The x at a position (position is strictly increasing, so bisection finds it)."""
        lo, hi = -1.0, 1.0
        while self.position(lo) > position:
            lo *= 2
        while self.position(hi) < position:
            hi *= 2
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.position(mid) < position else (lo, mid)
        return (lo + hi) / 2

    def sql(self, value: exp.Expression) -> exp.Expression:
        """position(value) in SQL, over the value as a double precision."""
        real = exp.Cast(this=value, to=exp.DataType.build("DOUBLE"))
        scaled = exp.Div(this=real, expression=exp.Literal.number(repr(self.knee)))
        return exp.Add(this=exp.Anonymous(this="asinh", expressions=[scaled]),
                       expression=exp.Mul(this=real.copy(), expression=exp.Literal.number(repr(self.slope))))


@dataclass(frozen=True)
class Aggregate:
    """An aggregate call of the query, finished from its measures after noise."""

    name: str
    kind: str  # count | count_units | a kind chosen from a histogram (`quantiles`) | one finished from sums (`kinds`)
    measures: tuple[str, ...]  # measure names; for a chosen kind, the histogram's name
    arg_range: Range | None  # the argument's range (Y's), for clamping finished averages and variances
    sql: str
    quantile: float | None = None  # for percentiles, MIN (0) and MAX (1): chosen from a histogram
    arg_type: str | None = None  # for mode, quantiles of dates and times, percentile_cont: the type returned
    x_range: Range | None = None  # the bivariate aggregates' second argument (X)
    centred: bool = True  # avg: its sum is centred on the range's midpoint (False: a plain sum, `unit_total`)
    # a kind chosen from a histogram by the exponential mechanism: how a cell is scored. "rank": -distance(q·n,
    # the ranks the cell spans), a number on the histogram's grid; "count": the cell's count (monotone under
    # add-remove), a value of the argument's type
    score: str | None = None

    @property
    def chosen(self) -> bool:
        """Whether the exponential mechanism picks this aggregate's value from a histogram."""
        return self.score is not None


@dataclass(frozen=True)
class TopK:
    """GROUP BY ... ORDER BY <count> DESC LIMIT k: the k keys with the largest counts, picked by the
    exponential mechanism (peeling) on the exact counts of `measure`, or, where that count selects its own
    groups, the released noisy counts ordered and cut (`noise._counts_select_themselves`)."""

    measure: str
    k: int
    sensitivity: float  # the most one unit moves any one key's count
    monotone: bool  # counts under add-remove only grow when a unit is added


@dataclass(frozen=True)
class GroupKey:
    name: str
    expr: exp.Expression  # guarded
    domain: tuple | None  # public values of the key, or None
    sql: str


@dataclass(frozen=True)
class Output:
    name: str
    expr: exp.Expression  # over aggregate and group-key names, evaluated after noise
    type_name: str  # int8 | float8 | text | ...
    noisy: bool = False  # computed from noisy aggregates (False for group keys and constants)


@dataclass
class Plan:
    from_: exp.From
    joins: list[exp.Join]
    where: exp.Expression | None
    unit: exp.Expression | None  # None: each row already is one whole unit (no per-unit stage needed)
    rows_per_unit: int
    group_keys: list[GroupKey]
    max_groups: int  # groups one unit may touch (1 for ungrouped queries)
    cap_groups: bool  # whether the rewrite must enforce max_groups
    domain: list[tuple] | None  # every public key combination, or None: partition selection
    measures: list[Measure]
    histograms: list[Histogram]
    aggregates: list[Aggregate]
    outputs: list[Output]
    having: exp.Expression | None
    order: list[tuple[exp.Expression, bool, bool]]  # (expression, descending, nulls first)
    limit: int | None
    offset: int
    neighbouring: str
    top_k: TopK | None = None
    notes: list[str] = field(default_factory=list)
    every_group: str | None = None  # with private keys: how to write the query so that every group is released
    caveat: str | None = None  # said with every answer: a way the answer leans that its interval does not cover
    unit_row_values: bool = False  # a sum or average reads values computed from its unit's rows (`derived`)
    # row-level privacy with joins: how many joined rows one neighbour changes, over all groups (None: per unit)
    stability: int | None = None
    truncate: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)  # table -> keys, frequencies
    # the rewrite keeps at most rows_per_unit of each unit's joined rows over all groups together (so a unit's
    # values add up to k rows' worth across groups, not in each of G groups)
    rows_total: bool = False
    # each unit's total of each (non-negative) sum over all groups together, at most this (chosen from the data
    # by R2T's race over the units' totals): the rewrite scales a unit's per-group totals down to it
    unit_total: float | None = None
    # windows over the released rows: (the column name outputs and ORDER BY use, the window over aggregate and
    # group-key names), computed once the rows are known
    windows: list[tuple[str, exp.Window]] = field(default_factory=list)
    min_units: int = 1  # the minimum frequency: above 1, every group (declared keys too) goes through selection
    local_key: tuple[int, LocalRandomizer] | None = None  # a group key of local reports, de-biased after noise
    # the values public tables hold of the keys that are their columns, as read before the charge: the plans of the
    # same query at other bounds are analysed with these, never read again once the query is charged
    public_keys: dict[str, tuple] = field(default_factory=dict)

    @cached_property
    def aggregate(self) -> dict[str, Aggregate]:
        """Aggregates by name."""
        return {a.name: a for a in self.aggregates}

    @cached_property
    def noisy_windows(self) -> set[str]:
        """The names of windows computed from noisy aggregates."""
        return noisy_windows(self.windows, set(self.aggregate))

    @cached_property
    def measure(self) -> dict[str, Measure]:
        """Measures by name."""
        return {m.name: m for m in self.measures}

    @cached_property
    def shared_column(self) -> dict[str, str]:
        """For each measure of an expression, the first measure of the same expression (an AVG's count and sum):
        the rewrite computes that expression once a row, in the first one's column."""
        first: dict[str, str] = {}
        return {m.name: first.setdefault(to_sql(m.expr), m.name) for m in self.measures if m.expr is not None}

    @property
    def unit_column(self) -> tuple[str, str] | None:
        """The (table, column) the rewrite groups by to bound each unit, when it is a plain column of a table read
        in FROM or JOIN (not of a subquery)."""
        if not isinstance(self.unit, exp.Column):
            return None
        tables = {t.alias_or_name: t.name for node in [self.from_, *self.joins]
                  for t in node.find_all(exp.Table) if not t.find_ancestor(exp.Subquery)}
        table = tables.get(self.unit.table)
        return None if table is None else (table, self.unit.name)

    @property
    def reads_units_table(self) -> bool:
        """Whether FROM is a per-unit subquery (one row per unit, `analysis.derived`): its rows need no per-unit
        stage, but a bound on its units' totals does (R2T's race over them)."""
        return isinstance(self.from_.this, exp.Subquery)

    @property
    def count_measures(self) -> list[str]:
        """The measures that count rows (COUNT(*))."""
        return [m.name for m in self.measures if m.kind == "count" and m.expr is None]

    @property
    def bounded_sums(self) -> list[Measure]:
        """The sums whose per-row values add up to what a unit's bounded total counts (`unit_total`, or chosen by
        R2T's race over it): a variance's sum of squares alone, else every sum (several only where their values
        share one declared range, `chosen_bounds.bounds_totals`: a pivot's SUM(x) FILTER (WHERE ...) columns).
        Each unit's sums are weighed down together until that total is at most the bound, so each sum's total
        over all groups is at most the bound too (its values are non-negative and part of the total)."""
        sums = [m for m in self.measures if m.kind == "sum"]
        return [m for m in sums if m.squares_of is not None][:1] or sums

    @cached_property
    def histogram(self) -> dict[str, Histogram]:
        """Histograms by name."""
        return {h.name: h for h in self.histograms}

    @property
    def grouped(self) -> bool:
        return bool(self.group_keys)

    @property
    def cells(self) -> int | None:
        """How many cells the answer has, known before the data: 1 without GROUP BY, the declared domain's size,
        or None where the keys are private."""
        return 1 if not self.grouped else len(self.domain) if self.domain is not None else None

    @property
    def partition_selection(self) -> bool:
        return self.grouped and (self.domain is None or self.min_units > 1)

    @property
    def selects_on_rows(self) -> bool:
        """Whether partition selection counts a group's rows rather than its units: under row-level joins (the
        joined rows), and where a unit keeps at most k rows over all groups without a cap on its groups (its rows
        move one group's count by at most k and all groups' by k, as its distinct units would move them by the k
        groups it may reach, and counting rows spares PostgreSQL a COUNT(DISTINCT))."""
        return self.stability is not None or (self.rows_total and not self.cap_groups)

    @property
    def selects_on_weights(self) -> bool:
        """Whether partition selection counts each group's kept rows weighted, each SELECTION_WEIGHT // (its unit's
        kept rows), so that a unit's rows weigh SELECTION_WEIGHT in all however many it keeps (weighted partition
        selection, as in Gopi et al.'s "Differentially Private Set Union"): private keys, at most k rows per unit
        over all groups without a cap on its groups, counts and sums only (`rewrite.per_unit`). Counting rows, the
        threshold paid for k rows of one unit where a unit with a few rows gave each group one; weighted, a unit
        with n rows gives each row 1/n of the threshold's one unit. On 3,000 demo people without a declared
        category domain (benchmarks/results/private_keys.md), 20 answers each released 116, 53 and 25 of the
        160 (answer, category) cells of COUNT, SUM and AVG by category counting the rows of the units within the
        race's τ, and 160 of 160 weighted."""
        return (self.partition_selection and self.rows_total and not self.cap_groups and self.stability is None
                and self.rows_counted_and_summed)

    @property
    def selection_moves(self) -> tuple[int, int | None]:
        """How far one neighbour moves one group's selection count, and all groups' together (None: the groups
        it reaches times the first)."""
        if self.stability is not None:
            return self.stability, self.stability
        if self.selects_on_weights:
            return SELECTION_WEIGHT, SELECTION_WEIGHT
        if self.selects_on_rows:
            return self.rows_per_unit, self.rows_per_unit
        return 1, None

    @property
    def rows_counted_and_summed(self) -> bool:
        """Whether the measures are counts and sums of rows only (at least one; no distinct units or values)."""
        return bool(self.measures) and all(m.kind in ("count", "sum") for m in self.measures)

    @property
    def selection_counts(self) -> str:
        """What partition selection counts in each group, in words."""
        if self.selects_on_weights:
            return "rows (each unit's kept rows weighing one unit in all)"
        return "rows" if self.selects_on_rows else "units"

    def selection_threshold(self, threshold: int) -> str:
        """Partition selection's threshold in the units `selection_counts` names (weights in units, not W)."""
        return f"{threshold / SELECTION_WEIGHT:.4g}" if self.selects_on_weights else str(threshold)

    @property
    def selection_groups(self) -> int:
        """How many groups' selection counts one unit may move: with weights, the groups of its k kept rows."""
        return int(self.rows_per_unit) if self.selects_on_weights else self.max_groups

    @property
    def needs_statistics(self) -> bool:
        """Whether the answer reads the statistics statement (measures to noise, or distinct units for partition
        selection): MIN, MAX, quantiles and mode() alone need only their histograms, one pass over the data."""
        return bool(self.measures) or self.partition_selection or not self.histograms

    @property
    def ordered_bins(self) -> bool:
        """Whether the groups are ordered histogram bins: one key over a run of consecutive integers (a bounded
        integer column or width_bucket), where NoiseFirst and StructureFirst apply."""
        if len(self.group_keys) != 1 or self.domain is None or len(self.domain) < 2:
            return False
        values = [key[0] for key in self.domain]
        return all(isinstance(v, int) and not isinstance(v, bool) for v in values) \
            and values == list(range(values[0], values[0] + len(values)))

    @property
    def races_distinct_values(self) -> bool:
        """Whether R2T's race for this plan's rows per unit reads, at each bound, how many distinct values its one
        COUNT(DISTINCT x) of the kept rows finds (`rewrite.contributions`) rather than how many rows: a column of
        few values is all found at a small bound, while the rows go on growing to the cap."""
        return (self.rows_total and len(self.measures) == 1 and self.measures[0].kind == "distinct"
                and not self.partition_selection and not self.cap_groups and self.unit_total is None)

    @property
    def distinct_pairs(self) -> int | None:
        """The most (group, value) pairs the one COUNT(DISTINCT x) can count, by the public domains of its keys and
        of x (`Measure.values`); None where either is not public."""
        values = next((m.values for m in self.measures if m.kind == "distinct"), None)
        return None if values is None or self.cells is None else values * self.cells

    @property
    def distinct_values_beside_others(self) -> bool:
        """Whether one COUNT(DISTINCT x) of the kept rows shares the race of rows per unit with other measures: asked
        apart from them (`compose`), it would race the values it finds (`races_distinct_values`)."""
        return (self.rows_total and len(self.measures) > 1 and sum(m.kind == "distinct" for m in self.measures) == 1
                and not self.cap_groups and self.unit_total is None and self.stability is None)

    def as_written(self, text: str) -> str:
        """`text` with the plan's names of group keys and aggregates (g0, a0, …) spelled as the query wrote them."""
        written = {k.name: k.sql for k in self.group_keys} | {a.name: a.sql for a in self.aggregates}
        if not written:
            return text
        return re.sub(r"\b(" + "|".join(map(re.escape, written)) + r")\b", lambda m: written[m.group(1)], text)


def noisy_windows(windows: list[tuple[str, exp.Window]], aggregate_names: set[str]) -> set[str]:
    """The names of the windows that read noisy aggregates (a ranking by group keys alone is exact)."""
    return {name for name, window in windows if any(c.name in aggregate_names for c in window.find_all(exp.Column))}
