"""Pass: each aggregate as sums of bounded per-row expressions ("measures") with their sensitivities.

Rules:
- COUNT is a sum of 1s (COUNT(*)) or of 0/1 (COUNT(expr)); COUNT(DISTINCT unit) counts units, 1 per unit;
  COUNT(DISTINCT expr) counts the distinct values of the rows: on directly aggregated rows (row-level privacy,
  or unit-level rows that are each a whole unit) a changed row adds or removes at most one distinct value of
  its group; through a per-unit stage the rewrite keeps k rows per unit over all groups (`rows_total`, never a
  cap per group) and counts the distinct values of the kept rows, which one unit moves by at most k in all.
  (Of a column the catalog guarantees unique on the query's one table, it is COUNT(expr).)
- SUM(expr) sums a value that the rewrite clamps to its declared range [lo, hi]; the other kinds finished from
  sums (AVG, the variances, covariances, correlation, regression) ask for theirs in `kinds`, their one home;
- one unit's total of a measure in one group lies in [k·min(lo, 0), k·max(hi, 0)] (the rewrite clamps it
  there), so its L1 sensitivity is G times the larger magnitude (times 2 under "replace"), and its L2
  sensitivity √G times it; under row-level joins k already counts all groups (`Scope.spread`);
- a measure whose every row contributes the same constant has sensitivity 0 and is refused: no mechanism is
  calibrated to it, and its value needs no data.
- an aggregate finished from several measures (AVG, the variances, the bivariate ones) needs them over the same
  rows: a unit's k kept rows (`rows_total`), not each total clamped on its own. A heavy unit's count clamped to
  k beside its centred sum clamped to ±k·half described no set of rows: AVG(amount) on the demo data came out
  15% low. Keeping k rows changes no sensitivity where a unit is in one group.
- where each unit's total of a sum is bounded over all groups (`total_cap`, chosen from the data by R2T's race),
  the sum's sensitivity is that bound, however many groups the unit reaches (the rewrite scales its per-group
  totals down together); AVG is then that plain sum over its count (`kinds`).
MIN, MAX, percentiles and mode() are chosen from histograms (`quantiles`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from sqlglot import exp

from dpsql.analysis import quantiles
from dpsql.analysis.clamps import clamp_to
from dpsql.analysis.expressions import Expressions, Range
from dpsql.analysis.groups import key_domain
from dpsql.analysis.kinds import KINDS, SQUARED, Bounded, Context
from dpsql.analysis.plan import Aggregate, Measure
from dpsql.analysis.scope import Scope
from dpsql.errors import InvalidQuery, PrivacyRefusal, UnsupportedQuery
from dpsql.sql import AGGREGATES, to_sql

ONE, BIT = Range(1, 1, True), Range(0, 1, True)  # per-row ranges of COUNT(*) and COUNT(expr)


def measure(scope: Scope) -> None:
    """Set the scope's aggregates (in the order they first appear in SELECT, HAVING and ORDER BY), with the
    measures and histograms that answer them."""
    found: dict[str, Aggregate] = {}
    nodes = [*scope.tree.expressions]
    if scope.tree.args.get("having"):
        nodes.append(scope.tree.args["having"])
    if scope.tree.args.get("order"):
        nodes.append(scope.tree.args["order"])
    scope.total_of_squares = scope.total_cap is not None and any(
        AGGREGATES[type(node)] in SQUARED for top in nodes for node in top.find_all(*AGGREGATES)
        if not is_window_function(node))
    for top in nodes:
        for node in top.find_all(*AGGREGATES):
            sql = to_sql(node)
            if sql in found or is_window_function(node):  # a window's SUM runs over released rows
                continue
            if any(isinstance(n, tuple(AGGREGATES)) for n in node.walk() if n is not node):
                raise InvalidQuery("aggregate function calls cannot be nested",  # PostgreSQL's own, whatever the data
                                   "aggregate per unit in a subquery, then outside it: SELECT AVG(n) FROM (SELECT "
                                   "<the unit's column>, COUNT(*) AS n FROM t GROUP BY 1) s", sqlstate="42803")
            name = f"a{len(found)}"
            if isinstance(node, quantiles.NODES):
                found[sql] = quantiles.chosen(scope, name, node, sql)
            else:
                found[sql] = _aggregate(scope, name, node, sql)
    if not found and _lists_a_domain(scope):
        scope.notes.append("no aggregate: the rows are the declared domain of the keys, whatever the data holds")
    elif not found and scope.group_keys:
        scope.notes.append("no aggregate: the keys present are released where a noisy count of their units passes "
                           "the threshold (partition selection), as for any key without a declared domain")
    elif not found:
        raise PrivacyRefusal("the query has no aggregate, so it would release raw rows",
                             "dpsql answers aggregates: COUNT, SUM, AVG, VARIANCE, STDDEV, e.g. "
                             + scope.schema.example_query())
    scope.aggregates = list(found.values())
    ratios = [a for a in scope.aggregates if len(a.measures) > 1 and not a.chosen]
    if ratios and scope.unit is not None and scope.rows_per_unit > 1 and scope.max_groups == 1 \
            and scope.stability is None and not scope.rows_total:
        scope.rows_total = True
        scope.notes.append(f"{ratios[0].sql}: its count and sums are taken over the same {scope.rows_per_unit} "
                           "row(s) a unit keeps (enforced by the rewrite)")


def _lists_a_domain(scope: Scope) -> bool:
    """`SELECT DISTINCT c FROM t` (or `GROUP BY c` without aggregates) where every key has a declared domain,
    as BI tools send to fill a filter's list: answered with the domain itself, which no data can change. Under
    WHERE or a join the keys are private (`groups`), and under a minimum frequency only the values that enough
    units hold are released: both by partition selection."""
    return scope.domain is not None and bool(scope.group_keys) and scope.min_units == 1


NULL_PRESERVING = (exp.Column, exp.Identifier, exp.Literal, exp.Paren, exp.Round, exp.Floor, exp.Ceil, exp.Abs,
                   exp.Neg, exp.Add, exp.Sub, exp.Mul)


def _never_null(scope: Scope, arg: exp.Expression) -> bool:
    """Whether `arg` is a column the catalog declares NOT NULL, of a type without NaN (which the clamp reads as
    NULL), in a query without outer joins (which NULL-extend columns)."""
    if not isinstance(arg, exp.Column) or scope.outer_join or arg.table not in scope.aliases:
        return False
    table = scope.aliases[arg.table]
    column = scope.declared_column(arg)
    return (column is not None and column.type not in NAN_TYPES and (table.name, arg.name) in scope.not_null)


NAN_TYPES = ("double precision", "real", "numeric")


def _one_row_per_value(scope: Scope, arg: exp.Expression) -> bool:
    """Whether `arg` is a column the catalog guarantees unique, of the query's one table (no join of the query's
    own, no subquery in FROM; the joins dpsql adds to reach the unit follow unique parent keys, so they repeat no
    row): each value is on one row, and COUNT(DISTINCT c) is COUNT(c)."""
    if not isinstance(arg, exp.Column) or arg.table not in scope.aliases or scope.from_ is not None:
        return False
    return (len(scope.outer) == 1 and not scope.tree.args.get("joins")
            and (scope.aliases[arg.table].name, arg.name) in scope.unique)


def _not_null_of(arg: exp.Expression, exprs: Expressions) -> exp.Expression | None:
    """For COUNT(f(x, …)) where f is NULL exactly when one of its columns is (rounding, absolute value, sums and
    products): `CASE WHEN x IS NOT NULL AND … THEN 1 END`, which counts the same rows without computing f, so an
    unbounded column does not stop it (f could overflow where PostgreSQL would fail). None for anything else."""
    if not all(isinstance(n, NULL_PRESERVING) for n in arg.walk()) or isinstance(arg, exp.Column):
        return None
    if any(isinstance(n, exp.Literal) and n.is_string for n in arg.walk()):
        return None
    columns = list({to_sql(c): c for c in arg.find_all(exp.Column)}.values())
    if not columns or any(exprs.value_range(c) is None for c in columns):  # numbers only (round(text) fails)
        return None
    present = exp.and_(*(exp.Not(this=exp.Is(this=c.copy(), expression=exp.Null())) for c in columns))
    return exp.Case(ifs=[exp.If(this=present, true=exp.Literal.number(1))])


def _note_values(scope: Scope, measure: str, value: exp.Expression) -> None:
    """Record on a COUNT(DISTINCT value) measure how many values `value` may take, where its declared bounds or
    domain make them public (`Plan.distinct_pairs`)."""
    key = next(k for k, m in scope.measures.items() if m.name == measure)
    try:
        values = key_domain(scope, value, None)
    except (InvalidQuery, UnsupportedQuery):  # a key dpsql would refuse to group by: its values are not known
        values = None
    if values is not None:
        scope.measures[key] = replace(scope.measures[key], values=len(values))


def is_window_function(node: exp.Expression) -> bool:
    """Whether `node` is the function of a window (computed over the released rows), not an aggregate."""
    return isinstance(node.parent, exp.Window) and node is node.parent.this


def _aggregate(scope: Scope, name: str, node: exp.Expression, sql: str) -> Aggregate:
    kind = AGGREGATES[type(node)]
    arg = node.this

    def measure_of(label: str, measure_kind: str, expr: exp.Expression | None, row_range: Range,
                   centre: float = 0.0, squares_of: str | None = None) -> str:
        key = f"{measure_kind}:{label if expr is None else to_sql(expr)}:{centre!r}"
        if key not in scope.measures:
            scope.measures[key] = replace(_measure(scope, f"m{len(scope.measures)}", label, measure_kind, expr,
                                                   row_range, squares_of), centre=centre, squares_of=squares_of)
        return scope.measures[key].name

    if kind == "count":
        if isinstance(arg, exp.Distinct):
            value = arg.expressions[0] if len(arg.expressions) == 1 else None
            if isinstance(value, exp.Column) and _counts_every_unit(scope, value):
                return Aggregate(name, "count_units", (measure_of("distinct units", "units", None, ONE),), None, sql)
            if value is not None and _one_row_per_value(scope, value):
                arg = value  # its distinct values are its rows: COUNT(c), one measure with COUNT(*) where never NULL
            elif value is not None and (scope.direct or not scope.cap_groups):
                # each changed row (under unit-level privacy, a direct aggregate's row is a whole unit) adds or
                # removes at most one distinct value of its group; through a per-unit stage, the rewrite counts
                # the distinct values of the k rows a unit keeps over all groups, so the unit moves the counts
                # by at most k in all
                scope.exprs.check(value)
                scope.rows_total = scope.rows_total or not scope.direct
                label = f"COUNT(DISTINCT {to_sql(value)})"
                measure = measure_of(label, "distinct", scope.exprs.guard(value), BIT)
                _note_values(scope, measure, value)
                return Aggregate(name, "count", (measure,), None, sql)
            elif value is None:  # PostgreSQL has no count of two arguments
                raise UnsupportedQuery("COUNT(DISTINCT a, b) takes one expression, as in PostgreSQL",
                                       "count distinct rows of values: COUNT(DISTINCT (a, b))")
            else:
                raise UnsupportedQuery(f"{sql}: COUNT(DISTINCT ...) is answered for the privacy unit "
                                       f"({scope.schema.describe_unit()}), or where each unit keeps k rows over "
                                       "all its groups, which this query's groups per unit do not",
                                       "count distinct units, or count rows with COUNT(*)")
        if arg is None or isinstance(arg, exp.Star):
            return Aggregate(name, "count", (measure_of("COUNT(*)", "count", None, ONE),), None, sql)
        label = f"COUNT({to_sql(arg)})"
        if _never_null(scope, arg):  # the same rows as COUNT(*): one measure, not two
            return Aggregate(name, "count", (measure_of("COUNT(*)", "count", None, ONE),), None, sql)
        try:
            scope.exprs.check(arg)
            counted = scope.exprs.guard(arg)
        except UnsupportedQuery:
            counted = _not_null_of(arg, scope.exprs)  # COUNT sees only whether its argument is NULL
            if counted is None:
                raise
        return Aggregate(name, "count", (measure_of(label, "count", counted, BIT),), None, sql)
    if isinstance(arg, exp.Distinct):
        raise UnsupportedQuery(f"{sql}: DISTINCT is supported only in COUNT(DISTINCT unit)",
                               "aggregate the column itself (SUM(x), AVG(x)), or count distinct units with "
                               "COUNT(DISTINCT <the unit's column>)")
    entry = KINDS[kind]
    arguments = [node.this, node.expression][:entry.arguments]  # agg(x), or agg(y, x)
    whats = [f"{kind.upper()} argument"] if len(arguments) == 1 else [f"{kind} first argument",
                                                                       f"{kind} second argument"]
    bounded = [_bounded(scope, a, what) for a, what in zip(arguments, whats, strict=True)]

    def count() -> str:  # the rows of the argument, where its measures need them
        if _never_null(scope, arg):
            return measure_of("COUNT(*)", "count", None, ONE)
        return measure_of(f"COUNT({bounded[0].label})", "count", bounded[0].value, BIT)

    context = Context(count, scope.exprs.kind(arg) != "float", scope.total_cap)
    measures, centred = entry.measures(measure_of, *bounded, context)
    return Aggregate(name, kind, measures, bounded[0].range, sql, x_range=bounded[1].range if len(bounded) > 1
                     else None, centred=centred)


def _bounded(scope: Scope, arg: exp.Expression, what: str) -> Bounded:
    """An aggregate argument's label, declared range and guarded value, clamped to that range."""
    value_range = scope.exprs.numeric(arg, what)
    value = scope.exprs.guard(arg)
    if not isinstance(arg, exp.Column):  # a bare column is already clamped to exactly this range
        value = clamp_to(value, value_range.lo, value_range.hi, scope.exprs.kind(arg))
    return Bounded(to_sql(arg), value_range, value)


def _counts_every_unit(scope: Scope, column: exp.Column) -> bool:
    """Whether COUNT(DISTINCT column) counts the units of the rows: the unit column the rows are bounded by, or
    another unit column no outer join fills with NULLs (`people p LEFT JOIN visits v`: v.person_id is NULL for
    people without a visit, who are units all the same)."""
    if not scope.is_unit(column):
        return False
    unit = scope.unit
    read_as_unit = isinstance(unit, exp.Column) and (unit.table, unit.name) == (column.table, column.name)
    return read_as_unit or column.table not in scope.nullable()


def _units_or_null(scope: Scope, expr: exp.Expression | None) -> bool:
    """Whether `expr` is a unit's own column or NULL: CASE WHEN c THEN <the unit column> END, or the unit column of
    a table an outer join may fill with NULLs."""
    if isinstance(expr, exp.Column) and scope.is_unit(expr) and expr.table in scope.nullable():
        return True
    if not isinstance(expr, exp.Case) or expr.this is not None or len(expr.args.get("ifs") or []) != 1:
        return False
    default, then = expr.args.get("default"), expr.args["ifs"][0].args.get("true")
    return (default is None or isinstance(default, exp.Null)) and isinstance(then, exp.Column) and scope.is_unit(then)


def _measure(scope: Scope, name: str, label: str, kind: str, expr: exp.Expression | None,
             row_range: Range, squares_of: str | None = None) -> Measure:
    k, groups = scope.rows_per_unit, scope.max_groups
    # a unit contributes 1 to "distinct units", else between 0 and k rows' worth of values
    unit_range = (1.0, 1.0) if kind == "units" else (k * min(row_range.lo, 0.0), k * max(row_range.hi, 0.0))
    per_group = max(abs(unit_range[0]), abs(unit_range[1]))
    if per_group == 0:  # no mechanism is calibrated to sensitivity 0, and the value needs no data
        raise UnsupportedQuery(f"{label} is the same on every database: given the declared bounds every row "
                               f"contributes {row_range.lo:g}", "aggregate an expression that varies")
    # a unit counts once in each group it reaches, however its rows are bounded; so does a count of the distinct
    # units that meet a condition (COUNT(DISTINCT person_id) FILTER (WHERE ...)), where that is less than its k
    steps, spread = scope.steps, groups if kind == "units" and scope.stability is None else scope.spread(groups)
    if kind == "distinct" and scope.stability is None and _units_or_null(scope, expr) and groups < spread * k:
        unit_range, spread, per_group = (0.0, 1.0), groups, 1.0
    if scope.total_cap is not None and kind == "sum":  # the rewrite scales a unit's totals down to the cap
        if row_range.lo < 0:
            raise ValueError(f"{label}: a unit's total is bounded only for sums of non-negative values")
        cap = scope.total_cap
        if scope.total_of_squares and squares_of is None:
            # scaled by the factor g that brings the unit's sum of squares S to at most the cap, its n <= k values
            # add up to g·Σx <= g·sqrt(n·S) <= sqrt(k·cap) (Cauchy-Schwarz, and g <= 1)
            cap = math.sqrt(k * cap)
        unit_range, spread = (0.0, min(unit_range[1], cap)), 1
        per_group = unit_range[1]
        row_range = replace(row_range, integer=False)  # a scaled total is a fraction: released on a grid
    sensitivity = steps * spread * per_group
    l2_sensitivity = steps * math.sqrt(spread) * per_group
    scope.notes.append(f"{label}: per row in [{row_range.lo:g}, {row_range.hi:g}], per unit in "
                       f"[{unit_range[0]:g}, {unit_range[1]:g}], L1 sensitivity {sensitivity:g}, "
                       f"L2 {l2_sensitivity:.6g}")
    natural = _unit_total(scope, expr) if kind == "sum" else None
    return Measure(name, label, kind, expr, row_range, unit_range, sensitivity, l2_sensitivity, steps * groups,
                   natural_total=natural if natural is not None and natural < unit_range[1] else None)


def _unit_total(scope: Scope, expr: exp.Expression | None) -> float | None:
    """The `unit_total` of the subquery column that `expr` reads as it is (guarded), if it has one."""
    text = to_sql(expr) if expr is not None else None
    for alias, table in scope.aliases.items():
        for column in table.columns.values():
            if column.unit_total is not None and to_sql(scope.exprs.guard(exp.column(column.name, alias))) == text:
                return column.unit_total
    return None
