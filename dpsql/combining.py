"""One answer from the answers of a statement's parts: a UNION's or GROUPING SETS' parts, scalar subqueries
answered first, an outer query over a subquery's released rows, a COUNT(DISTINCT c) over a declared domain. All of
it is post-processing of released answers."""

from __future__ import annotations

import datetime
import math
import operator
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlglot import exp

from dpsql.analysis.plan import Output
from dpsql.answer import Answer, without_interval
from dpsql.output import shown
from dpsql.postprocess import Accuracy, sort_rows
from dpsql.postprocess.evaluate import typed
from dpsql.prepared import Prepared
from dpsql.released_rows import (
    Reported,
    aggregate_released,
    computed_type,
    filtered_by_noise,
    numeric_value,
    outer_columns,
    pick_released,
    project_released,
    uncorrected_spreads,
    unwrapped,
)
from dpsql.sql import AGGREGATES
from dpsql.sql.compose import MERGED, MERGED_COLUMN, SCALAR, Composition
from dpsql.sql.parse import parse_statement


def stand_ins(composition: Composition, number: int, before: Sequence[Prepared]) -> dict[str, Any] | None:
    """Parameters of part `number` before the answers it takes exist: each scalar subquery's value as a constant
    of its type (`before`: the parts prepared so far, the scalar subqueries first), so the query the statement
    ends with is checked and priced before anything is charged (its bounds hold for any constant; `day > (SELECT
    MAX(day) …)` compares a date with a date)."""
    if not composition.sequential or number < composition.scalars:
        return None
    lists = dict(composition.key_lists)
    return {f"{SCALAR}{i}": [_no_key(lists[i])] if i in lists else _STAND_INS.get(before[i].outputs[0].type_name, 0)
            for i in range(composition.scalars)}


_STAND_INS = {"date": datetime.date(2000, 1, 1), "timestamp": datetime.datetime(2000, 1, 1),
              "timestamptz": datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC), "text": "", "bool": False}


def stand_in_row(outputs: Sequence[Output]) -> tuple:
    """A row of constants of the outputs' types (1 for a number), for running a query over released rows before
    there are any: what cannot run over that row is refused before anything is charged."""
    return tuple(_STAND_INS.get(output.type_name, 1) for output in outputs)


def scalar_values(composition: Composition, answers: list[Answer]) -> dict[str, Any]:
    """The parameters the last part of a sequential statement takes from the answers before it: each scalar
    subquery's one value (None for no row), or the list of a column's released values (a list holding only
    None where nothing was released: `k = ANY(NULL list)` keeps no row, as the join would)."""
    lists = dict(composition.key_lists)
    return {f"{SCALAR}{i}": ([_key(lists[i], row) for row in answer.rows] or [_no_key(lists[i])])
            if i in lists else (answer.rows[0][0] if answer.rows else None) for i, answer in enumerate(answers)}


def _key(columns: tuple[int, ...], row: tuple) -> Any:
    """A released row's key over `columns`: its one value, or a tuple of several (compared as a row value)."""
    return row[columns[0]] if len(columns) == 1 else tuple(row[c] for c in columns)


def _no_key(columns: tuple[int, ...]) -> Any:
    """The key no row has (`x = ANY(NULL list)` keeps none, as the join would): NULL, or a row of NULLs."""
    return None if len(columns) == 1 else (None,) * len(columns)


RELEASED_ROWS_NOTE = ("computed from the released rows of the subquery (post-processing): SUM and AVG of its counts "
                      "or sums, and their sums, differences, multiples and ratios, have 95% intervals that add up "
                      "their noise, the rows released taken as given, and so have their variances and standard "
                      "deviations, with the noise's own variance taken off; other values computed from them have "
                      "none")


def columns_of(parts: list[Prepared], composition: Composition | None = None) -> tuple[list[str], list[str],
                                                                                       list[bool]]:
    """The names, types and noisiness of a statement's columns: its first part's names; each column's type from
    the first part where it is not a NULL a grouping set put there; noisy where any part's is. After scalar
    subqueries, the last part's."""
    if composition is not None and composition.values_present is not None and composition.joined_outer is None:
        outputs = _outputs_of(composition, 0, parts[0])
        return [o.name for o in outputs], [o.type_name for o in outputs], [o.noisy for o in outputs]
    if composition is not None and composition.outer is not None:
        return outer_columns(composition.outer, parts[0].outputs)
    if composition is not None and composition.joined_outer is not None:
        return _joined_columns(composition, parts)
    if composition is not None and composition.sequential:
        parts = parts[-1:]
    if composition is not None and composition.booleans:
        names = [o.name for o in parts[0].outputs]
        decided = {i for i, _ in composition.booleans}
        return names, ["bool" if i in decided else o.type_name for i, o in enumerate(parts[0].outputs)], \
            [o.noisy for o in parts[0].outputs]
    outputs = [p.outputs for p in parts]
    names = [o.name for o in outputs[0]]
    types = [next((part[i].type_name for part in outputs if not isinstance(part[i].expr, exp.Null)),
                  outputs[0][i].type_name) for i in range(len(names))]
    noisy = [any(part[i].noisy for part in outputs) for i in range(len(names))]
    return names, types, noisy


def _outputs_of(composition: Composition, number: int, part: Prepared) -> list[Output]:
    """The columns part `number` gives the statement: its outputs, or where its counts are read as the values
    present (`Composition.values_part`), its keys and that count."""
    if composition.values_present is None or number != composition.values_part:
        return part.outputs
    return [*part.outputs[:composition.values_keys], Output(composition.values_present, exp.Null(), "int8", True)]


def combine(composition: Composition, parts: list[Prepared], answers: list[Answer]) -> Answer:
    """One answer from its parts' answers: their rows in order (UNION without ALL: each distinct row once), then
    the statement's ORDER BY, OFFSET and LIMIT; the cost is the sum of theirs. A COUNT(DISTINCT c) over a
    declared domain is counted from its part's rows (the statement's answer, or joined to the others')."""
    if composition.values_present is not None:
        values = composition.values_part
        counted = _values_present(composition, answers[values])
        if composition.joined_outer is None:
            return counted
        answers = [*answers[:values], counted, *answers[values + 1:]]
    names, types, noisy = columns_of(parts, composition)
    if composition.booleans:
        return _decided(composition.booleans, replace(answers[0], names=names, types=types, noisy=noisy))
    if composition.joined_outer is not None:  # released rows joined after noise: bare columns keep their intervals
        rows, accuracy = project_released(composition.joined_outer, joined_rows(composition, answers))
        notes = list(dict.fromkeys(note for answer in answers for note in answer.notes))
        explained = tuple(name for answer in answers for name in answer.explained)  # (values present: a note)
        return Answer(names, types, rows, accuracy, sum(a.epsilon for a in answers), sum(a.delta for a in answers),
                      all(a.cached for a in answers), answers[-1].budget, noisy, notes=notes, explained=explained)
    if composition.outer is not None and composition.picks:  # released rows picked: each keeps its intervals
        measured = answers[1] if composition.measured_apart else None
        rows, accuracy = pick_released(composition.outer, answers[0].names, answers[0].rows, answers[0].accuracy,
                                       composition.zero_row, _remeasured(composition.measured_apart, measured))
        notes = list(dict.fromkeys([*(n for a in answers for n in a.notes), *composition.notes]))
        return replace(answers[0], names=names, types=types, rows=rows, accuracy=accuracy, noisy=noisy, notes=notes,
                       epsilon=sum(a.epsilon for a in answers), delta=sum(a.delta for a in answers),
                       cached=all(a.cached for a in answers), budget=answers[-1].budget)
    if composition.outer is not None:  # post-processing of the inner answer's rows: sums carry their noise
        inner = answers[0]
        rows, accuracy = aggregate_released(composition.outer, inner.names, inner.rows, inner.accuracy, inner.noisy)
        notes, explained = [*inner.notes, RELEASED_ROWS_NOTE], ()
        uncorrected = uncorrected_spreads(composition.outer, inner.names, inner.rows, inner.accuracy, inner.noisy)
        if uncorrected:
            notes.append(f"{', '.join(dict.fromkeys(uncorrected))}: the released values' own spread, noise "
                         "included, which runs wider than the exact values' (their noise variance is not known "
                         "here: averages or randomized reports); a variance of counts or sums takes it off")
        picked = _picked_by_noise(composition.parts[0])
        if picked or filtered_by_noise(composition.outer, inner.names, inner.rows, inner.accuracy):
            explained = tuple(name for name, is_noisy in zip(names, noisy, strict=True) if is_noisy)
            accuracy = [tuple(None if is_noisy else a for a, is_noisy in zip(acc, noisy, strict=True))
                        for acc in accuracy]
            notes.append(f"{without_interval(explained)}: which released rows "
                         f"{'it reads' if len(explained) == 1 else 'they read'} is decided by noisy values "
                         f"({picked or 'the WHERE over them'}), and a row near the line could fall on either side, "
                         "which moves the result beyond its rows' own noise")
        rows = [tuple(typed(v, t) for v, t in zip(row, types, strict=True)) for row in rows]  # (AVG(n): numeric)
        return replace(inner, names=names, types=types, rows=rows, accuracy=accuracy, noisy=noisy, notes=notes,
                       explained=explained)
    shown = answers[-1:] if composition.sequential else answers
    rows = [(row, accuracy) for answer in shown for row, accuracy in zip(answer.rows, answer.accuracy, strict=True)]
    if composition.distinct:
        seen: set = set()
        rows = [r for r in rows if not (repr(r[0]) in seen or seen.add(repr(r[0])))]
    columns = [column for column, _, _ in composition.order]
    sort_rows(rows, lambda row, i: row[0][columns[i]], [(d, n) for _, d, n in composition.order])
    end = None if composition.limit is None else composition.offset + composition.limit
    rows = rows[composition.offset:end]
    notes = list(dict.fromkeys(note for answer in answers for note in answer.notes))  # the scalars' too
    from_scalars = composition.computed_from_scalars()  # an interval of the outer step alone would say too little
    if from_scalars:
        repeated = {i: answers[which].accuracy[0][0] if answers[which].accuracy else None
                    for i, which in from_scalars.items() if which is not None}
        outputs = parse_statement(composition.parts[-1]).expressions
        scalars = {f"{SCALAR}{i}": (answer.rows[0][0] if answer.rows else None,
                                    answer.accuracy[0][0] if answer.accuracy else None)
                   for i, answer in enumerate(answers[:composition.scalars])}
        rows = [(row, tuple(repeated[i] if i in repeated else
                            _through_scalars(outputs[i].unalias(), row[i], a, scalars) if i in from_scalars else a
                            for i, a in enumerate(accuracy))) for row, accuracy in rows]
    explained: tuple[str, ...] = ()
    moved = composition.scalars_read_beside_outputs()
    if moved:  # the outer step's intervals hold for the rows its filter kept at the released value, not the truth's
        kept = set(from_scalars)
        explained = tuple(name for i, name in enumerate(names) if noisy[i] and i not in kept)
        rows = [(row, tuple(None if noisy[i] and i not in kept else a for i, a in enumerate(accuracy)))
                for row, accuracy in rows]
        notes.append(_moved_note(explained, [answers[i] for i in moved]))
    return Answer(names, types, [r[0] for r in rows], [r[1] for r in rows], sum(a.epsilon for a in answers),
                  sum(a.delta for a in answers), all(a.cached for a in answers), answers[-1].budget, noisy,
                  notes=notes, explained=explained)


def _picked_by_noise(inner_sql: str) -> str | None:
    """What of a grouped query keeps its rows by their noisy values: its HAVING, or its ORDER BY with a LIMIT,
    where they read an aggregate (a key read there is exact)."""
    tree = parse_statement(inner_sql)
    noisy = [e for e in tree.expressions if e.find(*AGGREGATES)]
    names, places = {e.alias_or_name for e in noisy}, {str(tree.expressions.index(e) + 1) for e in noisy}

    def noisy_term(term: exp.Expression) -> bool:
        return (term.find(*AGGREGATES) is not None or any(c.name in names for c in term.find_all(exp.Column))
                or isinstance(term, exp.Literal) and term.this in places)
    if tree.args.get("having") and noisy_term(tree.args["having"].this):
        return "the subquery's HAVING"
    order = tree.args["order"].expressions if tree.args.get("order") else []
    if tree.args.get("limit") and any(noisy_term(o.this) for o in order):
        return "the subquery's ORDER BY and LIMIT"
    return None


def _moved_note(names: Sequence[str], scalars: Sequence[Answer]) -> str:
    """What an answer filtered by a subquery's noisy value says of its missing intervals."""
    values = ", ".join(f"{answer.names[0]} = {shown(answer.rows[0][0], answer.accuracy[0][0])}" if answer.rows
                       else answer.names[0] for answer in scalars)
    return (f"{without_interval(names)}: the query keeps its rows by a subquery's noisy value ({values}), and that "
            "value's noise moves which rows are kept, beyond what the interval of the rows kept would cover; to see "
            "each part's uncertainty, ask for the subquery's value alone, then use it as a constant")


_OPERATIONS = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul, exp.Div: operator.truediv}


def _through_scalars(output: exp.Expression, value: Any, accuracy: Accuracy | None,
                     scalars: dict[str, tuple[Any, Accuracy | None]]) -> Accuracy | None:
    """`_through_scalar`, or no interval where its arithmetic fails (an overflow): the answer is charged and
    released by now, and an interval it cannot give is said to be missing rather than lose the answer."""
    try:
        return _through_scalar(output, value, accuracy, scalars)
    except ArithmeticError:
        return None


def _through_scalar(output: exp.Expression, value: Any, accuracy: Accuracy | None,
                    scalars: dict[str, tuple[Any, Accuracy | None]]) -> Accuracy | None:
    """The 95% interval of an output computed from scalar subqueries' noisy values and the outer query's, as
    a + b, a - b, a · b or a / b, each side a subquery's value or the outer query's (`COUNT(*) * 100.0 /
    (SELECT COUNT(*) …)`, `AVG(income) - (SELECT AVG(income) …)`, `(SELECT …)::float / (SELECT …)`). The values
    are released by separate mechanisms, so their noise is independent: each side of the interval is the root
    of the sum of the squares of how far each value moves the output there, within its own interval, the other
    held at its released value (the outer query's within the output's own interval, computed at the released
    subquery's value); exact for sums of Gaussian noise, first order for a ratio. None for any other form, where
    a value has no interval, or where a divisor's interval reaches 0."""
    node = unwrapped(output)
    if type(node) not in _OPERATIONS or value is None:
        return None
    sides = [unwrapped(node.this), unwrapped(node.expression)]
    known = [scalars.get(side.name) if isinstance(side, exp.Placeholder) else None for side in sides]
    outer = [i for i, k in enumerate(known) if k is None]
    exact = bool(outer) and sides[outer[0]].find(exp.Column, exp.AggFunc) is None  # a constant: (SELECT …) / 8
    if (any(sides[i].find(exp.Placeholder) is not None for i in outer) or len(outer) == 2
            or any(k is not None and (k[0] is None or k[1] is None or k[1].ci_low is None) for k in known)
            or outer and not exact and (accuracy is None or accuracy.ci_low is None)):
        return None  # a subquery inside a function, none at all, or a value without an interval
    kind, e, operation = type(node), numeric_value(value), _OPERATIONS[type(node)]
    if e is None or any(k is not None and numeric_value(k[0]) is None for k in known):
        return None  # a date, a text: no interval of this kind
    if kind is exp.Div and known[1] is not None and known[1][1].ci_low <= 0 <= known[1][1].ci_high:
        return None
    values = [numeric_value(k[0]) if k is not None else 0.0 for k in known]
    if outer:  # the outer query's value, read back from the output at the subquery's released value
        values[outer[0]] = _solved(kind, e, values[1 - outer[0]], outer[0] == 0)
        if values[outer[0]] is None:
            return None
    downs, ups = [], []
    for i, k in enumerate(known):
        if k is None:
            moved = [0.0] if exact else [accuracy.ci_low - e, accuracy.ci_high - e]
        else:
            moved = [operation(*(end if j == i else v for j, v in enumerate(values))) - e
                     for end in (k[1].ci_low, k[1].ci_high)]
        downs.append(max(0.0, -min(moved)))
        ups.append(max(0.0, max(moved)))
    return Accuracy(None, e - math.hypot(*downs), e + math.hypot(*ups))


def _solved(kind: type, e: float, other: float, first: bool) -> float | None:
    """x such that x op other = e (`first`) or other op x = e; None where no finite one is read back."""
    if kind is exp.Add:
        return e - other
    if kind is exp.Sub:
        return e + other if first else other - e
    if kind is exp.Mul:
        return e / other if other else None
    return e * other if first else (other / e if e else None)


def _remeasured(keys: tuple[str, ...], measured: Answer | None) -> Reported | None:
    """A picked row's values and accuracy with the measured columns read from the second answer of the same groups
    (by the key columns): apart from the noise that chose the row. A group the second answer did not release (its
    own partition selection) has NULL there."""
    if measured is None:
        return None
    index = [measured.names.index(k) for k in keys]
    found = {tuple(row[i] for i in index): (dict(zip(measured.names, row, strict=True)),
                                            dict(zip(measured.names, acc, strict=True)))
             for row, acc in zip(measured.rows, measured.accuracy, strict=True)}
    others = [n for n in measured.names if n not in keys]

    def reported(values: dict, accuracy: dict) -> tuple[dict, dict]:
        again = found.get(tuple(values[k] for k in keys))
        new_values = {**values, **{n: again[0][n] if again else None for n in others}}
        return new_values, {**accuracy, **{n: again[1][n] if again else None for n in others}}
    return reported


def _decided(booleans: tuple[tuple[int, bool], ...], counts: Answer) -> Answer:
    """bool_or(x) from the noisy count of the rows that hold x: true where its 95% interval lies above zero, false
    where it lies below one, NULL where the noise cannot tell; bool_and(x) and every(x) likewise from the count
    of the rows that fail x (post-processing)."""
    rows, accuracy = [], []
    for row, intervals in zip(counts.rows, counts.accuracy, strict=True):
        row, intervals = list(row), list(intervals)
        for i, every in booleans:
            interval = intervals[i]
            low, high = (row[i], row[i]) if interval is None or interval.ci_low is None else (
                interval.ci_low, interval.ci_high)  # exact where it has no interval (public tables)
            some = True if low is not None and low > 0 else False if high is not None and high < 1 else None
            row[i], intervals[i] = (None if some is None else not some) if every else some, None
        rows.append(tuple(row))
        accuracy.append(tuple(intervals))
    spelled = ", ".join(counts.names[i] for i, _ in booleans)
    note = (f"{spelled}: read off a noisy count of the rows that hold the condition (bool_or) or fail it (bool_and, "
            "every): decided where its 95% interval lies above zero (or below one), NULL where the noise cannot "
            "tell a few rows from none")
    return replace(counts, rows=rows, accuracy=accuracy, notes=[*counts.notes, note],
                   explained=tuple(counts.names[i] for i, _ in booleans))


def _values_present(composition: Composition, counts: Answer) -> Answer:
    """COUNT(DISTINCT c) over a declared domain, from the noisy count of units per declared value (and group of the
    keys before it): the values whose 95% interval lies above zero (post-processing). A value held by a few units
    may be missed; a value held by none is counted with probability about 2.5%. Its interval is `_present_range`."""
    keys = composition.values_keys
    cells: dict[tuple, list[tuple[Any, Accuracy | None]]] = {}
    for row, accuracy in zip(counts.rows, counts.accuracy, strict=True):
        cells.setdefault(tuple(row[:keys]), []).append((row[keys + 1], accuracy[keys + 1]))
    if not keys:
        cells = {(): cells.get((), [])}
    rows = [(*k, sum(a is not None and (a.ci_low or 0) > 0 for _, a in found)) for k, found in cells.items()]
    sort_rows(rows, lambda row, i: row[composition.order[i][0]], [(d, n) for _, d, n in composition.order])
    end = None if composition.limit is None else composition.offset + composition.limit
    rows = rows[composition.offset:end]
    accuracy = [(None,) * keys + (_present_range(cells[tuple(row[:keys])]),) for row in rows]
    note = ("counted as present: the declared values whose noisy count of units has a 95% interval above zero "
            f"(each count ±{_halfwidth(counts, keys + 1):.3g}); values held by fewer units may be missed, so the count "
            "leans low; its interval runs from the values surely present to those that may be, every count's "
            "interval widened so that all of them hold together 95% of the time")
    return replace(counts, names=[*counts.names[:keys], composition.values_present],
                   types=[*counts.types[:keys], "int8"], rows=rows, accuracy=accuracy,
                   noisy=[False] * keys + [True], explained=(composition.values_present,),
                   notes=[*counts.notes, note])


def _present_range(cells: list[tuple[Any, Accuracy | None]]) -> Accuracy | None:
    """A 95% interval for how many of a group's values are present, from each value's noisy count of units: each
    count's Laplace interval widened to hold with probability 1 − 5%/m over the group's m values (b·ln(20m), not
    b·ln 20), so that all hold together at least 95% of the time (Bonferroni); then at least the values whose count
    is surely above 0 are present, and at most those whose count may reach 1. None where a count has no Laplace
    scale (the Gaussian mechanism)."""
    if not cells or any(a is None or a.scale is None or a.ci_low is None for _, a in cells):
        return None
    widen = math.log(len(cells))
    least = most = 0
    for value, accuracy in cells:
        noisy = accuracy.unclamped if accuracy.unclamped is not None else float(value)
        half = (accuracy.halfwidth if accuracy.halfwidth is not None else (accuracy.ci_high - accuracy.ci_low) / 2) \
            + accuracy.scale * widen
        least += noisy - half > 0  # (a count is a whole number: above 0 is at least 1)
        most += noisy + half >= 1
    return Accuracy(None, float(least), float(most))


def _halfwidth(counts: Answer, column: int) -> float:
    accuracy = next((a[column] for a in counts.accuracy if a[column] is not None and a[column].ci_high is not None),
                    None)
    return 0.0 if accuracy is None else (accuracy.ci_high - accuracy.ci_low) / 2


def joined_rows(composition: Composition, answers: Sequence[Answer]) -> list[tuple[dict, dict]]:
    """The parts' released rows joined as the statement joins them (`Composition.joins`): each joined row's values
    and accuracy by the names the statement's outer query reads (dpsql_j<part>_<column>). NULL keys match nothing,
    as SQL's equality; an outer join keeps the rows of its preserved side (LEFT: the rows joined so far, RIGHT: the
    next part's, FULL: both) that nothing matches, with NULLs for the other side. Each row also holds each join
    column as PostgreSQL merges a USING column (dpsql_m_<column>: the left side's, the right's for RIGHT, the one
    not NULL for FULL), which a later join's USING (MERGED) and the outer query's unqualified name read."""
    def named(number: int, answer: Answer) -> list[tuple[dict, dict]]:
        return [({f"dpsql_j{number}_{n}": v for n, v in zip(answer.names, row, strict=True)},
                 {f"dpsql_j{number}_{n}": a for n, a in zip(answer.names, acc, strict=True)})
                for row, acc in zip(answer.rows, answer.accuracy, strict=True)]

    def left_key(values: dict, left: int, column: str) -> Any:
        return values.get(f"{MERGED_COLUMN}{column}") if left == MERGED else values[f"dpsql_j{left}_{column}"]

    def with_merged(values: dict, acc: dict, side: str, pairs: tuple) -> tuple[dict, dict]:
        merged = {}
        for left, column, right, other in pairs:
            mine, theirs = left_key(values, left, column), values[f"dpsql_j{right}_{other}"]
            merged[f"{MERGED_COLUMN}{column}"] = theirs if side == "RIGHT" or mine is None and side == "FULL" \
                else mine
        return {**values, **merged}, {**acc, **dict.fromkeys(merged)}

    joined = named(0, answers[0])
    for number, (side, pairs) in enumerate(composition.joins, start=1):
        right = named(number, answers[number])
        index: dict[tuple, list[int]] = {}
        for position, (values, _) in enumerate(right):
            key = tuple(values[f"dpsql_j{number}_{c}"] for _, _, _, c in pairs)
            if None not in key:
                index.setdefault(key, []).append(position)
        empty = dict.fromkeys(f"dpsql_j{number}_{n}" for n in answers[number].names)
        empty_before = dict.fromkeys(f"dpsql_j{i}_{n}" for i in range(number) for n in answers[i].names)
        found, matched = [], set()
        for values, acc in joined:
            key = tuple(left_key(values, left, c) for left, c, _, _ in pairs)
            matches = index.get(key, []) if None not in key else []
            matched.update(matches)
            found += [({**values, **right[m][0]}, {**acc, **right[m][1]}) for m in matches]
            if not matches and side in ("LEFT", "FULL"):
                found.append(({**values, **empty}, {**acc, **empty}))
        if side in ("RIGHT", "FULL"):
            found += [({**empty_before, **v}, {**empty_before, **a}) for position, (v, a) in enumerate(right)
                      if position not in matched]
        joined = [with_merged(values, acc, side, pairs) for values, acc in found]
    return joined


def check_joined(composition: Composition, parts: Sequence[Prepared]) -> None:
    """The joined statement's outer query over one stand-in row of each part's types: what cannot be computed
    after noise raises here, before any charge."""
    kinds = _joined_kinds(composition, parts)
    project_released(composition.joined_outer, [({name: _STAND_INS.get(o.type_name, 1) for name, o in kinds.items()},
                                                 {})])


def _joined_kinds(composition: Composition, parts: Sequence[Prepared]) -> dict[str, Any]:
    """Each column of the joined rows by its name (`joined_rows`): the parts' outputs, and each merged join column
    as the joined part's output."""
    kinds = {f"dpsql_j{i}_{o.name}": o for i, part in enumerate(parts) for o in _outputs_of(composition, i, part)}
    for _, pairs in composition.joins:
        kinds.update({f"{MERGED_COLUMN}{column}": kinds[f"dpsql_j{right}_{other}"]
                      for _, column, right, other in pairs})
    return kinds


def _joined_columns(composition: Composition, parts: list[Prepared]) -> tuple[list[str], list[str], list[bool]]:
    """A joined statement's columns: a bare column keeps its part's type and noisiness; a value computed after
    noise is a double, noisy where any column it reads is."""
    kinds = _joined_kinds(composition, parts)
    names, types, noisy = [], [], []
    for item in parse_statement(composition.joined_outer).expressions:
        value = item.unalias()
        read = [kinds[c.name] for c in value.find_all(exp.Column)]
        names.append(item.alias_or_name)
        types.append(computed_type(value, {name: o.type_name for name, o in kinds.items()}))
        noisy.append(any(o.noisy for o in read))
    return names, types, noisy
