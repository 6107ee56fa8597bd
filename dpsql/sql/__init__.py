"""Parse one query, bind its parameters, refuse what dpsql does not answer, and qualify it against the schema.

`check_query` is the stage's one public entry. What it returns is a single plain SELECT whose every column
is qualified with its table and whose simple subqueries and CTEs are merged into it (sqlglot's optimizer
does both), so the analysis sees one flat query. Anything not on the allowlist is refused here, before
anything runs on PostgreSQL.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from dpsql.schema import PrivacySchema
from dpsql.sql.bind import bind_parameters
from dpsql.sql.canonical import canonical_sql
from dpsql.sql.parse import parse_select
from dpsql.sql.qualify import qualify_columns
from dpsql.sql.query import AGGREGATES, BIVARIATE, DIALECT, CheckedQuery, operands, output_name, to_sql
from dpsql.sql.refuse import refuse_unsafe
from dpsql.sql.shape import (
    any_as_in,
    derived_select,
    distinct_as_group_by,
    drop_nulls_under_not_in,
    filters_as_case,
    inline_repeated_ctes,
    percentiles_as_arrays,
    projection_over_aggregates,
    require_flat,
    semijoin_selects,
)
from dpsql.sql.times import CLOCKS, fold_times


def check_query(sql: str, schema: PrivacySchema,
                params: Sequence[Any] | Mapping[str, Any] | None = None) -> CheckedQuery:
    """Parse `sql`, bind `params`, refuse unsupported or unsafe constructs, and qualify against `schema`."""
    tree = any_as_in(bind_parameters(parse_select(sql), params))
    timed = tree.find(*CLOCKS) is not None
    tree = filters_as_case(fold_times(tree, datetime.datetime.now(datetime.UTC) if timed else None, schema))
    tree = percentiles_as_arrays(projection_over_aggregates(inline_repeated_ctes(tree)))
    names = tuple(output_name(e) for e in tree.expressions)
    refuse_unsafe(distinct_as_group_by(tree))
    tree = qualify_columns(tree, schema)
    require_flat(tree)
    drop_nulls_under_not_in(tree)
    return CheckedQuery(tree, names, canonical_sql(tree), timed)


__all__ = ["AGGREGATES", "BIVARIATE", "DIALECT", "CheckedQuery", "check_query", "derived_select", "operands",
           "semijoin_selects", "to_sql"]
