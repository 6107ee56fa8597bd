"""The SQL that runs on PostgreSQL: exact per-group statistics over bounded data.

`rewrite` is the stage's one public entry. Its query returns, per group, the group keys, one exact sum per
measure and the number of distinct units, with every bound of the plan enforced in the SQL itself:
- every per-row value is clamped to its range (done by the analysis' guarded expressions);
- tables whose join-key frequencies a row-level bound relies on are read truncated to them (`truncation`);
- unless each row already is one whole unit (a unique constraint guarantees it; `direct`), rows are first
  summed per unit and each unit's total is clamped to what k rows could give, which is cheaper and keeps
  more data than sampling k rows (`per_unit`);
- when a unit may touch more groups than allowed, it keeps the groups whose keyed hash ranks lowest
  (a keyed hash of the row's text with a per-installation seed, `fragments.keyed_hash`: never random(), so the
  same data always gives the same bounded table, and independent across units, so no group is dropped for
  everyone).
Percentiles, MIN, MAX and mode() get a second query per histogram: counts per (group, cell), each unit keeping
at most k rows per group and G groups, chosen by the same keyed hash (`histograms`).
A last statement, run only when asked (`SET dpsql.bounds_epsilon`), counts the units the bounds touch (`bounds`).
The SQL is generated from the analysed tree, never from the analyst's text.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsql.analysis import Plan
from dpsql.rewrite import bounds, direct, histograms, per_unit
from dpsql.rewrite.bounds import BoundsStatement
from dpsql.sql.dialect import Statement


@dataclass(frozen=True)
class Rewritten:
    statement: Statement  # rows: group keys, one exact sum per measure, distinct units
    histogram_statements: dict[str, Statement]  # histogram name -> rows: group keys, cell, count
    bounds: BoundsStatement | None = None  # counts of the units the bounds touch (None: no bound drops data)
    work_mem: str | None = None  # PostgreSQL's work_mem for these statements, where the server's would not do

    @property
    def sql(self) -> str:
        """PostgreSQL's text of the statistics' statement."""
        return self.statement.sql

    @property
    def histograms(self) -> dict[str, str]:
        """PostgreSQL's text of each histogram's statement."""
        return {name: statement.sql for name, statement in self.histogram_statements.items()}


def rewrite(plan: Plan, hash_seed: int = 0, in_unit_order: bool = False) -> Rewritten:
    """The bounded, exact aggregation queries for `plan`. `in_unit_order`: PostgreSQL can read the units in the
    order of an index (`per_unit.statistics`)."""
    sql = direct.statistics(plan, hash_seed) if plan.unit is None else \
        per_unit.statistics(plan, hash_seed, in_unit_order)
    return Rewritten(Statement.parse(sql), {h.name: Statement.parse(histograms.counts(plan, h, hash_seed))
                                            for h in plan.histograms}, bounds.effect(plan, hash_seed))


def contributions(plan: Plan, hash_seed: int, caps: tuple[int, ...], totals: bool = False,
                  rows_caps: tuple[int, ...] = (), in_unit_order: bool = False, values: bool = False) -> Statement:
    """The statement R2T's race reads to choose the rows per unit of `plan` (a plan with a per-unit stage), or
    with `totals` the bound on each unit's total of its one sum (and with `rows_caps`, in the same row, the rows
    per unit of the counts beside it), or with `values` the distinct values its one COUNT(DISTINCT x) finds."""
    return Statement.parse(per_unit.contributions(plan, hash_seed, caps, totals, rows_caps, in_unit_order, values))


def answered_by_contributions(plan: Plan, totals: bool = False) -> bool:
    """Whether the race's statement (`contributions`) holds `plan`'s own answer at each of its caps, so that the
    answer needs no statement of its own."""
    return per_unit.answered_by_contributions(plan, totals)


__all__ = ["BoundsStatement", "Rewritten", "Statement", "answered_by_contributions", "contributions",
           "rewrite"]
