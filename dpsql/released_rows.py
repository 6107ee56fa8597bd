"""Aggregates over released rows: `SELECT AVG(n), MAX(n) FROM (SELECT k, COUNT(*) AS n ... GROUP BY k) t` is the
inner query's noisy answer, then the outer query computed over its released rows in Python (post-processing: it
costs nothing more and reads no data). The outer query may filter (WHERE), group, aggregate (COUNT, SUM, AVG,
MIN, MAX), filter groups (HAVING), order and limit, over the inner query's output columns only.
"""

from __future__ import annotations

import itertools
import math
import numbers
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.analysis.outputs import common_type, constant_type
from dpsql.analysis.plan import Output
from dpsql.postprocess import Accuracy, evaluate, sort_rows
from dpsql.postprocess.evaluate import truthy
from dpsql.sql.parse import parse_select
from dpsql.sql.query import branches_of, output_name

Reported = Callable[[dict, dict], tuple[dict, dict]]  # a picked row's values and accuracy -> those it shows

# var_samp (variance), var_pop, stddev (stddev_samp), stddev_pop: whether over a population, and a square root
SPREADS = {exp.Variance: (False, False), exp.VariancePop: (True, False), exp.Stddev: (False, True),
           exp.StddevSamp: (False, True), exp.StddevPop: (True, True)}
AGGREGATE_KINDS = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, *SPREADS)
SPREAD_DRAWS = 2000  # simulated noise draws behind a variance's interval


def outer_columns(outer_sql: str, inner: Sequence[Output]) -> tuple[list[str], list[str], list[bool]]:
    """The outer query's column names, types and noisiness, known before anything runs: a COUNT is int8, a bare
    inner column keeps its type, anything else is float8; a value is noisy unless it reads only inner columns
    that are not (a group's key) outside any aggregate."""
    tree = parse_select(outer_sql)
    by_name = {o.name: o for o in inner}
    names, types, noisy = [], [], []
    for item in tree.expressions:
        value = item.unalias()
        names.append(output_name(item))
        types.append(computed_type(value, {name: o.type_name for name, o in by_name.items()}))
        noisy.append(value.find(*AGGREGATE_KINDS) is not None or any(
            c.name not in by_name or by_name[c.name].noisy for c in value.find_all(exp.Column)))
    return names, types, noisy


def computed_type(value: exp.Expression, types: dict[str, str]) -> str:
    """The type of a value computed over released columns (`types` by name), as PostgreSQL types it: a COUNT is int8,
    a column keeps its type, MIN and MAX their argument's, a SUM of whole numbers or numerics and their AVG, STDDEV
    or VARIANCE a numeric (of doubles a double), a COALESCE or CASE takes its branches' common type, anything else
    is float8."""
    value = value.unnest()
    if isinstance(value, exp.Count):
        return "int8"
    if isinstance(value, exp.Min | exp.Max):
        return computed_type(value.this, types)
    if isinstance(value, (exp.Sum, exp.Avg, *SPREADS)):
        return "numeric" if computed_type(value.this, types) in ("int8", "numeric") else "float8"
    if isinstance(value, exp.Column):
        return types.get(value.name, "float8")
    if isinstance(value, exp.Literal):
        return constant_type(value)
    branches = branches_of(value)
    if branches is not None:
        return common_type([computed_type(b, types) for b in branches if not isinstance(b, exp.Null)])
    return "float8"


def aggregate_released(outer_sql: str, names: Sequence[str], rows: Sequence[tuple],
                       accuracy: Sequence[tuple] | None = None,
                       noisy: Sequence[bool] | None = None) -> tuple[list[tuple], list[tuple]]:
    """The outer query's rows over `rows` (the inner answer's, with column `names` and each value's `accuracy`),
    each value with its accuracy. A count shown as 0 enters SUM and AVG as its noisy value
    (`Accuracy.unclamped`): a sum of clamped counts would run high. Filters and keys read the values shown.
    `noisy`: which inner columns carry noise (by default, those with an accuracy in some row). A SUM or AVG of
    values that each carry noise of their own, and sums, differences, multiples and ratios of such aggregates,
    have an interval (`_interval`; the released rows read taken as given); other outputs have none, nor has
    any where the WHERE keeps a row by a noisy value that its interval could put on the other side
    (`filtered_by_noise`)."""
    tree = parse_select(outer_sql)
    accuracy = accuracy or [(None,) * len(names)] * len(rows)
    noisy_names = _noisy_names(names, accuracy, noisy)
    members = _members(names, rows, accuracy)
    where = tree.args["where"].this if tree.args.get("where") else None
    uncertain = where is not None and _kept_by_noise(where, members)
    if where is not None:
        members = [m for m in members if evaluate(where, m[0])]
    outputs = [item.unalias() for item in tree.expressions]
    by_name = {output_name(item): value for item, value in zip(tree.expressions, outputs, strict=True)}
    # GROUP BY 1 or an output's name (where no inner column has it), as PostgreSQL reads them
    keys = [_output_term(k, outputs, by_name, set(names)) for k in
            (tree.args["group"].expressions if tree.args.get("group") else [])]
    groups: dict[tuple, list[tuple[dict, dict, dict]]] = {}
    for member in members:
        groups.setdefault(tuple(_plain(evaluate(k, member[0])) for k in keys), []).append(member)
    if not keys and not groups:
        groups[()] = []  # an aggregate over no rows is one row, as in PostgreSQL
    having = tree.args["having"].this if tree.args.get("having") else None
    order = [_output_term(o.this, outputs, by_name, set()) for o in
             (tree.args["order"].expressions if tree.args.get("order") else [])]  # (ORDER BY: outputs' names first)
    found = []
    for group in groups.values():
        env = {**(group[0][0] if group else {}), **_aggregates(tree, group, noisy_names)}
        if having is not None and not evaluate(_named(having), env):
            continue
        values = tuple(_plain(evaluate(_named(o), env)) for o in outputs)
        forms = Forms(group, env, noisy_names)
        intervals = tuple(None if uncertain else _interval(o, value, forms)
                          for o, value in zip(outputs, values, strict=True))
        found.append((values, intervals, [_plain(evaluate(_named(o), env)) for o in order]))
    found = _ordered_and_cut(tree, found, lambda row, i: row[2][i])
    return [values for values, _, _ in found], [intervals for _, intervals, _ in found]


def uncorrected_spreads(outer_sql: str, names: Sequence[str], rows: Sequence[tuple], accuracy: Sequence[tuple],
                        noisy: Sequence[bool] | None = None) -> list[str]:
    """The outer query's variances and standard deviations over released values whose noise variance is not known
    (averages, de-biased reports): they are the noisy values' own spread, which runs wider than the exact ones'.
    The arguments are `aggregate_released`'s."""
    members, noisy_names = _members(names, rows, accuracy), _noisy_names(names, accuracy, noisy)
    return [output_name(item) for item in parse_select(outer_sql).expressions for node in item.find_all(*SPREADS)
            if _spread_parts(node.this, members, noisy_names)[1] is None]


def _members(names: Sequence[str], rows: Sequence[tuple], accuracy: Sequence[tuple]) -> list[tuple[dict, dict, dict]]:
    """Each released row by column name: its values shown, with counts unclamped, and their accuracy."""
    return [(dict(zip(names, row, strict=True)), dict(zip(names, _unclamped(row, acc), strict=True)),
             dict(zip(names, acc, strict=True))) for row, acc in zip(rows, accuracy, strict=True)]


def _noisy_names(names: Sequence[str], accuracy: Sequence[tuple], noisy: Sequence[bool] | None) -> set[str]:
    """The inner columns that carry noise: as `noisy` says, or by default those with an accuracy in some row."""
    if noisy is not None:
        return {n for n, is_noisy in zip(names, noisy, strict=True) if is_noisy}
    return {n for i, n in enumerate(names) if any(acc[i] is not None for acc in accuracy)}


def filtered_by_noise(outer_sql: str, names: Sequence[str], rows: Sequence[tuple],
                      accuracy: Sequence[tuple]) -> bool:
    """Whether the outer query's WHERE keeps some released row by a noisy value that its 95% interval would put on
    the other side (`SELECT SUM(n) … WHERE n > 1000`, a count near 1000): which rows are added up then moves with
    the noise, and `aggregate_released` gives its aggregates no interval."""
    tree = parse_select(outer_sql)
    if not tree.args.get("where"):
        return False
    members = [(dict(zip(names, row, strict=True)), None, dict(zip(names, acc, strict=True)))
               for row, acc in zip(rows, accuracy, strict=True)]
    return _kept_by_noise(tree.args["where"].this, members)


def _kept_by_noise(condition: exp.Expression, members: list[tuple[dict, Any, dict]]) -> bool:
    """Whether `condition` holds for some row at one end of its noisy values' 95% intervals and fails at another
    (or at the values shown)."""
    read = {c.name for c in condition.find_all(exp.Column)}
    return any(_moved_by_noise(lambda env: truthy(evaluate(condition, env)), read, shown, acc)
               for shown, _, acc in members)


def _moved_by_noise(value_of: Callable[[dict], Any], read: set[str], shown: dict, acc: dict) -> bool:
    """Whether `value_of` a row differs between its values shown and some combination of the ends of the 95%
    intervals of its noisy columns in `read`."""
    noisy = [(name, a) for name, a in acc.items() if name in read and a is not None and a.ci_low is not None]
    if not noisy:
        return False
    names = [name for name, _ in noisy]
    seen = value_of(shown)
    return any(value_of({**shown, **dict(zip(names, corner, strict=True))}) != seen
               for corner in itertools.product(*[(a.ci_low, a.ci_high) for _, a in noisy]))


def _interval(output: exp.Expression, value: Any, forms: Forms) -> Accuracy | None:
    """An output's 95% interval from the noise of the released values it reads (`aggregate_released`): a linear
    form of them (SUM, AVG, their sums, differences and constant multiples) is its value ± their half-widths
    added up (`_spread`); a ratio of two (a share: `SUM(CASE WHEN k = 'a' THEN n ELSE 0 END) * 1.0 / SUM(n)`) is
    bounded over the box of its two parts (`_ratio_range`). None for anything else, or an exact value."""
    value = numeric_value(value)
    if value is None:
        return None
    node, factor = _scaled(output, forms.env)
    if node is None:
        return None
    if isinstance(node, tuple(SPREADS)):
        found = _spread_range(node, forms.group, forms.noisy)
        return None if found is None else Accuracy(None, *sorted((factor * found[0], factor * found[1])))
    terms = forms.of(node)
    if terms is not None:
        spread = abs(factor) * _spread(terms, forms.halfwidths)
        return Accuracy(None, value - spread, value + spread) if terms else None
    if not isinstance(node, exp.Div):
        return None
    parts = forms.of(node.this), forms.of(node.expression)
    if parts[0] is None or not parts[1]:
        return None
    top, bottom = numeric_value(forms.value(node.this)), numeric_value(forms.value(node.expression))
    found = None if top is None or bottom is None else _ratio_range(*parts, top, bottom, forms.halfwidths)
    if found is None:
        return None
    low, high = sorted((factor * found[0], factor * found[1]))
    return Accuracy(None, low, high)


Terms = dict[tuple[int, str], float]  # a linear form of released values: (row, column) -> coefficient

# A ratio's two parts each take a 97.5% interval, so that both hold at once with 95% probability whatever their
# dependence (a union bound). Our noise (Laplace, Gaussian, a binomial's, and sums of them) has a symmetric
# log-concave law, whose 97.5% half-width is at most ln(40)/ln(20) times its 95% one (with an exponential tail,
# the widest case, exactly that).
UNION_OF_TWO = math.log(40) / math.log(20)


class Forms:
    """Values over one group of released rows as linear forms of their noisy values (`Terms`): {} for an exact
    value, None where a value is not linear in them or reads one without a half-width of its own."""

    def __init__(self, group: list[tuple[dict, dict, dict]], env: dict[str, Any], noisy: set[str]) -> None:
        self.group, self.env, self.noisy = group, env, noisy  # (noisy: the inner columns that carry noise)
        self.halfwidths = {(i, name): a.halfwidth for i, (_, _, acc) in enumerate(group)
                           for name, a in acc.items() if a is not None and a.halfwidth is not None}

    def value(self, node: exp.Expression) -> Any:
        return _plain(evaluate(_named(node), self.env))

    def of(self, node: exp.Expression) -> Terms | None:
        """An output's part: aggregates over the group's rows, constants and keys, in linear arithmetic."""
        return _linear(node, self._aggregate, self.value)

    def _aggregate(self, node: exp.Expression) -> Terms | None:
        if isinstance(node, exp.Sum | exp.Avg):
            found: Terms = {}
            rows = 0
            for i, (shown, _, acc) in enumerate(self.group):
                if _plain(evaluate(node.this, shown)) is None:
                    continue  # (SUM and AVG skip a NULL)
                row = _linear(node.this, lambda n, i=i, shown=shown, acc=acc: self._in_row(n, i, shown, acc),
                              lambda n, shown=shown: _plain(evaluate(n, shown)))
                if row is None:
                    return None
                rows += 1
                for key, coefficient in row.items():
                    found[key] = found.get(key, 0.0) + coefficient
            return _times(found, 1 / rows) if isinstance(node, exp.Avg) and rows else found
        if isinstance(node, exp.Count) or isinstance(node, exp.Column) and node.name not in self.noisy:
            return {}  # the released rows taken as given; a key of the group
        return None

    def _in_row(self, node: exp.Expression, i: int, shown: dict, acc: dict) -> Terms | None:
        """A value of one released row: its noisy column, a constant or key, or the branch of a CASE its shown
        values take (None where the 95% interval of a noisy value its conditions read could take another)."""
        if isinstance(node, exp.Column):
            if (i, node.name) in self.halfwidths:
                return {(i, node.name): 1.0}
            return None if node.name in self.noisy else {}
        if isinstance(node, exp.Case) and node.this is None:
            ifs = node.args.get("ifs", [])

            def taken(env: dict) -> int:  # the first branch whose condition holds (len(ifs): the default)
                return next((n for n, b in enumerate(ifs) if truthy(evaluate(b.this, env))), len(ifs))
            if _moved_by_noise(taken, {c.name for b in ifs for c in b.this.find_all(exp.Column)}, shown, acc):
                return None
            at = taken(shown)
            branch = ifs[at].args["true"] if at < len(ifs) else node.args.get("default")
            if branch is None:
                return {}
            return _linear(branch, lambda n: self._in_row(n, i, shown, acc), lambda n: _plain(evaluate(n, shown)))
        return None


def _linear(node: exp.Expression, leaf: Callable[[exp.Expression], Terms | None],
            value: Callable[[exp.Expression], Any]) -> Terms | None:
    """`node` as a linear form: sums, differences, negations, numeric casts, ROUND, and products and quotients
    by an exact value (`value` computes it) of the forms `leaf` gives."""
    if isinstance(node, exp.Literal | exp.Null | exp.Boolean):
        return {}
    if node is not unwrapped(node):  # (a rounded value as the value itself: rounding moves it less than its noise)
        return _linear(unwrapped(node), leaf, value)
    if isinstance(node, exp.Neg):
        inner = _linear(node.this, leaf, value)
        return None if inner is None else _times(inner, -1.0)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
        left, right = _linear(node.this, leaf, value), _linear(node.expression, leaf, value)
        if left is None or right is None:
            return None
        if isinstance(node, exp.Add | exp.Sub):
            sign = 1.0 if isinstance(node, exp.Add) else -1.0
            return {k: left.get(k, 0.0) + sign * right.get(k, 0.0) for k in {**left, **right}}
        if isinstance(node, exp.Mul) and not left:
            left, right, exact = right, left, value(node.this)
        else:
            exact = value(node.expression)
        exact = numeric_value(exact)
        if right or exact is None or isinstance(node, exp.Div) and not exact:
            return None
        return _times(left, exact if isinstance(node, exp.Mul) else 1 / exact)
    return leaf(node)


def _times(terms: Terms, factor: float) -> Terms:
    return {key: coefficient * factor for key, coefficient in terms.items()}


def unwrapped(node: exp.Expression) -> exp.Expression:
    """`node` without the parentheses, numeric casts and ROUND around it (rounding moves a value less than its
    noise; a cast to text makes a value that has no interval)."""
    while isinstance(node, exp.Round | exp.Paren) or isinstance(node, exp.Cast) and node.to.is_type(
            *exp.DataType.NUMERIC_TYPES):
        node = node.this
    return node


def numeric_value(value: Any) -> float | None:
    """A released value as a float where it is a number (a count, a sum, a numeric's Decimal); None otherwise (a
    date, a text, a boolean), which has no interval of this kind."""
    return float(value) if isinstance(value, numbers.Number) and not isinstance(value, bool | complex) else None


def _scaled(output: exp.Expression, env: dict[str, Any]) -> tuple[exp.Expression | None, float]:
    """The output without the ROUND, casts and constant factors around it, and the factor: `ROUND(100.0 *
    SUM(a) / SUM(n), 1)` is 100 times SUM(a) / SUM(n) (rounding moves the value less than the noise does)."""
    factor = 1.0
    while True:
        if output is not unwrapped(output):
            output = unwrapped(output)
        elif isinstance(output, exp.Mul | exp.Div) and not _reads_aggregates(output.expression):
            exact = numeric_value(_plain(evaluate(_named(output.expression), env)))
            if not exact:
                return None, factor
            factor = factor * exact if isinstance(output, exp.Mul) else factor / exact
            output = output.this
        elif isinstance(output, exp.Mul) and not _reads_aggregates(output.this):
            output = exp.Mul(this=output.expression, expression=output.this)
        else:
            return output, factor


def _reads_aggregates(node: exp.Expression) -> bool:
    return node.find(*AGGREGATE_KINDS) is not None


def _spread(terms: Terms, halfwidths: dict[tuple[int, str], float]) -> float:
    """The half-width of a linear form of released values: the root of the sum of their squared half-widths
    times their coefficients, as for independent noise (wider than 95% needs for a sum of Laplace draws); the
    plain sum where coefficients differ in sign, since values of one group (de-biased counts of reports) may
    err in opposite directions, and a difference of them then errs by both."""
    spreads = [coefficient * halfwidths[key] for key, coefficient in terms.items() if coefficient]
    if all(s > 0 for s in spreads) or all(s < 0 for s in spreads):
        return math.sqrt(sum(s * s for s in spreads))
    return sum(abs(s) for s in spreads)


def _ratio_range(numerator: Terms, denominator: Terms, top: float, bottom: float,
                 halfwidths: dict[tuple[int, str], float]) -> tuple[float, float] | None:
    """The range of numerator / denominator where each of its two parts lies within its 97.5% interval
    (`UNION_OF_TWO`): the denominator is λ·x + y, x the numerator and y what is left of the
    denominator (λ its share of the numerator, so that a share's y is the rest: `a / (a + b)` reads x = a,
    y = b, whose errors a shared total would otherwise count twice). x / (λx + y) has no extremum inside a box
    on which its denominator keeps its sign, and is monotone along each edge, so its range is its values at the
    corners. None where the denominator's box reaches 0."""
    norm = sum((c * halfwidths[k]) ** 2 for k, c in numerator.items())
    share = sum(c * denominator.get(k, 0.0) * halfwidths[k] ** 2 for k, c in numerator.items()) / norm if norm else 0.0
    rest = {k: denominator.get(k, 0.0) - share * numerator.get(k, 0.0) for k in {**numerator, **denominator}}
    x, y = float(top), float(bottom) - share * float(top)
    wide_x, wide_y = UNION_OF_TWO * _spread(numerator, halfwidths), UNION_OF_TWO * _spread(rest, halfwidths)
    corners = [(x + dx, y + dy) for dx in (-wide_x, wide_x) for dy in (-wide_y, wide_y)]
    below = [share * cx + cy for cx, cy in corners]
    if min(below) <= 0 <= max(below):
        return None
    values = [cx / b for (cx, _), b in zip(corners, below, strict=True)]
    return min(values), max(values)


def _unclamped(row: tuple, accuracy: tuple) -> tuple:
    """`row` with each count that was clamped at 0 back at its noisy value."""
    if not any(getattr(a, "unclamped", None) is not None for a in accuracy):
        return row
    return tuple(v if a is None or a.unclamped is None else a.unclamped for v, a in zip(row, accuracy, strict=True))


def _output_term(node: exp.Expression, outputs: list[exp.Expression], by_name: dict[str, exp.Expression],
                 inner: set[str]) -> exp.Expression:
    """A GROUP BY or ORDER BY term as the expression it names: a position (1), or an output's name that is not
    an inner column's (`inner`: GROUP BY reads an inner column first, ORDER BY an output)."""
    if isinstance(node, exp.Literal) and node.is_int and 1 <= int(node.this) <= len(outputs):
        return outputs[int(node.this) - 1]
    if isinstance(node, exp.Column) and not node.table and node.name in by_name and node.name not in inner:
        return by_name[node.name]
    return node


def pick_released(outer_sql: str, names: Sequence[str], rows: Sequence[tuple], accuracy: Sequence[tuple],
                  zero_row: bool = False, reported: Reported | None = None) -> tuple[list[tuple], list[tuple]]:
    """The rows that the outer query's WHERE keeps, in its order and cut to its LIMIT, with the columns it names
    (bare inner columns), each with its accuracy: picking released rows changes no value, so their intervals
    stand. `reported` gives a picked row the values it shows (measured apart from the choice), in whose order the
    picked rows then come. Where no row is kept and the outer query counts (`zero_row`: no report has the value),
    one row of zero counts, as COUNT(*) over no rows."""
    envs = [(dict(zip(names, row, strict=True)), dict(zip(names, acc, strict=True)))
            for row, acc in zip(rows, accuracy, strict=True)]
    found, kept_accuracy = project_released(outer_sql, envs, reported)
    if not found and zero_row:
        width = len(parse_select(outer_sql).expressions)
        return [(0,) * width], [(None,) * width]
    return found, kept_accuracy


def project_released(outer_sql: str, envs: Sequence[tuple[dict, dict]], reported: Reported | None = None
                     ) -> tuple[list[tuple], list[tuple]]:
    """The outer query's rows over released rows (each its values and their accuracy by column name): those its
    WHERE keeps, its SELECT list computed, in its ORDER BY (over the columns, its output names or positions), cut
    to its OFFSET and LIMIT; then, with `reported`, each kept row's shown values, re-sorted by them (the cut
    stands). A bare column keeps its interval; a value computed from noisy ones has none."""
    tree = parse_select(outer_sql)
    where = tree.args["where"].this if tree.args.get("where") else None
    kept = [(values, acc) for values, acc in envs if where is None or evaluate(where, values)]
    order = tree.args["order"].expressions if tree.args.get("order") else []
    outputs = [item.unalias() for item in tree.expressions]
    by_name = {output_name(item): value for item, value in zip(tree.expressions, outputs, strict=True)}
    terms = [_output_term(o.this, outputs, by_name, set()) for o in order]

    def value(pair: tuple, i: int) -> Any:
        return _plain(evaluate(terms[i], pair[0]))

    kept = _ordered_and_cut(tree, kept, value)
    if reported is not None:
        kept = [reported(values, acc) for values, acc in kept]
        sort_rows(kept, value, [(bool(o.args.get("desc")), bool(o.args.get("nulls_first"))) for o in order])
    return ([tuple(_plain(evaluate(o, values)) for o in outputs) for values, _ in kept],
            [tuple(acc.get(o.name) if isinstance(o, exp.Column) else None for o in outputs) for _, acc in kept])


def _ordered_and_cut(tree: exp.Select, rows: list, value_of: Callable[[Any, int], Any]) -> list:
    """`rows` in the outer query's ORDER BY (`value_of(row, i)`: a row's value of its i-th term), then cut to its
    OFFSET and LIMIT."""
    order = tree.args["order"].expressions if tree.args.get("order") else []
    sort_rows(rows, value_of, [(bool(o.args.get("desc")), bool(o.args.get("nulls_first"))) for o in order])
    offset = int(tree.args["offset"].expression.to_py()) if tree.args.get("offset") else 0
    limit = int(tree.args["limit"].expression.to_py()) if tree.args.get("limit") else None
    return rows[offset:None if limit is None else offset + limit]


def _aggregates(tree: exp.Select, members: list[tuple[dict, dict, dict]], noisy: set[str]) -> dict[str, Any]:
    """Each aggregate of the outer query over one group's rows (each its values shown, and with counts unclamped),
    under the name `_named` gives it. SUM and AVG read the unclamped counts, so they carry no clamp bias; MIN and
    MAX read the values shown, so a count's is never below 0; variances and standard deviations are the exact
    values' as estimated from the noisy ones (`_spread_estimate`)."""
    values = {}
    for node in tree.find_all(*AGGREGATE_KINDS):
        argument = node.this
        if isinstance(argument, exp.Star):
            values[_name(node)] = len(members)
            continue
        if isinstance(node, tuple(SPREADS)):
            read, variances = _spread_parts(argument, members, noisy)
            values[_name(node)] = _spread_estimate(type(node), read, variances)
            continue
        envs = [noisy if isinstance(node, (exp.Sum, exp.Avg)) else shown for shown, noisy, _ in members]
        seen = [v for v in (_plain(evaluate(argument, env)) for env in envs) if v is not None]
        if isinstance(node, exp.Count):
            values[_name(node)] = len(seen)
        elif not seen:
            values[_name(node)] = None
        else:
            values[_name(node)] = {exp.Sum: sum, exp.Avg: statistics.fmean, exp.Min: min, exp.Max: max}[
                type(node)](seen)
    return values


def _spread_parts(argument: exp.Expression, members: list[tuple[dict, dict, dict]],
                  noisy: set[str]) -> tuple[list[float], list[float] | None]:
    """A variance's argument over a group's released rows (counts unclamped, NULLs skipped), and the variance of
    each value's noise: a linear form of the row's noisy values, each drawn alone by one mechanism (their
    variances add); None where some value's noise variance is unknown (an average's, a randomized report's)."""
    read: list[float] = []
    variances: list[float] | None = []
    for shown, unclamped, acc in members:
        value = numeric_value(_plain(evaluate(argument, unclamped)))
        if value is None:
            continue
        read.append(value)
        terms = _linear(argument, lambda n, acc=acc: _noise_term(n, acc, noisy),
                        lambda n, shown=shown: _plain(evaluate(n, shown)))
        if terms is None or variances is None:
            variances = None
        else:
            variances.append(sum(c * c * acc[name].noise_variance for name, c in terms.items()))
    return read, variances


def _noise_term(node: exp.Expression, acc: dict, noisy: set[str]) -> dict | None:
    if not isinstance(node, exp.Column):
        return None
    own = acc.get(node.name)
    if own is not None and own.noise_variance is not None:
        return {node.name: 1.0}
    return None if node.name in noisy else {}


def _spread_estimate(kind: type, read: Sequence[float], variances: Sequence[float] | None) -> float | None:
    """A variance or standard deviation of the exact values behind `read` (noisy ones): the noisy values' sample
    variance overstates the exact values' by the mean of their noise variances, which is taken off (unbiased,
    then clamped at 0); where they are unknown, the noisy values' own. NULL as PostgreSQL's: over no rows, and
    a sample's over one."""
    population, root = SPREADS[kind]
    if not read or len(read) == 1 and not population:
        return None
    noise = math.fsum(variances) / len(read) if variances is not None else 0.0
    variance = max(float(_unbiased_variance(np.asarray(read, dtype=float), noise, population)), 0.0)
    return math.sqrt(variance) if root else variance


def _unbiased_variance(values: np.ndarray, noise: float, population: bool) -> np.ndarray:
    """The exact values' variance estimated from noisy `values` (along the last axis) whose noise variances
    average `noise`: for independent noise, E[Σ(y - ȳ)²] = Σ(x - x̄)² + (n - 1)·noise."""
    n = values.shape[-1]
    squares = ((values - values.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
    return (squares - (n - 1) * noise) / (n if population else n - 1)


def _spread_range(node: exp.Expression, members: list[tuple[dict, dict, dict]],
                  noisy: set[str]) -> tuple[float, float] | None:
    """A 95% interval for a variance or standard deviation over released rows (taken as given): how far the
    unbiased estimate moves from the released values' own variance when noise of each value's variance is drawn
    again over them, the 2.5 and 97.5 percentiles of that error taken off the estimate (a basic bootstrap), then
    clamped at 0. The draws are Laplace, the heaviest-tailed of our noise laws at a given variance, and they
    spread around the noisy values, which spread wider than the exact ones: both widen the interval. None where
    a noise variance is unknown or no value reads noise."""
    read, variances = _spread_parts(node.this, members, noisy)
    if _spread_estimate(type(node), read, variances) is None or variances is None or not any(variances):
        return None
    population, root = SPREADS[type(node)]
    values, noise = np.asarray(read, dtype=float), math.fsum(variances) / len(read)
    rng = np.random.default_rng(0)  # post-processing of released values only: the same interval every time
    draws = values + rng.laplace(0.0, 1.0, (SPREAD_DRAWS, len(read))) * np.sqrt(np.asarray(variances) / 2)
    # the estimate's error where the released values are the exact ones and noise is drawn over them again
    moved = _unbiased_variance(draws, noise, population) - _unbiased_variance(values, 0.0, population)
    middle = float(_unbiased_variance(values, noise, population))
    low = max(middle - float(np.percentile(moved, 97.5)), 0.0)
    high = max(middle - float(np.percentile(moved, 2.5)), 0.0)
    return (math.sqrt(low), math.sqrt(high)) if root else (low, high)


def _named(node: exp.Expression) -> exp.Expression:
    """`node` with each aggregate replaced by the column its value is kept under."""
    return node.transform(lambda n: exp.column(_name(n)) if isinstance(n, AGGREGATE_KINDS) else n)


def _name(node: exp.Expression) -> str:
    return f"dpsql_agg_{abs(hash(node.sql()))}"


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


__all__ = ["aggregate_released", "filtered_by_noise", "numeric_value", "outer_columns", "pick_released",
           "project_released", "uncorrected_spreads", "unwrapped"]
