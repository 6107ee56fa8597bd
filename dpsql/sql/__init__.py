"""Parse one query, bind its parameters, give each construct one spelling, refuse what dpsql does not answer, and
qualify it against the schema.

`check_query` is the stage's one public entry; its rules are the two tuples SPELLINGS and CHECKS, read in order.
What it returns is a single plain SELECT whose every column is qualified with its table and whose simple
subqueries and CTEs are merged into it (sqlglot's optimizer does both), so the analysis sees one flat query.
Anything not on the allowlist is refused here, before anything runs on PostgreSQL.
"""

from __future__ import annotations

import datetime
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from dpsql.errors import Error, UnsupportedQuery
from dpsql.schema import PrivacySchema
from dpsql.sql.bind import bind_parameters
from dpsql.sql.calendars import key_lists_as_in
from dpsql.sql.canonical import canonical_sql
from dpsql.sql.cohorts import correlated_cohorts_as_in, correlated_values_as_joins, filtered_cohorts_as_having
from dpsql.sql.parse import parse_select
from dpsql.sql.patterns import patterns_as_regex
from dpsql.sql.qualify import qualify_columns
from dpsql.sql.query import (
    AGGREGATES,
    DIALECT,
    CheckedQuery,
    in_analyst_terms,
    in_analyst_words,
    limit_clause,
    operands,
    output_name,
    to_sql,
)
from dpsql.sql.refuse import refuse_failing_constants, refuse_unsafe
from dpsql.sql.shape import (
    any_as_in,
    approx_distinct_as_count,
    cohort_joins_as_in,
    concat_as_pipes,
    constant_subqueries_inlined,
    count_of_a_tables_rows,
    count_of_distinct_rows,
    date_function_as_cast,
    derived_select,
    distinct_as_group_by,
    drop_nulls_under_not_in,
    empty_grouping_dropped,
    extremes_of_truncations,
    fetch_as_limit,
    filters_as_case,
    format_as_concat,
    having_of_source_as_where,
    inline_ctes,
    joined_derived_selects,
    left_as_substring,
    logs_as_ln,
    named_windows_inlined,
    order_of_aggregated_sources_dropped,
    percentiles_as_arrays,
    projection_over_aggregates,
    regressions_as_moments,
    require_flat,
    semijoin_selects,
    shadowing_names_renamed,
    totals_as_windows,
    trunc_as_floor_or_ceil,
    windowed_sources,
)
from dpsql.sql.subquery_outputs import aggregate_expressions_outside
from dpsql.sql.times import CLOCKS, fold_times
from dpsql.sql.unit_key_groups import unit_key_groups_merged
from dpsql.sql.unit_rows import unit_row_joined_inside
from dpsql.sql.unit_sets import unit_sets_as_groups
from dpsql.sql.unit_windows import (
    distinct_on_as_row_numbers,
    first_of_ordered_arrays,
    lateral_rows_as_row_numbers,
    unit_windows_as_joins,
    unit_windows_as_sources,
)

Rule = Callable[[exp.Select, "Context"], exp.Select]
REPEATABLE = re.compile(r" REPEATABLE \(\d+\)")  # a sample's seed in canonical text (`with_sample_seeds`)


@dataclass(frozen=True)
class Context:
    schema: PrivacySchema
    now: datetime.datetime | None  # the clock, read once where the query reads it


def _tree_only(rule: Callable[[exp.Select], exp.Select | None]) -> Rule:
    """A rule of the tree alone; one that returns nothing (a refusal, a fix in place) leaves the tree as it is."""
    def apply(tree: exp.Select, context: Context) -> exp.Select:
        result = rule(tree)
        return tree if result is None else result
    apply.__name__ = rule.__name__
    return apply


# The check stage, in order (after parsing and binding). First one spelling per construct: the refusal allowlist
# is written for these forms, so each shape runs before it rather than the allowlist knowing every spelling a
# shape removes (ANY, FILTER, a list of keys joined from VALUES or generate_series, concat(), date(x), ~* and
# SIMILAR TO, approx_count_distinct(), COUNT(t.*), a WITH query read twice or in a chain, sets of units combined
# by INTERSECT, EXCEPT or UNION, a correlated or joined cohort, a count of a subquery's distinct rows, an output
# computed from a subquery's aggregates, a projection over a grouped subquery, percentile arrays, DISTINCT); each
# shape only rewrites into constructs the allowlist and the analysis then judge, never past them.
SPELLINGS: tuple[Rule, ...] = (
    _tree_only(named_windows_inlined),
    _tree_only(fetch_as_limit),
    _tree_only(empty_grouping_dropped),
    _tree_only(order_of_aggregated_sources_dropped),
    _tree_only(constant_subqueries_inlined),
    _tree_only(any_as_in),
    lambda tree, context: fold_times(tree, context.now, context.schema),
    _tree_only(key_lists_as_in),
    _tree_only(filters_as_case),
    _tree_only(format_as_concat),
    _tree_only(concat_as_pipes),
    _tree_only(left_as_substring),
    _tree_only(logs_as_ln),
    _tree_only(trunc_as_floor_or_ceil),
    _tree_only(date_function_as_cast),
    _tree_only(extremes_of_truncations),
    _tree_only(patterns_as_regex),
    _tree_only(approx_distinct_as_count),
    _tree_only(count_of_a_tables_rows),
    _tree_only(regressions_as_moments),
    _tree_only(totals_as_windows),
    _tree_only(inline_ctes),
    lambda tree, context: unit_sets_as_groups(tree, context.schema),
    lambda tree, context: lateral_rows_as_row_numbers(tree, context.schema),
    lambda tree, context: distinct_on_as_row_numbers(tree, context.schema),
    lambda tree, context: first_of_ordered_arrays(tree, context.schema),
    lambda tree, context: unit_windows_as_joins(tree, context.schema),
    lambda tree, context: unit_windows_as_sources(tree, context.schema),
    _tree_only(shadowing_names_renamed),
    _tree_only(correlated_cohorts_as_in),
    _tree_only(correlated_values_as_joins),
    _tree_only(filtered_cohorts_as_having),
    _tree_only(cohort_joins_as_in),
    _tree_only(count_of_distinct_rows),
    _tree_only(aggregate_expressions_outside),
    lambda tree, context: projection_over_aggregates(tree, context.schema),
    _tree_only(having_of_source_as_where),
    _tree_only(percentiles_as_arrays),
    _tree_only(distinct_as_group_by),
)
# Then the rules that refuse: the allowlist, names resolved against the schema (declared tables only, simple
# subqueries merged, a table of one row per unit joined to a per-unit subquery moved into it), nothing left but
# semijoins, and NOT IN made safe where NULLs meet it.
CHECKS: tuple[Rule, ...] = (
    _tree_only(refuse_unsafe),
    lambda tree, context: qualify_columns(tree, context.schema),
    lambda tree, context: unit_row_joined_inside(tree, context.schema),
    lambda tree, context: unit_key_groups_merged(tree, context.schema),
    _tree_only(require_flat),
    _tree_only(drop_nulls_under_not_in),
)


def check_query(sql: str, schema: PrivacySchema,
                params: Sequence[Any] | Mapping[str, Any] | None = None) -> CheckedQuery:
    """Parse `sql`, bind `params`, then SPELLINGS and CHECKS in order."""
    written = parse_select(sql)
    refuse_failing_constants(written)
    tree = bind_parameters(written, params)
    sampled = with_sample_seeds(tree)  # first: a WITH query read twice is then one sample, as PostgreSQL reads it
    timed = tree.find(*CLOCKS) is not None
    context = Context(schema, datetime.datetime.now(datetime.UTC) if timed else None)
    names = tuple(output_name(e) for e in tree.expressions)  # as the analyst wrote them, before any spelling
    for rule in SPELLINGS:
        tree = rule(tree, context)
    if len(names) != len(tree.expressions):  # a * over a subquery, its outputs inlined
        names = tuple(output_name(e) for e in tree.expressions)
    for rule in CHECKS:
        try:
            tree = rule(tree, context)
        except Error as error:  # named as the analyst wrote it, not as a spelling above renamed it
            in_analyst_terms(error, tree)
            raise
    if len(names) != len(tree.expressions):  # a * expanded to the table's columns, named as they are
        names = tuple(output_name(e) for e in tree.expressions)
    return CheckedQuery(tree, names, canonical_sql(tree), timed or sampled)


def with_sample_seeds(tree: exp.Select) -> bool:
    """Give every TABLESAMPLE a secret seed drawn now (changed in place); whether there was one. One statement may
    read a table more than once (a CTE read twice, a unit's weights beside its rows), and each read must meet the
    same rows, or a unit could reach more rows than its bound counts; PostgreSQL draws a new sample for every read
    without a seed, the same sample for every read with one.

    The seed must stay secret, and so REPEATABLE is refused: PostgreSQL's coin for a row is a hash of the seed and
    where the row is stored, and where the other rows are stored may depend on one person's rows (a table
    rewritten by VACUUM FULL or a restore packs them around). Over a secret seed, every row's coin is a fair one
    of its own wherever it is stored, so the other rows' sample has the same law with or without that person;
    with a known seed it would not. The seed is part of the query's canonical text (a new sample is a new query,
    answered afresh, as PostgreSQL draws a new sample), and `shown_sql` hides it from what the ledger records."""
    samples = list(tree.find_all(exp.TableSample))
    for sample in samples:
        if sample.args.get("seed") is not None:
            raise UnsupportedQuery("TABLESAMPLE ... REPEATABLE is not supported by dpsql: a known seed fixes the "
                                   "rows sampled by where rows are stored, which can depend on one person's rows",
                                   "leave the seed to dpsql, which draws a secret one per query: SELECT COUNT(*) "
                                   "FROM visits TABLESAMPLE BERNOULLI (10)")
        sample.set("seed", exp.Literal.number(secrets.randbelow(2**31)))
    return bool(samples)


def shown_sql(canonical: str) -> str:
    """A query's canonical text as the ledger records it: without the secret seeds of its samples."""
    return REPEATABLE.sub("", canonical)


__all__ = ["AGGREGATES", "DIALECT", "CheckedQuery", "check_query", "derived_select", "in_analyst_terms",
           "in_analyst_words", "joined_derived_selects", "limit_clause", "operands", "semijoin_selects", "shown_sql",
           "to_sql", "windowed_sources"]
