"""Rule: MIN, MAX, percentiles and mode() are chosen by the exponential mechanism from histograms.

This is the one home of the kinds chosen from a histogram: a kind is its node in the SQL allowlist
(`dpsql.sql.AGGREGATES`) and, here, its node in NODES and the function that lays its histogram and sets its
Aggregate's `score` ("rank" or "count"), which is all the mechanism, the accuracy and the output type read.

A histogram counts a bounded value per cell of a fixed grid over its declared range (one cell per value for
integer ranges below HISTOGRAM_CELLS), or per value of a declared domain for mode(). The grid depends only
on the schema, so which cells exist reveals nothing. One unit moves at most k counts of each group's
histogram, in at most G groups (the rewrite keeps at most k rows per unit and group), so any candidate's
score over all groups moves by at most k·G (2k·G under "replace"): the rank score -distance(q·n, ranks the
cell spans) for quantiles, MIN (q = 0) and MAX (q = 1), and the count for mode().
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp

from dpsql.analysis.clamps import clamp, clamp_to, number
from dpsql.analysis.expressions import Range
from dpsql.analysis.groups import key_domain, key_type
from dpsql.analysis.plan import Aggregate, GradedGrid, Histogram
from dpsql.analysis.scope import Scope
from dpsql.errors import PrivacyRefusal, UnsupportedQuery
from dpsql.schema import Column
from dpsql.sql import AGGREGATES, to_sql

HISTOGRAM_CELLS = 1000  # an even grid for times (integer ranges below this get one cell per value)
GRADED_CELLS = 2000  # a graded grid for real values (`GradedGrid`)
NODES = (exp.Min, exp.Max, exp.WithinGroup)  # the allowlist's nodes (`dpsql.sql.AGGREGATES`) answered here


def chosen(scope: Scope, name: str, node: exp.Expression, sql: str) -> Aggregate:
    """The aggregate MIN, MAX, percentile_cont/percentile_disc or mode() as a choice from a histogram (created
    once per query and argument, in `scope.histograms`)."""
    if isinstance(node, exp.WithinGroup) and isinstance(node.this, exp.Mode):
        return _mode(scope, name, node, sql)
    return _quantile(scope, name, node, sql)


def _quantile(scope: Scope, name: str, node: exp.Expression, sql: str) -> Aggregate:
    """A cell of a histogram, chosen with the rank score -distance(q·n, ranks the cell spans)."""
    if isinstance(node, exp.WithinGroup):
        fraction = node.this.this
        ordered = node.expression.expressions
        if not (isinstance(fraction, exp.Literal) and not fraction.is_string and 0 <= float(fraction.this) <= 1):
            raise UnsupportedQuery(f"{sql}: the percentile must be a constant between 0 and 1",
                                   "e.g. percentile_cont(0.9) WITHIN GROUP (ORDER BY x)")
        if len(ordered) != 1:
            raise UnsupportedQuery(f"{sql}: WITHIN GROUP takes one ORDER BY expression",
                                   "e.g. percentile_cont(0.5) WITHIN GROUP (ORDER BY x)")
        q, arg = float(fraction.this), ordered[0].this
        if ordered[0].args.get("desc"):
            q = 1 - q
    else:
        q, arg = (0.0 if isinstance(node, exp.Min) else 1.0), node.this
    column = scope.declared_column(arg) if isinstance(arg, exp.Column) else None
    if column is not None and column.is_temporal:
        value, value_range = _temporal(column, arg, node, sql)
    else:
        value_range = scope.exprs.numeric(arg, f"{AGGREGATES[type(node)].upper()} argument")
        value = scope.exprs.guard(arg)
        if not isinstance(arg, exp.Column):
            value = clamp_to(value, value_range.lo, value_range.hi, scope.exprs.kind(arg))
    span = value_range.hi - value_range.lo
    label, over = f"histogram of {to_sql(arg)}", f"[{value_range.lo:g}, {value_range.hi:g}]"
    if value_range.integer and span < HISTOGRAM_CELLS:
        cell = exp.Sub(this=value, expression=number(value_range.lo))
        histogram = _histogram(scope, label, cell, int(span) + 1, value_range.lo, 1.0, True,
                               f"{int(span) + 1} cells over {over}, rank-score")
    elif column is not None and column.is_temporal:
        cell, lower, width = _even_cells(value, value_range.lo, value_range.hi, HISTOGRAM_CELLS)
        histogram = _histogram(scope, label, cell, HISTOGRAM_CELLS, lower, width, False,
                               f"{HISTOGRAM_CELLS} cells over {over}, rank-score")
    else:
        grid = GradedGrid.over(value_range.lo, value_range.hi)
        cell, lower, width = _even_cells(grid.sql(value), grid.position(value_range.lo),
                                         grid.position(value_range.hi), GRADED_CELLS)
        histogram = _histogram(scope, label, cell, GRADED_CELLS, lower, width, False,
                               f"{GRADED_CELLS} cells over {over}, finer near 0 (each about 1% of its values), "
                               "rank-score", graded=grid)
    # PostgreSQL's percentile_cont of numbers is a double precision (it interpolates); the others are a value
    continuous = isinstance(node, exp.WithinGroup) and isinstance(node.this, exp.PercentileCont)
    arg_type = column.type if column is not None and column.is_temporal else "float8" if continuous else None
    return Aggregate(name, "quantile", (histogram.name,), value_range, sql, quantile=q, arg_type=arg_type,
                     score="rank")


def _even_cells(position: exp.Expression, low: float, high: float, cells: int) -> tuple[exp.Expression, float,
                                                                                         float]:
    """The cell, 0 .. cells - 1 (NULL for a NULL), of `position` in [low, high] on an even grid, with the grid's
    start and width. The grid reaches a hair beyond both ends, so that neither the top value (width_bucket's
    overflow bucket) nor a graded position the backend computes an ulp from ours falls outside; no LEAST or
    GREATEST clamps the cell, as they skip NULLs (they put NULL values in the top cell)."""
    margin = (high - low) * 1e-9 or 1e-9
    lower, width = low - margin, (high - low + 2 * margin) / cells
    bucket = exp.WidthBucket(this=position, min_value=number(lower), max_value=number(lower + cells * width),
                             num_buckets=exp.Literal.number(cells))
    return exp.Sub(this=bucket, expression=exp.Literal.number(1)), lower, width


def _temporal(column: Column, arg: exp.Column, node: exp.Expression, sql: str) -> tuple[exp.Expression, Range]:
    """A date column as whole days since 1970-01-01, a timestamp as seconds since then, clamped to its declared
    bounds: the number the histogram's grid is laid over (the chosen cell maps back to a date or time)."""
    if not column.bounded:
        example = "2024-01-01" if column.type == "date" else "2024-01-01T00:00:00"
        raise UnsupportedQuery(f"{sql}: {to_sql(arg)} has no declared bounds",
                               f"declare them in the privacy schema, e.g. {column.name} = {{ type = "
                               f"\"{column.type}\", lower = {example}, upper = ... }}")
    if isinstance(node, exp.WithinGroup) and isinstance(node.this, exp.PercentileCont):
        raise UnsupportedQuery(f"{sql}: PostgreSQL has no percentile_cont of a {column.type}",
                               "use percentile_disc, which returns one of the values")
    clamped = clamp(arg, column)
    if column.type == "date":  # date - date is a whole number of days in PostgreSQL
        epoch = exp.Cast(this=exp.Literal.string("1970-01-01"), to=exp.DataType.build("DATE"))
        return exp.Sub(this=clamped, expression=epoch), Range(column.lower, column.upper, True)
    return exp.Extract(this=exp.Var(this="EPOCH"), expression=clamped), Range(column.lower, column.upper)


def _mode(scope: Scope, name: str, node: exp.WithinGroup, sql: str) -> Aggregate:
    """mode() WITHIN GROUP (ORDER BY c): the value of c's declared domain with the largest count, chosen with
    the count as score."""
    ordered = node.expression.expressions
    if len(ordered) != 1:
        raise UnsupportedQuery(f"{sql}: WITHIN GROUP takes one ORDER BY expression",
                               "e.g. percentile_cont(0.5) WITHIN GROUP (ORDER BY x)")
    arg = ordered[0].this
    scope.exprs.check(arg)
    value_range = scope.exprs.value_range(arg)
    column = scope.declared_column(arg) if isinstance(arg, exp.Column) else None
    label = f"counts of {to_sql(arg)}"
    arg_type = key_type(arg, scope.exprs)
    if column is not None and (column.domain is not None or column.type == "boolean"):
        values = tuple(v for v in key_domain(scope, arg, value_range) if v is not None)
        cell = exp.Case(this=scope.exprs.guard(arg), ifs=[
            exp.If(this=_value_literal(v), true=exp.Literal.number(i)) for i, v in enumerate(values)])
        histogram = _histogram(scope, label, cell, len(values), 0.0, 1.0, True,
                               f"{len(values)} declared values, count-score", values)
    elif (value_range is not None and value_range.integer and value_range.bounded
          and value_range.hi - value_range.lo < HISTOGRAM_CELLS):
        value = scope.exprs.guard(arg)
        if column is None:
            value = clamp_to(value, value_range.lo, value_range.hi, scope.exprs.kind(arg))
        cells = int(value_range.hi - value_range.lo) + 1
        histogram = _histogram(scope, label, exp.Sub(this=value, expression=number(value_range.lo)),
                               cells, value_range.lo, 1.0, True,
                               f"{cells} values in [{value_range.lo:g}, {value_range.hi:g}], count-score")
    else:
        raise PrivacyRefusal(f"{sql}: the mode is chosen among declared values, and "
                             f"{to_sql(arg)} has no declared domain or small integer range",
                             "declare domain = [...] for the column in the privacy schema, or use "
                             "GROUP BY c ORDER BY COUNT(*) DESC LIMIT 1 (keys by partition selection)")
    return Aggregate(name, "mode", (histogram.name,), None, sql, arg_type=arg_type, score="count")


def _histogram(scope: Scope, label: str, cell: exp.Expression, cells: int, lower: float, width: float,
               integer: bool, note: str, values: tuple | None = None, graded: GradedGrid | None = None) -> Histogram:
    """The histogram named `label`, created once per query: one unit moves at most k counts in each of at
    most G groups, so any candidate's score over all groups moves by at most k·G (k in all where the rewrite
    keeps k rows per unit over all groups). Where `histogram_rows` is below k, it is the histogram's k: its
    rewrite keeps that many rows per unit and group, and over all groups where that is how the rows are kept."""
    if label not in scope.histograms:
        k, groups = scope.rows_per_unit, scope.max_groups
        if scope.histogram_rows is not None and scope.stability is None:
            k = min(k, scope.histogram_rows)
        sensitivity = k * scope.spread(groups) * scope.steps
        scope.histograms[label] = Histogram(f"h{len(scope.histograms)}", label, cell, cells, lower, width,
                                            integer, k, groups, sensitivity, values, graded)
        scope.notes.append(f"{label}: {note} sensitivity {sensitivity:g} (at most {k} row(s) per unit and group)")
    return scope.histograms[label]


def _value_literal(value: Any) -> exp.Expression:
    """A domain value as a SQL literal."""
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        return number(value)
    return exp.Literal.string(str(value))
