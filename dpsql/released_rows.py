"""Aggregates over released rows: `SELECT AVG(n), MAX(n) FROM (SELECT k, COUNT(*) AS n ... GROUP BY k) t` is the
inner query's noisy answer, then the outer query computed over its released rows in Python (post-processing: it
costs nothing more and reads no data). The outer query may filter (WHERE), group, aggregate (COUNT, SUM, AVG,
MIN, MAX), filter groups (HAVING), order and limit, over the inner query's output columns only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from sqlglot import exp

from dpsql.postprocess import Accuracy, evaluate, sort_rows
from dpsql.sql.parse import parse_select
from dpsql.sql.query import output_name

Reported = Callable[[dict, dict], tuple[dict, dict]]  # a picked row's values and accuracy -> those it shows

AGGREGATE_KINDS = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def outer_columns(outer_sql: str, inner_names: Sequence[str], inner_types: Sequence[str]) -> tuple[list[str],
                                                                                                  list[str]]:
    """The outer query's column names and types, known before anything runs: a COUNT is int8, a bare inner
    column keeps its type, anything else is float8."""
    tree = parse_select(outer_sql)
    kinds = dict(zip(inner_names, inner_types, strict=True))
    names, types = [], []
    for item in tree.expressions:
        value = item.unalias()
        names.append(output_name(item))
        types.append("int8" if isinstance(value, exp.Count) else
                     kinds.get(value.name, "float8") if isinstance(value, exp.Column) else "float8")
    return names, types


def aggregate_released(outer_sql: str, names: Sequence[str], rows: Sequence[tuple],
                       accuracy: Sequence[tuple] | None = None) -> tuple[list[tuple], list[tuple]]:
    """The outer query's rows over `rows` (the inner answer's, with column `names` and each value's `accuracy`),
    each value with its accuracy. A count shown as 0 enters SUM and AVG as its noisy value
    (`Accuracy.unclamped`): a sum of clamped counts would run high. Filters and keys read the values shown. A
    bare SUM or AVG of a column whose values each carry noise of their own has an interval: the root of the sum
    of their squared half-widths (the released rows it reads taken as given; exact for Gaussian noise, and wider
    than 95% needs for a sum of several Laplace draws); other outputs have none."""
    tree = parse_select(outer_sql)
    accuracy = accuracy or [(None,) * len(names)] * len(rows)
    members = [(dict(zip(names, row, strict=True)), dict(zip(names, _unclamped(row, acc), strict=True)),
                dict(zip(names, acc, strict=True))) for row, acc in zip(rows, accuracy, strict=True)]
    if tree.args.get("where"):
        members = [m for m in members if evaluate(tree.args["where"].this, m[0])]
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
        env = {**(group[0][0] if group else {}), **_aggregates(tree, group)}
        if having is not None and not evaluate(_named(having), env):
            continue
        values = tuple(_plain(evaluate(_named(o), env)) for o in outputs)
        intervals = tuple(_interval(o, value, group) for o, value in zip(outputs, values, strict=True))
        found.append((values, intervals, [_plain(evaluate(_named(o), env)) for o in order]))
    found = _ordered_and_cut(tree, found, lambda row, i: row[2][i])
    return [values for values, _, _ in found], [intervals for _, intervals, _ in found]


def _interval(output: exp.Expression, value: Any, group: list[tuple[dict, dict, dict]]) -> Accuracy | None:
    """A bare SUM or AVG of a noisy column's 95% interval: its rows' noise added up (see `aggregate_released`)."""
    if not isinstance(output, (exp.Sum, exp.Avg)) or not isinstance(output.this, exp.Column) or value is None:
        return None
    name = output.this.name
    read = [acc.get(name) for shown, _, acc in group if shown.get(name) is not None]
    if not read or any(a is None or a.halfwidth is None for a in read):
        return None
    halfwidth = math.sqrt(sum(a.halfwidth ** 2 for a in read)) / (len(read) if isinstance(output, exp.Avg) else 1)
    return Accuracy(None, value - halfwidth, value + halfwidth)


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


def _aggregates(tree: exp.Select, members: list[tuple[dict, dict, dict]]) -> dict[str, Any]:
    """Each aggregate of the outer query over one group's rows (each its values shown, and with counts unclamped),
    under the name `_named` gives it. SUM and AVG read the unclamped counts, so they carry no clamp bias; MIN and
    MAX read the values shown, so a count's is never below 0."""
    values = {}
    for node in tree.find_all(*AGGREGATE_KINDS):
        argument = node.this
        if isinstance(argument, exp.Star):
            values[_name(node)] = len(members)
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


def _named(node: exp.Expression) -> exp.Expression:
    """`node` with each aggregate replaced by the column its value is kept under."""
    return node.transform(lambda n: exp.column(_name(n)) if isinstance(n, AGGREGATE_KINDS) else n)


def _name(node: exp.Expression) -> str:
    return f"dpsql_agg_{abs(hash(node.sql()))}"


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


__all__ = ["aggregate_released", "outer_columns", "pick_released", "project_released"]
