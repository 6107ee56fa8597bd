"""The vocabulary of the checked query: the dialect, the aggregates dpsql knows, and `CheckedQuery`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sqlglot import exp

DIALECT = "postgres"

AGGREGATES: dict[type[exp.Expression], str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Variance: "var_samp", exp.VariancePop: "var_pop",
    exp.Stddev: "stddev", exp.StddevSamp: "stddev_samp", exp.StddevPop: "stddev_pop",
    exp.Min: "min", exp.Max: "max", exp.WithinGroup: "percentile",
}


@dataclass(frozen=True)
class CheckedQuery:
    """A single plain SELECT, parameters bound, columns qualified, simple subqueries merged."""

    tree: exp.Select
    output_names: tuple[str, ...]  # the column names PostgreSQL would give the result

    @functools.cached_property
    def canonical(self) -> str:
        """Normalised SQL of the checked tree: the answer cache's key (with ε and the analyst). Computed once:
        the engine keeps checked queries in its plan cache and asks again for every answer."""
        return self.tree.sql(dialect=DIALECT, normalize=True, comments=False)


def output_name(node: exp.Expression) -> str:
    """The column name PostgreSQL gives a select item."""
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Cast):
        return output_name(node.this)
    if isinstance(node, exp.Paren):
        return output_name(node.this)
    if isinstance(node, exp.WithinGroup):
        return output_name(node.this)
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return "?column?"
