"""Accuracy of released answers against the exact ones: relative error, bias and the 95% intervals' coverage of
the truth over many fresh answers (issue 36). `tests/test_accuracy.py` asserts a fast set in CI;
`benchmarks/bench_accuracy.py` runs the long one and writes its table.

Each answer comes from a new analyst, so no cache answers twice. A cell is one released key of one answer; its
error is (released − exact) / exact. Bias is the mean error over every cell of every answer, with its standard
error, so a test can ask whether the bias is demonstrably beyond a bound rather than whether one noisy mean
happened to cross it.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field

import psycopg

from dpsql.engine import Engine
from dpsql.session import Options
from dpsql.sql.parse import parse_select

# The questions a new user asks first, on the demo data
QUESTIONS = {
    "visits by quarter": "SELECT date_trunc('quarter', day), COUNT(*) FROM visits GROUP BY 1",
    "visits by month": "SELECT date_trunc('month', day), COUNT(*) FROM visits GROUP BY 1",
    "visits by category": "SELECT category, COUNT(*) FROM visits GROUP BY category",
    "SUM(amount) by quarter": "SELECT date_trunc('quarter', day), SUM(amount) FROM visits GROUP BY 1",
    "AVG(amount)": "SELECT AVG(amount) FROM visits",
    "AVG(amount) by category": "SELECT category, AVG(amount) FROM visits GROUP BY category",
    "SUM(amount)": "SELECT SUM(amount) FROM visits",
    "lab and dental": "SELECT category, COUNT(*) FROM visits WHERE category IN ('lab', 'dental') GROUP BY category",
    "people by state": "SELECT state, COUNT(*) FROM people GROUP BY state",
    "spend per person": "SELECT AVG(spent) FROM (SELECT person_id, SUM(amount) AS spent FROM visits "
                        "GROUP BY person_id) t",
    "visits per drug": "SELECT drug, COUNT(DISTINCT visit_id) FROM prescriptions GROUP BY drug",
    "AVG(income) by sex": "SELECT sex, AVG(income) FROM people GROUP BY sex",  # the demo's first question
    "stddev(amount)": "SELECT stddev(amount) FROM visits",
    "stddev(amount) by category": "SELECT category, stddev(amount) FROM visits GROUP BY category",
    # a count of distinct values beside another aggregate: asked apart, it races the values it finds (the days),
    # not the rows COUNT(*) needs
    "days beside visits, by category": "SELECT category, COUNT(*), COUNT(DISTINCT day) FROM visits GROUP BY 1",
}
SMALL = 500  # cells with fewer exact rows are left out of the worst cell (their noise dominates)
_analysts = itertools.count()


@dataclass
class Accuracy:
    errors: list[float] = field(default_factory=list)  # signed relative errors, one per released cell
    covered: list[bool] = field(default_factory=list)  # whether each cell's 95% interval held the exact answer
    worst: float = 0.0  # the largest |error| of one answer over cells of SMALL or more
    keys: set = field(default_factory=set)  # every key released
    by_cell: dict[tuple, list[float]] = field(default_factory=dict)  # the errors of each cell of SMALL or more

    @property
    def worst_median(self) -> float:
        """The issue's measure: per cell, the median of its answers' errors; the largest |median| over cells of
        SMALL or more (bias per cell, seen through the noise)."""
        return max((abs(statistics.median(e)) for e in self.by_cell.values()), default=0.0)

    @property
    def median_error(self) -> float:
        return statistics.median(abs(e) for e in self.errors)

    @property
    def bias(self) -> float:
        return statistics.fmean(self.errors)

    @property
    def bias_error(self) -> float:
        """The standard error of `bias` (cells of one answer share a race, so this is a little optimistic)."""
        return statistics.stdev(self.errors) / math.sqrt(len(self.errors))

    @property
    def coverage(self) -> float | None:
        return sum(self.covered) / len(self.covered) if self.covered else None


def exact(url: str, sql: str) -> dict[tuple, float]:
    """The exact answer on PostgreSQL (its last column), by key."""
    keys = _keys(sql)
    with psycopg.connect(url) as conn:
        return {tuple(r[:keys]): float(r[-1]) for r in conn.execute(sql).fetchall()}


def _keys(sql: str) -> int:
    """How many group keys lead the statement's columns: its GROUP BY's."""
    group = parse_select(sql).args.get("group")
    return len(group.expressions) if group is not None else 0


def measure(engine: Engine, sql: str, truth: dict[tuple, float], runs: int, epsilon: float = 1.0,
            options: Options | None = None) -> Accuracy:
    """`runs` fresh answers to `sql` (whose last column is the noisy one) against `truth`."""
    found, keys = Accuracy(), _keys(sql)
    averaged = "AVG(" in sql.upper()  # an average's cells are as large as their rows: the demo's hold thousands
    for _ in range(runs):
        analyst = f"accuracy_{next(_analysts)}"
        engine.ledger.add_analyst(analyst, 100.0, 1e-3)
        answer = engine.query(sql, analyst=analyst, epsilon=epsilon, options=options or Options())
        for row, accuracy in zip(answer.rows, answer.accuracy, strict=True):
            key, value, interval = row[:keys], row[-1], accuracy[-1]
            found.keys.add(key)
            true = truth.get(key)
            if not true:
                continue
            error = (float(value) - true) / abs(true)
            found.errors.append(error)
            if interval is not None and interval.ci_low is not None:
                found.covered.append(interval.ci_low <= true <= interval.ci_high)
            if abs(true) >= SMALL or len(truth) == 1 or averaged:
                found.worst = max(found.worst, abs(error))
                found.by_cell.setdefault(key, []).append(error)
    return found
