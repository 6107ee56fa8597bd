"""Pass: what runs after noise. The SELECT list, HAVING and ORDER BY become expressions over the noisy
aggregates and the group keys, evaluated in Python on released values only (post-processing costs nothing).

Rule: any column outside an aggregate must be a group key (PostgreSQL's own rule), so nothing computed after
noise reads a raw value; LIMIT and OFFSET must be whole-number constants. A window function (in the SELECT
list or ORDER BY) runs over the released rows too: it becomes a column computed once all rows are known.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis.aggregates import is_window_function
from dpsql.analysis.expressions import Expressions
from dpsql.analysis.groups import key_type
from dpsql.analysis.plan import COUNTS, Aggregate, GroupKey, Output, noisy_windows
from dpsql.analysis.scope import Scope
from dpsql.errors import PrivacyRefusal, UnsupportedQuery
from dpsql.sql import AGGREGATES, limit_clause, to_sql
from dpsql.sql.query import branches_of


def post_process(scope: Scope) -> None:
    """Set the scope's outputs (with their types), HAVING, ORDER BY, LIMIT and OFFSET."""
    keys, aggregates, tree = scope.group_keys, scope.aggregates, scope.tree
    by_sql = {a.sql: a for a in aggregates}
    key_sql = {k.sql: k for k in keys}

    windows: dict[str, tuple[str, exp.Window]] = {}

    def substitute(node: exp.Expression) -> exp.Expression:
        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, tuple(AGGREGATES)) and not is_window_function(n):
                return exp.column(by_sql[to_sql(n)].name)
            spelled = to_sql(n.unnest())  # keys are spelled without parentheses (`groups._group_keys`)
            if spelled in key_sql and not isinstance(n, exp.Ordered):  # (an ascending ORDER BY item prints
                # as its key, and stays an item)
                return exp.column(key_sql[spelled].name)
            if isinstance(n, exp.Column):
                raise PrivacyRefusal(f'column "{to_sql(n)}" must appear in GROUP BY or be used '
                                     "in an aggregate", "dpsql never releases raw values")
            return n
        named = _name_windows(node.copy().transform(swap, copy=False), windows)
        return _integer_division(named, aggregates, dict(windows.values()))

    outputs, by_alias = [], {}
    aggregate_names = {agg.name for agg in aggregates}
    for name, item in zip(scope.query.output_names, tree.expressions, strict=True):
        expr = substitute(item.unalias())
        noisy_names = aggregate_names | noisy_windows(list(windows.values()), aggregate_names)
        noisy = any(c.name in noisy_names for c in expr.find_all(exp.Column))
        outputs.append(Output(name, expr, _output_type(expr, aggregates, keys, scope.exprs, item.unalias(),
                                                       dict(windows.values())), noisy))
        by_alias[item.alias_or_name] = expr
    having = substitute(tree.args["having"].this) if tree.args.get("having") else None
    order = []
    for ordered in (tree.args["order"].expressions if tree.args.get("order") else []):
        target = ordered.this
        if isinstance(target, exp.Column) and not target.table and target.name in by_alias:
            expr = by_alias[target.name]
        else:
            expr = substitute(target)
        descending = bool(ordered.args.get("desc"))
        nulls_first = ordered.args.get("nulls_first")
        order.append((expr, descending, descending if nulls_first is None else bool(nulls_first)))
    scope.outputs, scope.having, scope.order = outputs, having, order
    scope.windows = list(windows.values())
    scope.limit, scope.offset = limit_clause(tree, "limit"), limit_clause(tree, "offset") or 0


def _integer_division(node: exp.Expression, aggregates: list[Aggregate],
                      windows: dict[str, exp.Window]) -> exp.Expression:
    """A quotient of two integers is PostgreSQL's integer division (`COUNT(*) / 2`, `COUNT(*) / COUNT(DISTINCT
    person_id)`): truncated toward zero, typed bigint. Only where both sides are integers whatever the columns'
    widths (counts, ranks, integer constants and casts); a SUM is left a quotient of doubles, since PostgreSQL's
    SUM of a bigint is numeric and of an integer bigint, which the privacy schema does not tell apart."""
    counts = {a.name for a in aggregates if a.kind in COUNTS and a.score != "count"}

    def whole(n: exp.Expression) -> bool:
        if isinstance(n, exp.Column):
            window = windows.get(n.name)
            return n.name in counts or window is not None and isinstance(window.this, _WHOLE_WINDOWS)
        if isinstance(n, exp.Literal):
            return n.is_int
        if isinstance(n, exp.Cast):
            return n.to.this in _INTEGER_TYPES
        if isinstance(n, exp.Paren | exp.Neg):
            return whole(n.this)
        if isinstance(n, exp.Add | exp.Sub | exp.Mul | exp.Div | exp.IntDiv):
            return whole(n.this) and whole(n.expression)
        return False

    def divide(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Div) and whole(n.this) and whole(n.expression):
            return exp.IntDiv(this=n.this, expression=n.expression)
        return n
    return node.transform(divide, copy=False)


_WHOLE_WINDOWS = (exp.RowNumber, exp.Rank, exp.DenseRank, exp.Count, exp.Ntile)
_INTEGER_TYPES = (exp.DataType.Type.INT, exp.DataType.Type.BIGINT, exp.DataType.Type.SMALLINT)


def _name_windows(node: exp.Expression, windows: dict[str, tuple[str, exp.Window]]) -> exp.Expression:
    """Each window in `node` (already over aggregate and key names) becomes a column dpsql_w<i>: computed over
    all released rows once they are known (`postprocess.finish`), the same window once however often it is
    written."""
    def name(n: exp.Expression) -> exp.Expression:
        if not isinstance(n, exp.Window):
            return n
        key = to_sql(n)
        if key not in windows:
            windows[key] = (f"dpsql_w{len(windows)}", n)
        return exp.column(windows[key][0])
    return node.transform(name, copy=False)


def _output_type(expr: exp.Expression, aggregates: list[Aggregate], keys: list[GroupKey], exprs: Expressions,
                 original: exp.Expression, windows: dict[str, exp.Window]) -> str:
    if isinstance(expr, exp.Column) and expr.name in windows:
        function = windows[expr.name].this
        if isinstance(function, _WHOLE_WINDOWS):
            return "int8"
        if isinstance(function, exp.Min | exp.Max | exp.Sum | exp.Lag | exp.Lead | exp.FirstValue | exp.LastValue):
            # another row's value, or a SUM: PostgreSQL's SUM of a bigint (a count) is numeric
            inner = _output_type(function.this, aggregates, keys, exprs, function.this, windows)
            return "numeric" if isinstance(function, exp.Sum) and inner == "int8" else inner
        if isinstance(function, exp.Avg):  # an average of whole numbers or numerics is a numeric
            inner = _output_type(function.this, aggregates, keys, exprs, function.this, windows)
            return "numeric" if inner in ("int8", "numeric") else "float8"
        return "float8"
    if isinstance(expr, exp.Column):
        for agg in aggregates:
            if agg.name == expr.name:
                if agg.score == "count" or agg.arg_type is not None:  # one of the values (mode), or a date
                    return agg.arg_type
                # a quantile of integers is one of them; PostgreSQL's SUM of integers is a whole number (bigint,
                # or numeric for bigint), which a noisy sum rounded to the nearest is too (post-processing)
                integral = agg.score == "rank" or agg.kind == "sum"
                if isinstance(_aggregate_of(original), exp.Sum) and agg.kind == "sum":
                    return _sum_type(_aggregate_of(original).this, exprs)
                if agg.kind in COUNTS or integral and agg.arg_range.integer:
                    return "int8"
                return "numeric" if _exact_mean(original, exprs) else "float8"
        for key in keys:
            if key.name == expr.name:
                return key_type(original, exprs)
    if isinstance(expr, exp.Array) and expr.expressions:  # percentiles asked as an array: PostgreSQL's array type
        element = _output_type(expr.expressions[0], aggregates, keys, exprs, original.expressions[0], windows)
        return f"{element}[]"
    if isinstance(expr, exp.Literal):
        return constant_type(expr)
    if isinstance(expr, exp.IntDiv):  # (`_integer_division`)
        return "int8"
    if isinstance(expr, exp.Extract):  # a field of a released date: EXTRACT's numeric, date_part's double
        return "float8" if expr.meta.get("written") == "date_part" else "numeric"
    if isinstance(expr, exp.TimeToStr):  # to_char of a released key, or of a noisy number
        _check_formatted(expr, aggregates, keys, exprs, original, windows)
        return "text"
    if isinstance(expr, exp.DPipe):
        return "text"
    if isinstance(expr, exp.Round | exp.Ceil | exp.Floor):  # of a numeric a numeric, of anything else a double
        inner = original.this if type(original) is type(expr) else expr.this
        numeric = _output_type(expr.this, aggregates, keys, exprs, inner, windows) == "numeric"
        return "numeric" if numeric else "float8"
    if isinstance(expr, exp.Cast):
        if expr.to.this in _INTEGER_TYPES:
            return "int8"
        if expr.to.this in (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR):
            return "text"
        if expr.to.this in (exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP):
            return "date" if expr.to.this == exp.DataType.Type.DATE else "timestamp"
        if expr.to.this == exp.DataType.Type.DECIMAL:
            return "numeric"
    if branches_of(expr) is not None:  # COALESCE, CASE, GREATEST, LEAST: the type their branches share
        written = branches_of(original) if type(original) is type(expr) else None
        written = written if written is not None and len(written) == len(branches_of(expr)) else branches_of(expr)
        return common_type([_output_type(branch, aggregates, keys, exprs, was, windows)
                            for branch, was in zip(branches_of(expr), written, strict=True)
                            if not isinstance(branch, exp.Null)])
    if isinstance(expr, exp.Paren | exp.Neg | exp.Add | exp.Sub | exp.Mul | exp.Div):
        # sums, differences and products of whole numbers are whole, as PostgreSQL types them (COUNT(*) * 2 is a
        # bigint); with a numeric (a window's SUM of counts) they are numeric
        sides = [side for side in (expr.this, expr.args.get("expression")) if side is not None]
        written = [original.args.get(arg) if type(original) is type(expr) else None for arg in ("this", "expression")]
        kinds = {_output_type(side, aggregates, keys, exprs, was if was is not None else side, windows)
                 for side, was in zip(sides, written, strict=False)}
        if kinds == {"date"} and isinstance(expr, exp.Sub):  # the days between two dates
            return "int8"
        if kinds == {"date", "int8"} and isinstance(expr, exp.Add | exp.Sub):  # a date moved by days
            return "date"
        if kinds == {"int8"}:  # a quotient of whole numbers here is of SUMs (`_integer_division`): a double
            return "float8" if isinstance(expr, exp.Div) else "int8"
        return "numeric" if kinds <= {"int8", "numeric"} else "float8"
    return "float8"


# PostgreSQL's aggregates that are a numeric over integers and numerics (a double over doubles)
_MEANS = (exp.Avg, exp.Stddev, exp.StddevSamp, exp.StddevPop, exp.Variance, exp.VariancePop)


def _exact_mean(original: exp.Expression, exprs: Expressions) -> bool:
    """Whether `original` is an AVG, STDDEV or VARIANCE of whole numbers or numerics: PostgreSQL's numeric."""
    original = _aggregate_of(original)
    return isinstance(original, _MEANS) and exprs.kind(original.this) in ("integer", "numeric")


def _sum_type(summed: exp.Expression, exprs: Expressions) -> str:
    """PostgreSQL's type of a SUM: of integers a bigint, of a bigint column (a subquery's COUNT) or of numerics a
    numeric, of doubles a double."""
    kind = exprs.kind(summed)
    column = exprs.column(summed) if isinstance(summed, exp.Column) else None
    if kind == "numeric" or kind == "integer" and column is not None and column.type == "bigint":
        return "numeric"
    return "int8" if kind == "integer" else "float8"


def _aggregate_of(original: exp.Expression) -> exp.Expression:
    """The aggregate call an output is, as written (under its FILTER or brackets)."""
    while isinstance(original, exp.Filter | exp.Paren):
        original = original.this
    return original


def constant_type(literal: exp.Literal) -> str:
    return "text" if literal.is_string else "int8" if literal.is_int else "numeric"  # PostgreSQL reads 1.5 as numeric


def common_type(types: list[str]) -> str:
    """The one type of values of these types, as PostgreSQL resolves a CASE's or COALESCE's branches: text where
    any is (a string constant), numeric for whole numbers beside numerics, float8 among numbers otherwise."""
    kinds = set(types)
    if not kinds or "text" in kinds:
        return "text"
    if len(kinds) == 1:
        return kinds.pop()
    return "numeric" if kinds <= {"int8", "numeric"} else "float8"


def _check_formatted(expr: exp.TimeToStr, aggregates: list[Aggregate], keys: list[GroupKey], exprs: Expressions,
                     original: exp.Expression, windows: dict[str, exp.Window]) -> None:
    """to_char formats a released key, or a number; a noisy date (MIN(day)) is a number of days until it is typed,
    so its text would be that number's."""
    if isinstance(expr.this, exp.Column) and any(key.name == expr.this.name for key in keys):
        return
    inner = original.this if isinstance(original, exp.TimeToStr) else expr.this
    if _output_type(expr.this, aggregates, keys, exprs, inner, windows) not in ("int8", "float8", "numeric"):
        raise UnsupportedQuery(f"to_char of {to_sql(inner)} is answered over a GROUP BY key or a number, not a "
                               "noisy date", "group by the date and format it: SELECT to_char(date_trunc('month', "
                               "day), 'Mon YYYY'), COUNT(*) FROM visits GROUP BY date_trunc('month', day)")
