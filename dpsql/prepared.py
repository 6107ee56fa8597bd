"""A query prepared: everything known about it before it runs or is charged (what `dpsql explain` shows)."""

from __future__ import annotations

from dataclasses import dataclass

from dpsql.accounting import NO_COST, Cost
from dpsql.analysis import Plan
from dpsql.analysis.plan import Output
from dpsql.local.estimates import LocalQuery
from dpsql.mechanisms.race import RaceToTheTop
from dpsql.noise import Calibration
from dpsql.releases.published import PublishedQuery
from dpsql.rewrite import Rewritten, Statement
from dpsql.session import Options
from dpsql.sql import CheckedQuery


@dataclass
class Prepared:
    """Everything known about a query before it runs: what `dpsql explain` shows."""

    query: CheckedQuery
    plan: Plan | None  # None for a query answered from locally randomized reports alone
    rewritten: Rewritten | None
    calibration: Calibration | None
    key: str  # the answer cache's key
    options: Options  # epsilon, mechanism and histogram, resolved
    group_size: int = 1  # the schema's: explain states the guarantee for groups of this many units
    # data already private: estimates from locally randomized reports, or released tables (no central noise)
    already_private: LocalQuery | PublishedQuery | None = None
    race: RaceToTheTop | None = None  # rows per unit chosen from the data (R2T) before the answer, at its own ε
    race_statement: Statement | None = None  # what the race reads: the truncated row counts for each of its caps
    race_totals: bool = False  # the race chooses the bound on each unit's total of the query's sum, not its rows
    race_answers: bool = False  # the race's values are the answer's exact value at each bound it may choose
    rows_race: RaceToTheTop | None = None  # beside a totals race: the rows per unit of the counts beside the sum
    bound_note: str | None = None  # how many units hold more than the bound the race chose (`bounded_by_race`)

    @property
    def race_sql(self) -> str | None:
        """PostgreSQL's text of what the race reads."""
        return self.race_statement.sql if self.race_statement is not None else None

    @property
    def cost(self) -> Cost:
        """What answering costs: the answer's mechanisms and, with rows per unit chosen from the data, the race."""
        cost = self.calibration.cost if self.calibration is not None else NO_COST
        for race in (self.race, self.rows_race):
            cost = cost + Cost.pure(race.epsilon) if race is not None else cost
        return cost

    @property
    def outputs(self) -> list[Output]:
        """The answer's columns (name, type, whether noisy) before it runs."""
        return self.already_private.outputs if self.already_private is not None else self.plan.outputs

    @property
    def free(self) -> bool:
        """Whether answering costs nothing: local estimates, released data, or a declared domain with no data
        read."""
        return self.already_private is not None or not self.plan.aggregates
