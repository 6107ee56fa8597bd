"""Sensitivity analysis: from a checked query to a plan of noisy statistics with their sensitivities.

`analyze` is the stage's one public entry. It works out:
- the privacy unit of every row of the joined relation, and how many rows one unit can have there (k);
- the group keys, whether their values are public (a declared domain) or need DP partition selection, and
  how many groups one unit may touch (G, enforced by the rewrite);
- each aggregate as sums of bounded per-row expressions ("measures") plus a finishing formula: COUNT is a
  sum of 1s, AVG a centred sum over a count, variances add a sum of squares;
- each measure's L1 sensitivity: G groups, each moved by at most k rows' worth of its per-row range;
- for percentiles, MIN and MAX, a histogram over a fixed grid of the declared range, from which the
  exponential mechanism picks a cell (rank scores move by at most k per group, in at most G groups); for
  mode() the same over the declared domain of the column, scored by count;
- for `GROUP BY key ORDER BY COUNT(...) DESC LIMIT k`, a top-k selection: the keys are chosen by the
  exponential mechanism on their exact counts (each moves by at most one unit's per-group count), and only
  the chosen groups' measures are noised.
Nothing here reads the data: every number comes from the declared schema and from catalog constraints, and every
released key from them or from a public table's values (which the engine reads, `sql.public_keys`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dpsql.analysis import aggregates, derived, groups, local_columns, outputs, relations, top_k, units
from dpsql.analysis.kinds import SQUARED
from dpsql.analysis.plan import COUNTS, Aggregate, GroupKey, Histogram, Measure, Output, Plan, TopK
from dpsql.analysis.scope import Scope
from dpsql.schema import PrivacySchema
from dpsql.sql import CheckedQuery

# The passes, in order. Each reads what the ones before it found in the scope and adds its own part; each
# module's docstring states the rule it enforces and why it is sound.
PASSES: tuple[Callable[[Scope], None], ...] = (
    derived.bound_subquery,  # FROM: tables, or a grouped subquery as a bounded per-unit table
    relations.read,          # the tables, their join conditions and WHERE subqueries
    units.bound_rows,        # the unit of each joined row, and k (or the row-level join stability)
    groups.bound_groups,     # group keys, their public domain, and G (the groups one unit touches)
    aggregates.measure,      # aggregates as measures with sensitivities, or choices from histograms
    outputs.post_process,    # SELECT, HAVING, ORDER BY, LIMIT over released values
    top_k.select,            # ORDER BY count DESC LIMIT k: top-k selection
    local_columns.only_counted,  # locally randomized columns: only grouped on and counted (de-biased later)
)


def analyze(query: CheckedQuery, schema: PrivacySchema, unique_columns: frozenset[tuple[str, str]],
            max_groups: int | None = None, min_frequency: int = 1,
            not_null: frozenset[tuple[str, str]] = frozenset(), rows_cap: int | None = None,
            time_zone: str | None = None, total_cap: float | None = None,
            unique_sets: frozenset[tuple[str, frozenset[str]]] = frozenset(),
            public_keys: Mapping[str, tuple] | None = None, histogram_rows: int | None = None) -> Plan:
    """The plan of noisy statistics for `query`. `unique_columns` are (table, column) pairs that a primary
    key or unique constraint guarantees; `max_groups` overrides the schema's groups-per-unit bound;
    `min_frequency` > 1 releases only groups of at least that many units (DP partition selection, also for
    declared keys); `not_null` are (table, column) pairs the catalog declares NOT NULL (COUNT of one is COUNT(*));
    `rows_cap` bounds a unit's rows below the declared bound (chosen for this query by R2T's race);
    `time_zone` is the backend session's, in which date_trunc's periods are public keys (None: they are not);
    `total_cap` bounds each unit's total of every SUM over all groups together (chosen by R2T's race over the
    units' totals; only for queries whose aggregates are all SUMs of non-negative values); `unique_sets` are
    (table, columns) keys of several columns that a primary key or unique constraint guarantees; `public_keys`
    are the values a public table holds of a key that is its column, by the key's SQL (`sql.public_keys`);
    `histogram_rows` bounds the rows per unit and group that histograms keep below the measures' (percentiles
    beside counts or sums, `chosen_bounds.chosen_histogram_rows`)."""
    scope = Scope(query, schema, unique_columns, max_groups or schema.max_groups_per_unit)
    scope.min_units, scope.not_null, scope.rows_cap = max(min_frequency, 1), not_null, rows_cap
    scope.time_zone, scope.total_cap, scope.unique_sets = time_zone, total_cap, unique_sets
    scope.public_keys, scope.histogram_rows = public_keys or {}, histogram_rows
    for step in PASSES:
        step(scope)
    return _plan(scope)


def _plan(scope: Scope) -> Plan:
    """The finished scope as a plan, with FROM, JOIN and WHERE guarded (a subquery in FROM comes bounded)."""
    tree = scope.tree
    return Plan(
        from_=scope.from_ if scope.from_ is not None else scope.guarded(
            relations.bounded_source(tree.args["from_"], scope.read_as)),
        joins=[scope.guarded(j) for j in scope.joins],
        where=scope.exprs.guard(tree.args["where"].this) if tree.args.get("where") else None,
        unit=scope.unit, rows_per_unit=scope.rows_per_unit, group_keys=scope.group_keys,
        max_groups=scope.max_groups, cap_groups=scope.cap_groups, domain=scope.domain,
        measures=list(scope.measures.values()), histograms=list(scope.histograms.values()),
        aggregates=scope.aggregates, outputs=scope.outputs, having=scope.having, order=scope.order,
        limit=scope.limit, offset=scope.offset, neighbouring=scope.schema.neighbouring, top_k=scope.top_k,
        notes=scope.notes, every_group=scope.every_group, caveat=derived.repeated_unit_values(scope),
        unit_row_values=derived.values_of_unit_rows(scope),
        stability=scope.stability, truncate=scope.truncate,
        rows_total=scope.rows_total, unit_total=scope.total_cap,
        windows=scope.windows, min_units=scope.min_units, local_key=scope.local_key,
        public_keys=dict(scope.public_keys))


__all__ = ["COUNTS", "PASSES", "SQUARED", "Aggregate", "GroupKey", "Histogram", "Measure", "Output", "Plan", "TopK",
           "analyze"]
