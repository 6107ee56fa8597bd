"""Compose: statements that are several DP answers in one — `UNION [ALL]` of SELECTs, `GROUP BY` with
`GROUPING SETS`, `ROLLUP` or `CUBE` (one grouped SELECT per grouping set, the keys a set leaves out as NULL, as
PostgreSQL returns them), and scalar subqueries (`WHERE income > (SELECT AVG(income) FROM people)`: the
subquery is answered first, and its noisy value is a constant of the outer query), and a join to a grouped
subquery's keys (Superset's series limit: the subquery's released keys first, then the query kept to them). Each
part is an ordinary query, analysed, noised and charged on its own; the statement costs the sum of its parts.
ORDER BY, LIMIT and OFFSET of the whole statement, and UNION's removal of duplicate rows, act on the released rows
only.

Some statements are one ordinary query and post-processing of its answer: an aggregate over a grouped
subquery's released rows, COUNT(DISTINCT c) of a declared domain, bool_or / bool_and read off noisy counts, and
the count of one value of a locally randomized column picked from the counts per value.

A COUNT(DISTINCT x) beside other aggregates, where one race of rows per unit would bound them all, is asked apart
over the keys they release and joined to them (`_distinct_counted_apart`; the engine asks for it, from the plan).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.schema import PrivacySchema, Table
from dpsql.sql.bind import bind_parameters
from dpsql.sql.cohorts import correlated_cohorts_as_in, correlated_values_as_joins
from dpsql.sql.parse import parse_statement, set_operation_refused
from dpsql.sql.query import (
    AGGREGATES,
    indicator_of,
    limit_clause,
    operands,
    output_name,
    to_sql,
    value_asked,
)
from dpsql.sql.shape import (
    READS,
    constant_subqueries_inlined,
    count_of_distinct_rows,
    distinct_as_group_by,
    fetch_as_limit,
    inline_ctes,
    one_row_ctes_inlined,
    tables_read,
    totals_as_windows,
)

MAX_PARTS = 16  # CUBE of four keys; each part gets 1/n of the statement's ε


@dataclass(frozen=True)
class Composition:
    parts: list[str]  # each a plain SELECT, in the order its rows come
    description: str  # for explain: what the statement was split into
    distinct: bool = False  # UNION without ALL: a row released twice is returned once
    order: tuple[tuple[int, bool, bool], ...] = ()  # (output column, descending, nulls first) over all rows
    limit: int | None = None
    offset: int = 0
    scalars: int = 0  # the first `scalars` parts are scalar subqueries whose values the last part takes as
    # parameters %(dpsql_scalar_<i>)s; the statement's rows are the last part's
    key_lists: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (scalar part, columns): that part's parameter is
    # the list of the columns' released values (tuples of several), not its one value (`_joined_to_released_keys`)
    values_present: str | None = None  # COUNT(DISTINCT c) of a declared domain, as this output's name: the one
    # part counts units per declared value, and the answer is how many values are surely present
    values_keys: int = 0  # ... per group of the first `values_keys` columns (GROUP BY k, COUNT(DISTINCT c))
    values_part: int = 0  # ... read from this part's counts (the rest joined to them: `_distinct_counted_apart`)
    outer: str | None = None  # an aggregate query over the one part's released rows (`released_rows`)
    picks: bool = False  # the outer query only picks released rows and columns: their intervals stand
    zero_row: bool = False  # picked counts: where no row is picked, one row of zeros (COUNT(*) over no rows)
    notes: tuple[str, ...] = ()  # said with the answer
    # grouped queries joined on their columns: (side, ((left part, column, right part, column), ...)) for each join
    # of the next part; `joined_outer` the statement's SELECT over the joined rows, each part's column `c` named
    # dpsql_j<part>_c (`released_rows.project_released`)
    joins: tuple[tuple[str, tuple[tuple[int, str, int, str], ...]], ...] = ()
    joined_outer: str | None = None
    measured_apart: tuple[str, ...] = ()  # picks: the key columns by which each picked row's values are read from
    # the second part, the same groups answered again apart from the choice the first part's values made
    booleans: tuple[tuple[int, bool], ...] = ()  # (column, every): bool_or / bool_and read off the one part's
    # noisy count of the rows that hold (bool_or) or fail (bool_and, every) the condition (`combining`)
    rows_per_unit: int | None = None  # the most rows of each unit the values part keeps, below the declared
    # bound: a presence count reads one row a unit (`_values_present`)

    @property
    def sequential(self) -> bool:
        return self.scalars > 0

    def rows_of(self, part: int) -> int | None:
        """The most rows of each unit part `part` keeps below the declared bound, where the statement says."""
        return self.rows_per_unit if part == self.values_part else None

    def scalars_read_beside_outputs(self) -> list[int]:
        """The scalar subqueries whose noisy values the last part reads outside its outputs, in a filter, a join or
        a key (`WHERE income > (SELECT AVG(income) …)`): the rows it counts move with their noise, which its
        outputs' intervals do not carry. A list of released keys (`key_lists`) that the last part groups by only
        picks the groups shown, each with its own interval, so it is not one of them; one it does not group by
        (`SELECT COUNT(*) … WHERE k = ANY(the keys)`) is."""
        if not self.sequential:
            return []
        tree = parse_statement(self.parts[-1])
        outputs = {id(node) for item in tree.expressions for node in item.walk()}
        aliases = {e.alias: e.this for e in tree.expressions if isinstance(e, exp.Alias)}
        grouped = {to_sql(_resolved(k, aliases, tree.expressions))
                   for k in (tree.args["group"].expressions if tree.args.get("group") else [])}
        lists = {part for part, _ in self.key_lists}
        moved = set()
        for placeholder in tree.find_all(exp.Placeholder):
            if not placeholder.name.startswith(SCALAR) or id(placeholder) in outputs:
                continue
            part = int(placeholder.name[len(SCALAR):])
            compared = placeholder.find_ancestor(exp.EQ)
            keys = [] if compared is None else \
                compared.this.expressions if isinstance(compared.this, exp.Tuple) else [compared.this]
            if part not in lists or not keys or not all(to_sql(key.unnest()) in grouped for key in keys):
                moved.add(part)
        return sorted(moved)

    def computed_from_scalars(self) -> dict[int, int | None]:
        """The output columns of the last part whose values come from a scalar subquery's noisy value, rather
        than being filtered by one: each with the subquery it repeats as it is (`(SELECT COUNT(*) ...) AS n`,
        whose interval is the subquery's), or None where it is computed from one (`COUNT(*) / (SELECT ...)`,
        whose interval the outer step's alone would miss)."""
        if not self.sequential:
            return {}
        outputs = parse_statement(self.parts[-1]).expressions
        found = {}
        for i, output in enumerate(outputs):
            if any(p.name.startswith(SCALAR) for p in output.find_all(exp.Placeholder)):
                bare = output.unalias()
                while isinstance(bare, exp.Cast | exp.Paren):
                    bare = bare.this
                found[i] = int(bare.name[len(SCALAR):]) if isinstance(bare, exp.Placeholder) else None
        return found


def compose(sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None,
            schema: PrivacySchema | None = None,
            not_null: frozenset[tuple[str, str]] = frozenset(),
            unique: frozenset[tuple[str, str]] = frozenset(), distinct_apart: bool = False,
            keys_selected: bool = False) -> Composition | None:
    """The parts of a UNION or a GROUPING SETS / ROLLUP / CUBE statement or of scalar subqueries, or the one
    query behind a post-processed statement (the module's docstring); None for any other statement (which the
    ordinary stages check, and refuse if they must). `not_null` and `unique`: the (table, column) pairs the
    catalog declares NOT NULL, and unique. `distinct_apart`: only the statement's one COUNT(DISTINCT x) answered
    apart from its other aggregates (`_distinct_counted_apart`), whose groups DP partition selection releases
    where `keys_selected`."""
    if distinct_apart:
        tree = parse_statement(sql)
        return _distinct_counted_apart(bind_parameters(tree, params), schema, not_null if keys_selected else None) \
            if isinstance(tree, exp.Select) and schema is not None else None
    distinct = schema is not None and "DISTINCT" in sql.upper()
    if not (_may_compose(sql) or distinct or _may_read_reports(sql, schema)):  # most statements: spare a parse
        return None
    try:
        tree = fetch_as_limit(parse_statement(sql))
    except Exception:  # noqa: BLE001 - a statement that does not parse is the ordinary stages' to report
        return None
    if isinstance(tree, exp.Select):  # a WITH query's total over its own rows: a window, no part of its own; a
        tree = one_row_ctes_inlined(totals_as_windows(tree))  # WITH query's one aggregate row: a scalar subquery
        tree = constant_subqueries_inlined(tree)  # (SELECT <a constant>): the constant
    if distinct and isinstance(tree, exp.Select):  # (also as a count of a subquery's distinct rows)
        found = _values_present(count_of_distinct_rows(tree.copy()), schema, params)
        if found is not None:
            return found
    if isinstance(tree, exp.SetOperation):
        return _set_operation(bind_parameters(tree, params))
    group = tree.args.get("group")
    if isinstance(tree, exp.Select) and group and any(isinstance(e, GROUPINGS) for e in group.expressions):
        return _grouping_sets(bind_parameters(tree, params), schema)
    if isinstance(tree, exp.Select) and _scalar_subqueries(correlated_values_as_joins(correlated_cohorts_as_in(
            tree.copy()))):
        return _sequential(bind_parameters(tree, params))
    if isinstance(tree, exp.Select) and schema is not None:
        found = _released_keys_excluded(bind_parameters(tree, params), schema)
        if found is not None:
            return found
        tree = _released_keys_as_join(tree, schema)
    if isinstance(tree, exp.Select) and schema is not None and tree.args.get("joins"):
        found = _joined_to_released_keys(bind_parameters(tree, params), schema)
        if found is not None:
            return found
    if isinstance(tree, exp.Select) and any(_boolean_of(e.unalias()) for e in tree.expressions):
        return _booleans(bind_parameters(tree, params))
    if isinstance(tree, exp.Select) and schema is not None:
        bound = bind_parameters(tree, params)
        return (_over_released(bound, schema, unique & not_null) or _picked_after_windows(bound, schema)
                or _joined_released(bound, schema) or _count_of_reported_value(bound, schema)
                or _aggregates_of_reports(bound, schema, not_null))
    return None


def _over_released(tree: exp.Select, schema: PrivacySchema,
                   keys: frozenset[tuple[str, str]] = frozenset()) -> Composition | None:
    """`SELECT AVG(n) FROM (SELECT k, COUNT(*) AS n FROM t GROUP BY k) s`: an aggregate of the released rows of a
    grouped query that is not grouped by the unit (that one bounds a unit's contributions, and the analysis
    answers it): the inner query is the one part, the outer one post-processing of its rows. The inner query
    may filter, order and cut its groups (HAVING, ORDER BY, LIMIT): answered alone, it releases those rows. Also
    as a WITH query (`WITH monthly AS (…) SELECT AVG(s) FROM monthly`)."""
    tree = inline_ctes(tree.copy(), read_once=True) if tree.args.get("with_") else tree
    source = tree.args["from_"].this if tree.args.get("from_") else None
    inner = source.this if isinstance(source, exp.Subquery) else None
    if isinstance(inner, exp.Select) and inner.args.get("distinct"):  # SELECT DISTINCT k: its GROUP BY k
        inner = distinct_as_group_by(inner.copy())
    if (not isinstance(inner, exp.Select) or not inner.args.get("group") or tree.args.get("joins")
            or tree.args.get("with_") or not any(e.find(*AGGREGATES) for e in tree.expressions)
            or tree.find(exp.Window) or any(e.find(exp.Subquery) for e in tree.expressions)):
        return None
    if _groups_by_unit(inner, schema, keys):
        return None  # per unit, or per group within a unit: the analysis bounds it
    names = [output_name(e) for e in inner.expressions]
    outer = tree.copy()
    outer.set("from_", None)
    used = {c.name for c in outer.find_all(exp.Column)}
    if (not used <= set(names) or any(isinstance(e, exp.Star) for e in outer.expressions)
            or any(isinstance(n, exp.Subquery | exp.Exists | exp.Select) for n in outer.walk() if n is not outer)):
        return None
    return Composition([to_sql(inner)], "an aggregate of the released rows of a grouped query", outer=to_sql(outer))


def _picked_after_windows(tree: exp.Select, schema: PrivacySchema) -> Composition | None:
    """`SELECT k, c, n FROM (SELECT k, c, COUNT(*) AS n, ROW_NUMBER() OVER (PARTITION BY k ORDER BY COUNT(*) DESC)
    AS rn FROM t GROUP BY k, c) s WHERE rn <= 3` (the top rows of each group; also as a WITH query): PostgreSQL has
    no filter on a window's values, so analysts filter outside. The inner query is answered with its window over
    the released rows; the outer one picks released rows and columns, each value with its interval."""
    tree = inline_ctes(tree.copy(), read_once=True) if tree.args.get("with_") else tree
    source = tree.args["from_"].this if tree.args.get("from_") else None
    inner = source.this if isinstance(source, exp.Subquery) else None
    if (not isinstance(inner, exp.Select) or not inner.find(exp.Window)
            or not (inner.args.get("group") or any(e.find(*AGGREGATES) for e in inner.expressions))
            or any(tree.args.get(k) for k in ("joins", "with_", "group", "having", "distinct"))
            or inner.args.get("group") and _groups_by_unit(inner, schema)):
        return None
    names = [output_name(e) for e in inner.expressions]
    outer = tree.copy()
    outer.set("from_", None)
    if outer.find(exp.Window, *AGGREGATES):
        return None
    if any(isinstance(e, exp.Star) for e in outer.expressions):
        outer.set("expressions", [exp.column(n) for n in names])
    if (not all(isinstance(e.unalias(), exp.Column) for e in outer.expressions)
            or not {c.name for c in outer.find_all(exp.Column)} <= set(names)
            or any(isinstance(n, exp.Subquery | exp.Exists | exp.Select) for n in outer.walk() if n is not outer)):
        return None
    if not any(w.find(*AGGREGATES) for w in inner.find_all(exp.Window)):
        return Composition([to_sql(inner)], "rows picked from the released rows of a query with a window",
                           outer=to_sql(outer), picks=True)
    apart = _measured_apart(inner)
    if apart is None:
        note = ("rows picked by a window over noisy values: a row that ranks high partly by its noise is likely "
                "above its true value (the winner's curse), beyond what its interval shows; ask for the picked keys "
                "again, WHERE k IN (...), for values measured apart from the choice")
        return Composition([to_sql(inner)], "rows picked from the released rows of a query with a window",
                           outer=to_sql(outer), picks=True, notes=(note,))
    measure, keys = apart
    note = ("rows picked by a window over noisy values, with half the ε; their values are measured again with the "
            "other half, apart from the choice, so that a row that ranked high by its noise is not reported high "
            "too (the winner's curse)")
    return Composition([to_sql(inner), to_sql(measure)], "rows picked by a window over one answer, their values "
                       "from a second answer of the same groups", outer=to_sql(outer), picks=True, notes=(note,),
                       measured_apart=keys)


def _measured_apart(inner: exp.Select) -> tuple[exp.Select, tuple[str, ...]] | None:
    """The inner query's groups measured again without its windows, HAVING, ORDER BY or LIMIT (the choice is the
    first answer's), and the names of the key columns that identify a group in both: every GROUP BY key selected
    as a bare column. None where the groups cannot be matched so."""
    group = inner.args.get("group")
    plain = [e for e in inner.expressions if not e.find(exp.Window)]
    keys = [e for e in plain if not e.find(*AGGREGATES)]
    named = {output_name(e): e.unalias() for e in inner.expressions}

    def written(key: exp.Expression) -> str:  # GROUP BY 2, or an output's name, as the expression it stands for
        if isinstance(key, exp.Literal) and key.is_int and 0 < int(key.this) <= len(inner.expressions):
            key = inner.expressions[int(key.this) - 1].unalias()
        elif isinstance(key, exp.Column) and not key.table and key.name in named:
            key = named[key.name]
        return to_sql(key)
    grouped = {written(k) for k in group.expressions} if group is not None else set()
    if (not grouped or {to_sql(k.unalias()) for k in keys} != grouped or len(keys) != len(grouped)
            or any(isinstance(k, exp.Star) for k in plain)):
        return None
    measure = inner.copy()
    measure.set("expressions", [e.copy() for e in plain])
    for clause in ("having", "order", "limit", "offset", "qualify"):
        measure.set(clause, None)
    return measure, tuple(output_name(k) for k in keys)


MERGED = -1  # a join's USING column as the joins before it merged it (`_join_pairs`)
MERGED_COLUMN = "dpsql_m_"  # the merged USING column `k` of the joined rows is dpsql_m_k (`combining.joined_rows`)


def _joined_released(tree: exp.Select, schema: PrivacySchema) -> Composition | None:
    """`WITH a AS (SELECT k, COUNT(*) AS n … GROUP BY k), b AS (SELECT k, SUM(x) AS s … GROUP BY k) SELECT a.k, a.n,
    b.s / a.n FROM a JOIN b ON a.k = b.k`: each grouped query is answered on its own (the statement's ε split, as a
    UNION's parts are), and their released rows are joined after noise, as post-processing. Inner and outer (LEFT,
    RIGHT, FULL) joins on equalities of the parts' columns (ON or USING); the outer query projects, filters, orders
    and limits."""
    tree = inline_ctes(tree.copy(), read_once=True) if tree.args.get("with_") else tree
    joins = tree.args.get("joins") or []
    sources = [tree.args["from_"].this if tree.args.get("from_") else None, *(j.this for j in joins)]
    if (not joins or len(sources) > MAX_PARTS or any(tree.args.get(k) for k in ("group", "having", "distinct", "with_"))
            or not all(isinstance(s, exp.Subquery) and _released_query(s.this, schema) for s in sources)):
        return None
    aliases = [s.alias_or_name for s in sources]
    columns = [[output_name(e) for e in s.this.expressions] for s in sources]
    if len(set(aliases)) < len(aliases) or any(len(set(c)) < len(c) for c in columns):
        return None

    def part_of(column: exp.Column) -> int | None:
        found = [i for i, names in enumerate(columns) if column.name in names
                 and (not column.table or column.table == aliases[i])]
        return found[0] if len(found) == 1 else None

    specs, merged = [], set()  # merged: the USING columns, read unqualified as PostgreSQL merges them
    for number, join in enumerate(joins, start=1):
        side = (join.side or "").upper()
        if side not in ("", "LEFT", "RIGHT", "FULL") or (join.kind or "").upper() not in ("", "INNER", "OUTER"):
            return None
        pairs = _join_pairs(join, number, part_of, columns, merged)
        if not pairs:
            return None
        specs.append((side, tuple(pairs)))
        merged |= {name for _, name, _, _ in pairs} if join.args.get("using") else set()
    outer = tree.copy()
    outer.set("from_", None)
    outer.set("joins", None)
    outputs = {output_name(e) for e in outer.expressions}

    def named(node: exp.Expression) -> exp.Expression:  # a part's column by its joined name; ORDER BY an output's
        if isinstance(node, exp.Column) and not node.table and node.name in merged:
            return exp.column(f"{MERGED_COLUMN}{node.name}")
        if not isinstance(node, exp.Column) or part_of(node) is None and node.name in outputs and not node.table:
            return node
        return exp.column(f"dpsql_j{part_of(node)}_{node.name}")

    if (outer.find(exp.Window, *AGGREGATES, exp.Subquery, exp.Exists, exp.Star)
            or any(part_of(c) is None and not (c.find_ancestor(exp.Order) and c.name in outputs)
                   and (c.table or c.name not in merged) for c in outer.find_all(exp.Column))):
        return None
    outer.set("expressions", [exp.alias_(e.unalias().copy(), output_name(e)) for e in outer.expressions])
    outer = outer.transform(named)
    return Composition([to_sql(s.this) for s in sources], "grouped queries answered apart, their released rows "
                       "joined", joins=tuple(specs), joined_outer=to_sql(outer))


def _released_query(select: exp.Expression, schema: PrivacySchema) -> bool:
    """Whether `select` is a grouped aggregate query that is answered on its own (not a per-unit table)."""
    return (isinstance(select, exp.Select) and bool(select.args.get("group"))
            and any(e.find(*AGGREGATES) for e in select.expressions) and not _groups_by_unit(select, schema))


def _join_pairs(join: exp.Join, number: int, part_of: Any, columns: list[list[str]], merged: set[str]) \
        -> list[tuple[int, str, int, str]] | None:
    """(earlier part, its column, part `number`, its column) for each equality of the join's ON (every conjunct one)
    or each USING column; None for any other condition. A USING column that several earlier parts hold is the one
    an earlier USING merged (`a FULL JOIN b USING (k) FULL JOIN c USING (k)`): its earlier part is MERGED."""
    if join.args.get("using"):
        pairs = []
        for identifier in join.args["using"]:
            earlier = [i for i in range(number) if identifier.name in columns[i]]
            if identifier.name not in columns[number] or not earlier or len(earlier) > 1 and (
                    identifier.name not in merged):
                return None
            pairs.append((earlier[0] if len(earlier) == 1 else MERGED, identifier.name, number, identifier.name))
        return pairs
    on = join.args.get("on")
    pairs = []
    for conjunct in operands(on) if on is not None else []:
        if not (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)
                and isinstance(conjunct.expression, exp.Column)):
            return None
        ends = sorted([(part_of(conjunct.this), conjunct.this.name), (part_of(conjunct.expression),
                                                                       conjunct.expression.name)],
                      key=lambda end: -1 if end[0] is None else end[0])
        (left, left_name), (right, right_name) = ends
        if left is None or right != number or left >= number:
            return None
        pairs.append((left, left_name, right, right_name))
    return pairs or None


def _booleans(tree: exp.Select) -> Composition | None:
    """`bool_or(x)`, `bool_and(x)` and `every(x)` as whole output columns: each is answered from a noisy count,
    `COUNT(*) FILTER (WHERE x)` for bool_or and `COUNT(*) FILTER (WHERE NOT (x))` for the others, as
    post-processing (`combining`). Elsewhere in the query (WHERE, HAVING, ORDER BY) they stay refused."""
    found = [(i, _boolean_of(item.unalias())) for i, item in enumerate(tree.expressions)]
    found = [(i, boolean) for i, boolean in found if boolean is not None]
    outputs = {id(tree.expressions[i].unalias()) for i, _ in found}
    if any(_boolean_of(node) is not None and id(node) not in outputs for node in tree.walk()):
        return None
    inner = tree.copy()
    for i, (condition, every, name) in found:
        item = inner.expressions[i]
        kept = exp.Not(this=exp.Paren(this=condition.copy())) if every else condition.copy()
        count = exp.Filter(this=exp.Count(this=exp.Star()), expression=exp.Where(this=kept))
        item.replace(exp.alias_(count, item.alias if isinstance(item, exp.Alias) else name))
    spelled = ", ".join(to_sql(tree.expressions[i].unalias()) for i, _ in found)
    return Composition([to_sql(inner)], f"{spelled} read off noisy counts of the rows that hold or fail each "
                       "condition", booleans=tuple((i, every) for i, (_, every, _) in found))


def _boolean_of(node: exp.Expression) -> tuple[exp.Expression, bool, str] | None:
    """(condition, whether every row must hold it, PostgreSQL's column name) of bool_or, bool_and or every."""
    if isinstance(node, exp.LogicalOr | exp.LogicalAnd):
        return node.this, isinstance(node, exp.LogicalAnd), "bool_and" if isinstance(node, exp.LogicalAnd) else \
            "bool_or"
    if isinstance(node, exp.Anonymous) and node.name.lower() == "every" and len(node.expressions) == 1:
        return node.expressions[0], True, "every"
    return None


def _count_of_reported_value(tree: exp.Select, schema: PrivacySchema) -> Composition | None:
    """`SELECT [k, ...,] COUNT(*) FROM t WHERE positive [AND ...] [GROUP BY k, ...] [ORDER BY ...] [LIMIT ...]`,
    positive a locally randomized column: the count of people whose value is the one asked is read from the
    de-biased counts per reported value (`SELECT [k, ...,] positive, COUNT(*) ... GROUP BY [k, ...,] positive`,
    which the analysis answers), the rows of the one asked picked with their intervals. A filter on the reports
    themselves would count reports, not people (`analysis.local_columns`). An ungrouped statement's one
    `COUNT(*) FILTER (WHERE positive)` is that count with its filter in the WHERE."""
    tree = _filter_as_where(tree)
    table = tree.args["from_"].this if tree.args.get("from_") else None
    where = tree.args.get("where")
    aliases = {e.alias: e.this for e in tree.expressions if isinstance(e, exp.Alias)}
    keys = [_resolved(k, aliases, tree.expressions) for k in
            (tree.args["group"].expressions if tree.args.get("group") else [])]
    if (not isinstance(table, exp.Table) or where is None
            or any(tree.args.get(k) for k in ("having", "joins", "with_", "distinct"))
            or not all(isinstance(k, exp.Column) for k in keys)
            or not all(_counts_rows(e.unalias()) or _selected_key(e.unalias(), keys) for e in tree.expressions)):
        return None
    declared = schema.tables.get(table.name)
    local = {name for name, column in declared.columns.items() if column.local is not None} if declared else set()
    conditions = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
    asked = [(i, value_asked(c, local)) for i, c in enumerate(conditions)
             if any(column.name in local for column in c.find_all(exp.Column))]
    if len(asked) != 1 or asked[0][1] is None or any(k.name in local for k in keys):
        return None
    at, (column, value) = asked[0]
    rest = [c for i, c in enumerate(conditions) if i != at]
    names = [output_name(e) for e in tree.expressions]
    order = _order_over_outputs(tree, names, aliases)
    if order is None:
        return None
    inner = exp.select(exp.column(column),
                       *(exp.alias_(e.unalias().copy(), n) for e, n in zip(tree.expressions, names, strict=True)))
    inner = inner.from_(table.copy()).group_by(*(k.copy() for k in keys), exp.column(column))
    if rest:
        inner = inner.where(exp.and_(*(c.copy() for c in rest)))
    outer = exp.select(*(exp.column(n) for n in names)).where(exp.EQ(this=exp.column(column), expression=value))
    if order:
        outer.set("order", exp.Order(expressions=order))
    for clause in ("limit", "offset"):
        if tree.args.get(clause):
            outer.set(clause, tree.args[clause].copy())
    return Composition([to_sql(inner)], f"the count of one value of {table.name}.{column}, read from the "
                       "de-biased counts per reported value", outer=to_sql(outer), picks=True, zero_row=not keys)


def _filter_as_where(tree: exp.Select) -> exp.Select:
    """`SELECT COUNT(*) FILTER (WHERE c) [AS n] FROM t [WHERE w]` as `SELECT COUNT(*) [AS n] FROM t WHERE [w AND] c`:
    one ungrouped count, the same rows counted. Anything else as it is."""
    item = tree.expressions[0] if len(tree.expressions) == 1 and not tree.args.get("group") else None
    counted = item.unalias() if item is not None else None
    if not (isinstance(counted, exp.Filter) and isinstance(counted.this, exp.Count)
            and isinstance(counted.this.this, exp.Star)):
        return tree
    spelled = tree.copy()
    count = exp.Count(this=exp.Star())
    spelled.set("expressions", [exp.alias_(count, item.alias) if isinstance(item, exp.Alias) else count])
    return spelled.where(counted.expression.this.copy(), copy=False)


REPORTS = "dpsql_reports"


def _aggregates_of_reports(tree: exp.Select, schema: PrivacySchema,
                           not_null: frozenset[tuple[str, str]] = frozenset()) -> Composition | None:
    """`SELECT [k, ...,] AVG(positive::int), COUNT(*) FILTER (WHERE positive), COUNT(positive) FROM t ... [GROUP
    BY k, ...]`, positive a private table's randomized-response boolean: each aggregate read from the de-biased
    counts per reported value (`SELECT [k, ...,] positive, COUNT(*) ... GROUP BY [k, ...,] positive`, which the
    analysis answers), as a public table's reports are (`dpsql.local.estimates`): a count of v is the estimated
    count of v, COUNT(positive) the two added, an average of `positive::int` the count of true over both.
    COUNT(*) and an average that counts a NULL report as 0 (CASE ... ELSE 0) need the NULL reports too, which the
    counts per value leave out: they are refused with a hint, unless the catalog declares the column NOT NULL
    and no outer join can add a row without a report (then they count the reports), as is any use of the reports
    outside such an aggregate (`analysis.local_columns`)."""
    if any(tree.args.get(k) for k in ("having", "with_", "distinct")) or tree.find(exp.Window) \
            or not isinstance(tree.args["from_"].this if tree.args.get("from_") else None, exp.Table):
        return None
    local = _reported_column(tree, schema)
    if local is None:
        return None
    alias, column = local
    tables = [t for t in tree.find_all(exp.Table) if t.alias_or_name == alias or not alias and t.name in
              schema.tables and column in schema.tables[t.name].columns]
    outer_joins = any(j.side for j in tree.args.get("joins") or [])
    every_row_reports = not outer_joins and len(tables) == 1 and (tables[0].name, column) in not_null
    aliases = {e.alias: e.this for e in tree.expressions if isinstance(e, exp.Alias)}
    keys = [_resolved(k, aliases, tree.expressions) for k in
            (tree.args["group"].expressions if tree.args.get("group") else [])]  # GROUP BY 1 and output names too
    if not all(isinstance(k, exp.Column) and k.name != column for k in keys):
        return None
    names = [output_name(e) for e in tree.expressions]
    outputs = []
    for item in (e.unalias() for e in tree.expressions):
        estimate = _estimates_in(item, column, every_row_reports) if not isinstance(item, exp.Column) else None
        if estimate is None and not _selected_key(item, keys):
            return None
        outputs.append(estimate if estimate is not None else exp.column(item.name))
    order = _order_over_outputs(tree, names, aliases)
    if order is None:
        return None
    reported = exp.column(column, table=alias)
    inner = tree.copy()
    inner.set("expressions", [*(exp.column(k.name, table=k.table) for k in keys), reported,
                              exp.alias_(exp.Count(this=exp.Star()), REPORTS)])
    inner.set("group", exp.Group(expressions=[*(k.copy() for k in keys), reported.copy()]))
    for clause in ("order", "limit", "offset"):
        inner.set(clause, None)
    outer = exp.select(*(exp.alias_(o, n) for o, n in zip(outputs, names, strict=True)))
    if keys:
        outer.set("group", exp.Group(expressions=[exp.column(k.name) for k in keys]))
    if order:
        outer.set("order", exp.Order(expressions=order))
    for clause in ("limit", "offset"):
        if tree.args.get(clause):
            outer.set(clause, tree.args[clause].copy())
    return Composition([to_sql(inner)], f"estimates from the de-biased counts per reported value of {column}",
                       outer=to_sql(outer))


def _reported_column(tree: exp.Select, schema: PrivacySchema) -> tuple[str, str] | None:
    """(alias, column) of the one randomized-response boolean of a private table the statement reads, where it
    reads it only inside aggregates; None otherwise."""
    tables = {t.alias_or_name: schema.tables.get(t.name) for t in tree.find_all(exp.Table)}
    found = set()
    for node in tree.find_all(exp.Column):
        table = tables.get(node.table) if node.table else next(
            (t for t in tables.values() if t is not None and node.name in t.columns), None)
        declared = table.columns.get(node.name) if table is not None else None
        if declared is not None and declared.local is not None:
            if table.public or declared.local.mechanism != "rr" or node.find_ancestor(*AGGREGATES, exp.Filter) is None:
                return None
            found.add((node.table, node.name))
    return next(iter(found)) if len(found) == 1 else None


def _estimates_in(item: exp.Expression, column: str, every_row_reports: bool = False) -> exp.Expression | None:
    """`item` with each of its aggregates read from the counts per reported value (`_estimate_of_reports`:
    `COUNT(*) FILTER (WHERE positive) * 1.0 / COUNT(*)`, a share); None where one cannot be, or where a column
    is read outside them."""
    found: list[bool] = []

    def read(node: exp.Expression) -> exp.Expression:
        aggregate = isinstance(node, tuple(AGGREGATES)) and not isinstance(node.parent, exp.Filter)
        if isinstance(node, exp.Filter) or aggregate:
            estimate = _estimate_of_reports(node, column, every_row_reports)
            found.append(estimate is not None)
            return estimate if estimate is not None else node
        return node
    estimated = item.copy().transform(read)
    if not found or not all(found):
        return None
    reads = {c.name for c in estimated.find_all(exp.Column)}
    return estimated if reads <= {column, REPORTS} else None


def _estimate_of_reports(item: exp.Expression, column: str, every_row_reports: bool = False) -> exp.Expression | None:
    """What one select item reads from the released counts per reported value (`REPORTS` by `column`):
    COUNT(column) their sum, a count or sum of the reports of v (`query.indicator_of`) the count of v, an average
    of `column::int` the count of true over the sum; None for anything else. COUNT(*) would count the NULL
    reports too, which the counts per value leave out: refused, with COUNT(column) as the hint, unless
    `every_row_reports` (the column is NOT NULL and no outer join adds a row without it): then it is COUNT(column),
    and an average that would read a NULL report as 0 is the average of the reports."""
    every = exp.Sum(this=exp.column(REPORTS))
    if isinstance(item, exp.Count) and not item.args.get("distinct") and isinstance(item.this, exp.Star | exp.Column):
        if isinstance(item.this, exp.Star) and not every_row_reports:
            raise UnsupportedQuery(f"COUNT(*) beside the reports of {column} counts NULL reports too, and the counts "
                                   "per reported value leave them out", f"count the reports: COUNT({column})")
        return every if isinstance(item.this, exp.Star) or item.this.name == column else None
    average = isinstance(item, exp.Avg)
    if isinstance(item, exp.Filter) and isinstance(item.this, exp.Count) and isinstance(item.this.this, exp.Star):
        asked = value_asked(item.expression.this, {column})  # COUNT(*) FILTER (WHERE positive): the reports of v
        value = bool(asked[1].this) if asked is not None and isinstance(asked[1], exp.Boolean) else None
    elif isinstance(item, exp.Avg | exp.Sum | exp.Count) and not item.args.get("distinct"):
        indicator = indicator_of(item.this, column, item)
        if indicator is not None and average and indicator[1] and not every_row_reports:  # NULL reports as 0
            raise UnsupportedQuery(f"{to_sql(item)} counts a NULL report of {column} as 0, and the counts per "
                                   "reported value leave NULL reports out",
                                   f"average the reports themselves: AVG({column}::int)")
        value = indicator[0] if indicator is not None else None
    else:
        return None
    if value is None:
        return None
    reports = exp.Case(ifs=[exp.If(this=exp.EQ(this=exp.column(column), expression=exp.Boolean(this=value)),
                                   true=exp.column(REPORTS))], default=exp.Literal.number(0))
    counted = exp.Sum(this=reports)
    if average:
        return exp.Div(this=exp.Mul(this=counted, expression=exp.Literal.number("1.0")), expression=every)
    return counted


def _selected_key(value: exp.Expression, keys: list[exp.Expression]) -> bool:
    return isinstance(value, exp.Column) and any(value.name == k.name and value.table == k.table for k in keys)


def _order_over_outputs(tree: exp.Select, names: list[str],
                        aliases: dict[str, exp.Expression]) -> list[exp.Ordered] | None:
    """The statement's ORDER BY over its outputs' names (a position, a name, or an output's own expression), or
    None where a term is none of these."""
    spelled = {to_sql(e.unalias()): n for e, n in zip(tree.expressions, names, strict=True)}
    order = []
    for ordered in tree.args["order"].expressions if tree.args.get("order") else []:
        name = spelled.get(to_sql(_resolved(ordered.this, aliases, tree.expressions)))
        if name is None:
            return None
        order.append(exp.Ordered(this=exp.column(name), desc=ordered.args.get("desc"),
                                 nulls_first=ordered.args.get("nulls_first")))
    return order


def _counts_rows(value: exp.Expression) -> bool:
    return isinstance(value, exp.Count) and isinstance(value.this, exp.Star) and not value.args.get("filter")


SCALAR = "dpsql_scalar_"
UNITS_PER_VALUE = "dpsql_units"
# A presence count keeps one row of each unit (chosen by the keyed hash, as any rows a bound keeps), so that a unit
# counts in one cell: its counts' noise is then for a sensitivity of 1, not of the cells its k rows reach. With
# Laplace noise no larger number does better: at m rows a unit reaches m cells, so the threshold grows as m, while
# a cell gains at most m times the units it counts at one row. Measured on the demo data at ε = 1 (COUNT(DISTINCT
# category) by month, 8 of 8 categories every month; 20 answers, /tmp scripts of the session): with the race's 64
# rows (each count ±181) 90% low at 3,000 people and 28% low at 20,000; at one row (±3) 0% median error at both.
PRESENCE_ROWS = 1
# The days of a bounded date are counted present where they are the only cells (no key, or keys of that date
# alone: its weekday, month or week, each day in one key), and no more than PRESENCE_DAYS of them: there the race
# over values cannot resolve the few (key, day) pairs at one row a person (`RaceToTheTop.may_resolve`), and the
# race over rows that answers instead bounds a person at the cap, 100 new days each. Measured on the demo data
# at ε = 1 (6 answers each, /tmp scripts of the session), race → values present: COUNT(DISTINCT day) by weekday
# 100% → 0.0% median error at 20,000 people and 100% → 22% (low, its interval covering) at 3,000; by month 100% →
# 0.0% and 100% → 20%; the year's total 53% → 0.0% and 11% → 21%. By category (8 × 366 cells, each with few
# people's one row) it was 44% and 95% low against the race's 2.3% and 6.7%, so other keys keep the race.
PRESENCE_DAYS = 731


def _values_present(tree: exp.Select, schema: PrivacySchema,
                    params: Sequence[Any] | Mapping[str, Any] | None) -> Composition | None:
    """`SELECT [k, …,] COUNT(DISTINCT c) FROM t [JOIN …] [WHERE ...] [GROUP BY k, …]` where c has a declared domain:
    the number of values present is read from a noisy count of units per declared value (`SELECT [k, …,] c,
    COUNT(DISTINCT unit) ... GROUP BY [k, …,] c`), counting those whose 95% interval lies above zero, per group of
    the keys. Post-processing of that one answer, whose part keeps one row of each unit (PRESENCE_ROWS): its
    sensitivity is the count's, 1 (each unit counts in one cell). So too the days of a bounded date, where they
    are the only cells (PRESENCE_DAYS: no key, or keys of that date alone); by other keys they stay the ordinary
    stages'."""
    group = tree.args.get("group")
    keys = [_resolved(k, {}, tree.expressions) for k in group.expressions] if group is not None else []
    if not tree.expressions or [e.unalias() for e in tree.expressions[:-1]] != keys or any(
            tree.args.get(k) for k in ("having", "with_", "distinct")) \
            or any(k.find(*AGGREGATES, exp.Window) for k in keys):
        return None
    count = tree.expressions[-1].unalias()
    distinct = count.this if isinstance(count, exp.Count) else None
    if isinstance(count, exp.ApproxDistinct):  # approx_count_distinct(c), as BI tools send it, is the same
        distinct = exp.Distinct(expressions=[count.this])
    counted = distinct.expressions[0] if isinstance(distinct, exp.Distinct) and len(distinct.expressions) == 1 \
        else None
    joined = tree.args.get("joins") or []
    sources = {t.alias_or_name: t for t in tables_read(tree)}
    if isinstance(counted, exp.Column) and joined and not counted.table:  # the one table that declares it
        holders = [a for a, t in sources.items() if counted.name in getattr(schema.tables.get(t.name), "columns", {})]
        counted = exp.column(counted.name, table=holders[0]) if len(holders) == 1 else None
    table = sources.get(counted.table) if isinstance(counted, exp.Column) and joined else \
        tree.args["from_"].this if tree.args.get("from_") and not joined else None
    if not isinstance(counted, exp.Column) or not isinstance(table, exp.Table) \
            or len(sources) != len(joined) + 1:  # (a join to a subquery is the ordinary stages')
        return None
    declared = schema.tables.get(table.name)
    column = declared.columns.get(counted.name) if declared is not None else None
    dated = column is not None and column.domain is None and column.type == "date" and column.bounded \
        and column.upper - column.lower < PRESENCE_DAYS and all(_reads_only(k, counted) for k in keys)
    if column is None or column.domain is None and not dated or declared.public or column.local is not None:
        return None
    path = _path_to_unit(schema, declared, table.alias_or_name)
    if path is not None and joined and path[1]:  # the statement's own joins may reach the parent
        unit = _unit_through_joins(tree, schema, declared, table.alias_or_name)
        path = None if unit is None else (unit, [])
    if path is None:
        return None  # row-level privacy, or joins that do not reach a parent's unit: left to the ordinary stages
    unit, joins = path
    tree = bind_parameters(tree, params)
    own = table.alias_or_name

    def owned(node: exp.Expression) -> exp.Expression:  # the table's own columns, named beside the parents joined
        node = node.copy()
        for name in [node] if isinstance(node, exp.Column) else node.find_all(exp.Column):
            if not name.table and not joined:
                name.set("table", exp.to_identifier(own))
        return node

    outputs = [owned(item) for item in tree.expressions[:-1]]
    value = exp.column(column.name, table=own)
    inner = exp.select(*outputs, value, exp.alias_(exp.Count(this=exp.Distinct(expressions=[unit])),
                                                   UNITS_PER_VALUE)).from_(tree.args["from_"].this.copy())
    for join in [*joined, *joins]:
        inner = inner.join(join.copy())
    if tree.args.get("where"):
        inner.set("where", owned(tree.args["where"]))
    inner.set("group", exp.Group(expressions=[*(owned(k) for k in keys), value.copy()]))
    name = "approx_count_distinct" if isinstance(tree.expressions[-1], exp.ApproxDistinct) \
        else output_name(tree.expressions[-1])
    try:  # ORDER BY, LIMIT and OFFSET over the counts per group (BI tools order by the count)
        order, limit, offset = _outer_order(tree, [output_name(e) for e in tree.expressions], tree.expressions)
    except UnsupportedQuery:
        return None
    return Composition([to_sql(inner)], f"the declared values of {table.name}.{column.name} present: counted from "
                       "a noisy count of units per value" + (" and group" if keys else "") + ", each unit counted "
                       "once, for one of its rows", values_present=name, values_keys=len(keys), order=order,
                       limit=limit, offset=offset, rows_per_unit=PRESENCE_ROWS)


def _reads_only(node: exp.Expression, column: exp.Column) -> bool:
    """Whether `node` reads `column` and no other column (EXTRACT(DOW FROM day) of day)."""
    read = list(node.find_all(exp.Column))
    return bool(read) and all(c.name == column.name and (not c.table or not column.table or c.table == column.table)
                              for c in read)


def _path_to_unit(schema: PrivacySchema, table: Table, alias: str) -> tuple[exp.Column, list[exp.Join]] | None:
    """The unit of `table`'s rows (read as `alias`) and the joins to its parents that reach it (none where the
    table has the unit column); None under row-level privacy."""
    if schema.unit_table is None:
        return None
    joins: list[exp.Join] = []
    while table.unit_column is None:
        if table.parent is None or len(joins) >= len(schema.tables):
            return None
        link, parent = table.parent, f"dpsql_up{len(joins) + 1}"
        joins.append(exp.Join(this=exp.Table(this=exp.to_identifier(link.table), alias=exp.TableAlias(
            this=exp.to_identifier(parent))), on=exp.column(link.key, table=parent).eq(exp.column(link.column,
                                                                                                  table=alias))))
        table, alias = schema.tables[link.table], parent
    return exp.column(table.unit_column, table=alias), joins


def _unit_through_joins(tree: exp.Select, schema: PrivacySchema, table: Table, alias: str) -> exp.Column | None:
    """The unit of `table`'s rows (read as `alias`) through the statement's own inner joins to each parent on its
    key (`FROM prescriptions p JOIN visits v ON v.visit_id = p.visit_id`: v.person_id), or None where a parent on
    the way is not joined so."""
    joins = tree.args.get("joins") or []
    if any((j.side or "") != "" or (j.kind or "INNER").upper() != "INNER" for j in joins):
        return None
    equalities = {frozenset((to_sql(c.this), to_sql(c.expression))) for j in joins if j.args.get("on") is not None
                  for c in operands(j.args["on"]) if isinstance(c, exp.EQ)}
    parents = {t.alias_or_name: t.name for t in tables_read(tree)}
    while table.unit_column is None:
        link = table.parent
        found = [name for name, held in parents.items() if link is not None and held == link.table and frozenset(
            (to_sql(exp.column(link.key, table=name)), to_sql(exp.column(link.column, table=alias)))) in equalities]
        if len(found) != 1:
            return None
        table, alias = schema.tables[link.table], found[0]
    return exp.column(table.unit_column, table=alias)


def _groups_by_unit(select: exp.Select, schema: PrivacySchema,
                    keys: frozenset[tuple[str, str]] = frozenset()) -> bool:
    """Whether `select` groups by a unit column (a per-unit table or a cohort), or by columns only, one of them a
    key that fixes a row of a private table, so that each group is one unit's (`GROUP BY o.order_id`; `keys`:
    the catalog's unique NOT NULL columns, and a child's parent key fixes its parent's row): the analysis bounds
    these."""
    units = {t.unit_column for t in schema.tables.values() if t.unit_column} | {schema.unit_column}
    aliases = {e.alias: e.this for e in select.expressions if isinstance(e, exp.Alias)}
    groups = [_resolved(k, aliases, select.expressions) for k in select.args["group"].expressions]  # GROUP BY 1
    if any(isinstance(k, exp.Column) and k.name in units for k in groups):
        return True
    if not keys or not all(isinstance(k, exp.Column) for k in groups):
        return False
    tables = {t.alias_or_name: schema.tables.get(t.name) for t in tables_read(select)}
    for key in groups:
        table = tables.get(key.table) if key.table else next(iter(tables.values())) if len(tables) == 1 else None
        if table is not None and not table.public and ((table.name, key.name) in keys
                                                       or table.parent is not None and table.parent.column == key.name):
            return True
    return False


def _joined_to_released_keys(tree: exp.Select, schema: PrivacySchema) -> Composition | None:
    """`… JOIN (SELECT k AS k__, COUNT(*) AS m FROM t GROUP BY k ORDER BY m DESC LIMIT 5) AS series_limit ON k = k__`
    (Superset's series limit): the subquery is answered first, and the query is asked with `k = ANY(its released
    keys)` in place of the join; with several keys (`ON a = a__ AND b = b__`), `(a, b) = ANY(the released pairs)`.
    Each is an ordinary answer (the second's bounds hold for any list of keys), so this is sequential composition.
    An inner join on equalities alone, and the subquery's columns read nowhere else."""
    joined = [(i, j) for i, j in enumerate(tree.args["joins"]) if isinstance(j.this, exp.Subquery)
              and isinstance(j.this.this, exp.Select) and j.this.this.args.get("group")]
    if len(joined) != 1 or (joined[0][1].side or "") != "" or (joined[0][1].kind or "INNER").upper() != "INNER":
        return None
    at, join = joined[0]
    inner, alias = join.this.this, join.this.alias_or_name
    if _groups_by_unit(inner, schema):
        return None  # a cohort of units (`JOIN (SELECT person_id ... HAVING ...)`): the analysis reads it as IN
    names = [output_name(e) for e in inner.expressions]
    condition = join.args["on"].unnest() if join.args.get("on") is not None else None
    equalities = [c.unnest() for c in operands(condition)] if condition is not None else []
    if not equalities or not all(isinstance(e, exp.EQ) for e in equalities):
        return None
    outer_columns = {c for t in tree.find_all(exp.Table) if t.name in schema.tables
                     for c in schema.tables[t.name].columns if t.find_ancestor(exp.Subquery) is None}

    def of_subquery(column: exp.Expression) -> bool:
        return isinstance(column, exp.Column) and column.name in names and (
            column.table == alias or not column.table and column.name not in outer_columns)
    pairs = [next(((a, b) for a, b in ((e.this, e.expression), (e.expression, e.this))
                   if of_subquery(a) and isinstance(b, exp.Column) and not of_subquery(b)), None) for e in equalities]
    if None in pairs:
        return None
    rest = tree.copy()
    rest.args["joins"].pop(at)
    if not rest.args["joins"]:
        rest.set("joins", None)
    if any(of_subquery(c) for c in rest.find_all(exp.Column)):
        return None
    outer_keys = [outer.copy() for _, outer in pairs]
    kept = outer_keys[0] if len(outer_keys) == 1 else exp.Tuple(expressions=outer_keys)
    keys = exp.Any(this=exp.Paren(this=exp.Placeholder(this=f"{SCALAR}0")))
    rest.where(exp.EQ(this=kept, expression=keys), copy=False)
    columns = tuple(names.index(key.name) for key, _ in pairs)
    return Composition([to_sql(inner), to_sql(rest)], "the joined subquery's released keys answered first, then "
                       "the query kept to them", scalars=1, key_lists=((0, columns),))


def _distinct_counted_apart(tree: exp.Select, schema: PrivacySchema,
                            not_null: frozenset[tuple[str, str]] | None) -> Composition | None:
    """`SELECT category, COUNT(*), COUNT(DISTINCT day) FROM visits GROUP BY category`: one race of rows per unit
    would serve both, and rows grow to the cap while a column of few values is all found at a small bound. The
    other aggregates are answered first, then the COUNT(DISTINCT) alone over the groups they released (`k =
    ANY(the released keys)`, so no partition selection of its own), its race reading the values it finds
    (`Plan.races_distinct_values`), or of a declared domain its values present (`_values_present`); the two
    answers are joined on the keys, then ordered and cut. Every GROUP BY key must be selected. `not_null`: where
    the first answer's groups are DP-selected, the catalog's NOT NULL columns, every key's column one of them (a
    released NULL key is matched by no `= ANY`); None where the keys' domain is declared."""
    if any(tree.args.get(k) for k in ("with_", "distinct", "qualify")) or tree.find(exp.Window, exp.Subquery):
        return None
    outputs = tree.expressions
    counted = [i for i, e in enumerate(outputs) if _distinct_count(e.unalias())]
    if len(counted) != 1 or sum(1 for c in tree.find_all(exp.Count) if isinstance(c.this, exp.Distinct)) != 1:
        return None  # (read again in HAVING or ORDER BY, or several: as one query)
    at = counted[0]
    keys = _selected_group_keys(tree, _input_names(tree, schema)) if tree.args.get("group") else []
    others = any(e.find(*AGGREGATES) for i, e in enumerate(outputs) if i != at)
    if keys is None or at in keys or not keys and (tree.args.get("having") or not others):
        return None
    if not_null is not None and not _never_null_keys([outputs[i].unalias() for i in keys], tree, schema, not_null):
        return None
    try:
        order, _, _ = _outer_order(tree, [output_name(e) for e in outputs], outputs)
    except UnsupportedQuery:
        return None
    first, second = _apart(tree, keys, at)
    names = [[output_name(e) for e in part.expressions] for part in (first, second)]
    if any(len(set(n)) < len(n) for n in names):
        return None
    present = _values_present(second.copy(), schema, None)  # of a declared domain: a count of units per value
    present = present if present is not None and present.values_present == names[1][-1] else None
    second = parse_statement(present.parts[0]) if present is not None else second
    if keys:
        written = [outputs[i].unalias().copy() for i in keys]
        written = [k if isinstance(k, exp.Column | exp.Func) else exp.paren(k, copy=False) for k in written]  # (a > 1)
        listed = written[0] if len(written) == 1 else exp.Tuple(expressions=written)
        second.where(exp.EQ(this=listed, expression=exp.Any(this=exp.Paren(
            this=exp.Placeholder(this=f"{SCALAR}0")))), copy=False)
    kept_keys = [i - (i > at) for i in keys]  # the keys' columns in the first part
    outer = exp.select(*(exp.alias_(exp.column(f"dpsql_j1_{names[1][-1]}" if i == at else
                                               f"dpsql_j0_{names[0][i - (i > at)]}"), output_name(e), quoted=True)
                         for i, e in enumerate(outputs)))
    outer.set("order", exp.Order(expressions=[exp.Ordered(this=exp.Literal.number(column + 1), desc=descending,
                                                          nulls_first=nulls_first)
                                              for column, descending, nulls_first in order]) if order else None)
    for clause in ("limit", "offset"):
        outer.set(clause, tree.args[clause].copy() if tree.args.get(clause) else None)
    apart = Composition([to_sql(first), to_sql(second)], f"{to_sql(outputs[at].unalias())} answered apart from the "
                        "other aggregates, over the groups they release, so that each chooses its own rows per unit",
                        scalars=1 if keys else 0, key_lists=((0, tuple(kept_keys)),) if keys else (),
                        joins=(("LEFT", tuple((0, names[0][k], 1, names[1][n]) for n, k in enumerate(kept_keys))),),
                        joined_outer=to_sql(outer))
    if present is None:
        return apart
    return replace(apart, description=f"{present.description}, apart from the other aggregates, over the groups "
                   "they release", values_present=present.values_present, values_keys=present.values_keys,
                   values_part=1, rows_per_unit=present.rows_per_unit)


def _apart(tree: exp.Select, keys: list[int], at: int) -> tuple[exp.Select, exp.Select]:
    """The statement without its output `at`, and its keys (the outputs at `keys`) with output `at` alone, each
    grouped by the expressions its keys select (GROUP BY 2 would shift with the outputs), neither ordered nor cut;
    the second without the HAVING, which reads the first's aggregates."""
    first, second = tree.copy(), tree.copy()
    for part in (first, second):
        for clause in ("order", "limit", "offset"):
            part.set(clause, None)
        if keys:
            part.set("group", exp.Group(expressions=[tree.expressions[i].unalias().copy() for i in keys]))
    first.set("expressions", [e.copy() for i, e in enumerate(tree.expressions) if i != at])
    second.set("expressions", [tree.expressions[i].copy() for i in [*keys, at]])
    second.set("having", None)
    return first, second


def _distinct_count(value: exp.Expression) -> bool:
    """Whether `value` is COUNT(DISTINCT x) of one expression, maybe cast or with a FILTER."""
    while isinstance(value, exp.Cast | exp.Paren | exp.Filter):
        value = value.this
    return isinstance(value, exp.Count) and isinstance(value.this, exp.Distinct) and len(value.this.expressions) == 1


def _selected_group_keys(tree: exp.Select, inputs: set[str]) -> list[int] | None:
    """The positions of the outputs that are the GROUP BY keys, one for each (a position, an output's alias, or the
    expression itself, however qualified: `_resolved`, `_key_text`); None where a key is not selected. A bare name
    is an input column before an output's alias, as PostgreSQL reads it (`inputs`): `SELECT lower(c) AS c … GROUP
    BY c` groups by c, which it does not select."""
    aliases = {e.alias: e.this for e in tree.expressions if isinstance(e, exp.Alias)}
    spelled = [_key_text(e.unalias()) for e in tree.expressions]
    found = []
    for key in tree.args["group"].expressions:
        text = _key_text(_resolved(key, aliases, tree.expressions, inputs))
        if spelled.count(text) != 1:
            return None
        found.append(spelled.index(text))
    return found if len(set(found)) == len(found) else None


def _never_null_keys(keys: list[exp.Expression], tree: exp.Select, schema: PrivacySchema,
                     not_null: frozenset[tuple[str, str]]) -> bool:
    """Whether each key is a column the catalog declares NOT NULL (of a table of the statement's FROM)."""
    tables = {t.alias_or_name: t.name for t in tables_read(tree)}
    for key in keys:
        if not isinstance(key, exp.Column):
            return False
        owners = [tables[key.table]] if key.table in tables else [
            name for name in tables.values() if name in schema.tables and key.name in schema.tables[name].columns]
        if len(owners) != 1 or (owners[0], key.name) not in not_null:
            return False
    return True


KEYS = "dpsql_keys"  # the alias of a grouped subquery's released keys joined in place of `IN (SELECT k …)`


def _released_keys_as_join(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`WHERE x IN (SELECT k FROM t GROUP BY k HAVING COUNT(*) > 500)`, an AND of the WHERE: the keys a grouped
    query releases (its HAVING and LIMIT read noisy values), joined as Superset joins its series limit, `JOIN
    (SELECT k AS dpsql_keys FROM …) AS dpsql_keys ON x = dpsql_keys.dpsql_keys`, which `_joined_to_released_keys`
    answers in two steps. The grouped keys are distinct, so the join keeps each row at most once, and a NULL on
    either side matches nothing, as IN reads it. A subquery grouped by the unit is a cohort: left to the
    analysis."""
    found, inner, conditions = _keys_condition(tree, schema, negated=False)
    if found is None:
        return tree
    keys = inner.copy()
    keys.set("expressions", [exp.alias_(keys.expressions[0].unalias(), KEYS)])
    rewritten = tree.copy()
    rest = [c.copy() for c in conditions if c is not found]
    rewritten.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)
    on = exp.EQ(this=found.this.copy(), expression=exp.column(KEYS, table=KEYS))
    return rewritten.join(exp.Subquery(this=keys, alias=exp.TableAlias(this=exp.to_identifier(KEYS))), on=on,
                          copy=False)


def _keys_condition(tree: exp.Select, schema: PrivacySchema, negated: bool) -> tuple[Any, Any, list]:
    """The AND of the WHERE that is `x IN (SELECT k FROM t GROUP BY k …)` (`negated`: `x NOT IN (…)`) where the
    subquery releases keys (grouped, not by the unit: that is a cohort, the analysis's), its one output k; and
    the WHERE's conditions. (None, None, conditions) where there is none."""
    where = tree.args.get("where")
    conditions = operands(where.this) if where is not None else []
    for condition in conditions:
        test = condition.this if negated and isinstance(condition, exp.Not) else None if negated else condition
        inner = test.args["query"].this if isinstance(test, exp.In) and isinstance(test.this, exp.Column) \
            and isinstance(test.args.get("query"), exp.Subquery) else None
        if (isinstance(inner, exp.Select) and inner.args.get("group") and len(inner.expressions) == 1
                and not isinstance(inner.expressions[0], exp.Star) and not _groups_by_unit(inner, schema)
                and not tree.args.get("with_")):
            return condition, inner, conditions
    return None, None, conditions


def _released_keys_excluded(tree: exp.Select, schema: PrivacySchema) -> Composition | None:
    """`WHERE x NOT IN (SELECT k FROM t GROUP BY k HAVING COUNT(*) < 100)`, an AND of the WHERE: the subquery's
    released keys answered first, then the query kept to the rows of other keys, `x IS NOT NULL AND (x =
    ANY(the keys)) IS NOT TRUE`: NOT IN over a subquery is read as over its non-NULL values (`shape`), and a NULL
    among the keys, or none released (a list of one NULL), keeps the others, where `NOT (x = ANY(…))` would keep
    no row. Sequential composition, as for IN."""
    found, inner, conditions = _keys_condition(tree, schema, negated=True)
    if found is None:
        return None
    column = found.this.this
    kept = exp.and_(exp.Not(this=exp.Is(this=column.copy(), expression=exp.Null())), exp.Not(this=exp.Is(
        this=exp.Paren(this=exp.EQ(this=column.copy(), expression=exp.Any(this=exp.Paren(
            this=exp.Placeholder(this=f"{SCALAR}0"))))), expression=exp.Boolean(this=True))))
    rest = tree.copy()
    rest.set("where", exp.Where(this=exp.and_(*(kept if c is found else c.copy() for c in conditions))))
    return Composition([to_sql(inner), to_sql(rest)], "the subquery's released keys answered first, then the query "
                       "kept to the rows of other keys", scalars=1, key_lists=((0, (0,)),))


def _scalar_subqueries(tree: exp.Select) -> list[exp.Subquery]:
    """Subqueries used as values (not in FROM, a join, a CTE, IN or EXISTS)."""
    return [node for node in tree.find_all(exp.Subquery)
            if not isinstance(node.parent, READS) and node.find_ancestor(exp.Subquery) is None]


def _sequential(tree: exp.Select) -> Composition:
    """Each scalar subquery a first part; the outer query the last, with the subqueries' noisy values as
    parameters. A subquery must be uncorrelated, one aggregate row: then each answer is an ordinary DP answer,
    and the outer query's bounds hold for any constant."""
    outer = tree.copy()
    subqueries = _scalar_subqueries(outer)
    if len(subqueries) + 1 > MAX_PARTS:
        raise UnsupportedQuery(f"{len(subqueries)} scalar subqueries are more than dpsql answers in one statement",
                               "send some of the subqueries as queries of their own, and their answers as constants")
    inner_tables = set()
    parts = []
    ctes = {cte.alias_or_name for cte in (tree.args["with_"].expressions if tree.args.get("with_") else [])}
    for subquery in subqueries:
        select = subquery.this
        read = next((t.name for t in select.find_all(exp.Table) if not t.db and t.name in ctes), None)
        if read is not None:  # answered apart, the subquery would not see the WITH query
            raise UnsupportedQuery(f"the subquery ({to_sql(select)}) reads the WITH query {read}, whose rows are "
                                   "released after noise", f"a total over {read}'s rows is a window over them, in a "
                                   f"query that reads every row of {read} (no WHERE): SELECT k, n * 100.0 / SUM(n) "
                                   f"OVER () FROM {read}")
        if not isinstance(select, exp.Select) or select.args.get("group") or len(select.expressions) != 1 \
                or not select.expressions[0].find(*AGGREGATES):
            table = next((t.name for t in select.find_all(exp.Table)), "t")
            raise UnsupportedQuery(f"the subquery ({to_sql(select)}) is not one aggregate value",
                                   "a scalar subquery is answered when it is one aggregate without GROUP BY, e.g. "
                                   f"(SELECT COUNT(*) FROM {table})")
        own = {t.alias_or_name for t in select.find_all(exp.Table)}
        outside = [c for c in select.find_all(exp.Column) if c.table and c.table not in own]
        if outside:
            raise UnsupportedQuery(f"the subquery ({to_sql(select)}) refers to the outer query's "
                                   f"{to_sql(outside[0])}", "a scalar subquery must stand on its own (uncorrelated)")
        inner_tables |= own
        text = to_sql(select)
        if text not in parts:  # the same subquery twice is one answer, used twice
            parts.append(text)
        subquery.replace(exp.Placeholder(this=f"{SCALAR}{parts.index(text)}"))
    scalars = len(parts)
    parts.append(to_sql(outer))
    return Composition(parts, f"{scalars} scalar subquer{'y' if scalars == 1 else 'ies'} answered "
                       "first, then the query with their noisy values", scalars=scalars)


GROUPINGS = (exp.Rollup, exp.Cube, exp.GroupingSets)


def _may_read_reports(sql: str, schema: PrivacySchema | None) -> bool:
    """Whether the text names a locally randomized column (a cheap test; the parse decides)."""
    return schema is not None and any(name in sql for table in schema.tables.values()
                                      for name, column in table.columns.items() if column.local is not None)


def _may_compose(sql: str) -> bool:
    """Whether the text could hold a composition at all (a cheap test; the parse decides)."""
    text = sql.upper()
    return any(word in text for word in ("UNION", "INTERSECT", "EXCEPT", "GROUPING", "ROLLUP", "CUBE", "BOOL_",
                                         "EVERY")) \
        or text.count("SELECT") > 1


def _set_operation(tree: exp.SetOperation) -> Composition:
    if not isinstance(tree, exp.Union):
        raise set_operation_refused(tree)
    branches = _branches(tree)
    if len(branches) > MAX_PARTS:
        raise UnsupportedQuery(f"a UNION of {len(branches)} SELECTs is more than the {MAX_PARTS} dpsql answers",
                               "send fewer SELECTs per statement")
    widths = {len(b.expressions) for b in branches}
    if len(widths) != 1:
        raise UnsupportedQuery("each UNION query must have the same number of columns",
                               "select the same number of columns in each part: SELECT a, COUNT(*) ... UNION ALL "
                               "SELECT b, COUNT(*) ...")
    distinct = _all_or_distinct(tree)
    names = [output_name(e) for e in branches[0].expressions]
    order, limit, offset = _outer_order(tree, names, branches[0].expressions)
    return Composition([to_sql(b) for b in branches], f"UNION{'' if distinct else ' ALL'} of {len(branches)} "
                       "SELECTs", distinct, order, limit, offset)


def _branches(tree: exp.Expression) -> list[exp.Select]:
    if isinstance(tree, exp.Union):
        return [*_branches(tree.this), *_branches(tree.expression)]
    if isinstance(tree, exp.Subquery):
        return _branches(tree.this)
    if not isinstance(tree, exp.Select):
        raise UnsupportedQuery(f"a UNION of {tree.key.upper()} is not supported", "UNION SELECTs only")
    if tree.args.get("group") and any(isinstance(e, GROUPINGS) for e in tree.args["group"].expressions):
        raise UnsupportedQuery("GROUPING SETS, ROLLUP or CUBE inside a UNION is not supported",
                               "send the grouped SELECT on its own")
    return [tree]


def _all_or_distinct(tree: exp.Union) -> bool:
    """Whether the UNION removes duplicate rows (plain UNION) rather than keeping them (UNION ALL); one kind
    per statement, as mixing them would make the order of the operations matter."""
    kinds = set()
    node: exp.Expression = tree
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, exp.Union):
            kinds.add(bool(node.args.get("distinct")))
            stack += [node.this, node.expression]
    if len(kinds) > 1:
        raise UnsupportedQuery("a statement mixing UNION and UNION ALL is not supported", "use one of them")
    return kinds.pop()


def _grouping_sets(tree: exp.Select, schema: PrivacySchema | None = None) -> Composition:
    """One grouped SELECT per grouping set: its keys grouped, the others NULL, GROUPING() as its constant."""
    if tree.find(exp.Window):
        raise UnsupportedQuery("window functions with GROUPING SETS, ROLLUP or CUBE are not supported",
                               "compute the window over a query with a plain GROUP BY")
    aliases = {e.alias: e.this for e in tree.expressions if isinstance(e, exp.Alias)}
    sets = [list(s) for s in itertools.product(*(_sets_of(e) for e in tree.args["group"].expressions))]
    inputs = _input_names(tree, schema)
    sets = [[_resolved(key, aliases, tree.expressions, inputs) for part in s for key in part] for s in sets]
    if len(sets) > MAX_PARTS:
        raise UnsupportedQuery(f"{len(sets)} grouping sets are more than the {MAX_PARTS} dpsql answers",
                               "group by fewer keys (CUBE of n keys is 2^n groupings)")
    all_keys = {_key_text(k): k for s in sets for k in s}
    names = [output_name(e) for e in tree.expressions]
    order, limit, offset = _outer_order(tree, names, tree.expressions)
    parts = []
    for keys in sets:
        present = {_key_text(k) for k in keys}
        part = tree.copy()
        for key in ("order", "limit", "offset"):
            part.set(key, None)
        part.set("group", exp.Group(expressions=[k.copy() for k in keys]) if keys else None)
        part.set("expressions", [_in_set(e, present, all_keys) for e in part.expressions])
        parts.append(to_sql(part))
    spelled = "; ".join("(" + ", ".join(to_sql(k) for k in s) + ")" for s in sets)
    return Composition(parts, f"GROUPING SETS of {len(sets)} groupings: {spelled}", False, order, limit, offset)


def _input_names(tree: exp.Select, schema: PrivacySchema | None) -> set[str]:
    """The column names the FROM clause's tables (declared in `schema`) and subqueries give: PostgreSQL reads a
    bare GROUP BY name as one of them before an output column's alias."""
    names: set[str] = set()
    for source in [tree.args.get("from_"), *(tree.args.get("joins") or [])]:
        source = source.this if source is not None else None
        if isinstance(source, exp.Table) and schema is not None and source.name in schema.tables:
            names |= set(schema.tables[source.name].columns)
        elif isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select):
            names |= set(source.this.named_selects)
    return names


def _resolved(key: exp.Expression, aliases: dict[str, exp.Expression],
              expressions: list[exp.Expression], inputs: frozenset[str] | set[str] = frozenset()) -> exp.Expression:
    """A grouping key as the expression it names: an output column's alias or position, as PostgreSQL reads them;
    a name among `inputs` (the FROM clause's columns) is that column, which PostgreSQL reads first."""
    if isinstance(key, exp.Column) and not key.table and key.name in aliases and key.name not in inputs:
        return aliases[key.name]
    if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.this) <= len(expressions):
        chosen = expressions[int(key.this) - 1]
        return chosen.this if isinstance(chosen, exp.Alias) else chosen
    return key


def _sets_of(element: exp.Expression) -> list[list[exp.Expression]]:
    """The grouping sets one GROUP BY element stands for (a plain key: one set of itself)."""
    if isinstance(element, exp.Rollup):
        keys = list(element.expressions)
        return [keys[:n] for n in range(len(keys), -1, -1)]
    if isinstance(element, exp.Cube):
        keys = list(element.expressions)
        return [[k for k, keep in zip(keys, mask, strict=True) if keep]
                for mask in itertools.product((True, False), repeat=len(keys))]
    if isinstance(element, exp.GroupingSets):
        sets = []
        for item in element.expressions:
            if isinstance(item, GROUPINGS):
                raise UnsupportedQuery("nested GROUPING SETS, ROLLUP or CUBE are not supported",
                                       "list the grouping sets flat: GROUP BY GROUPING SETS ((a), (a, b), ())")
            sets.append(list(item.expressions) if isinstance(item, exp.Tuple)
                        else [item.this] if isinstance(item, exp.Paren) else [item])
        return sets
    return [[element]]


def _in_set(expression: exp.Expression, present: set[str], keys: dict[str, exp.Expression]) -> exp.Expression:
    """A SELECT expression within one grouping set: a key the set leaves out is NULL, GROUPING(k, …) the bits of
    the keys left out, each under the name PostgreSQL gives the column. An expression of a left-out key outside
    aggregates is computed on its NULL, as PostgreSQL does (`COALESCE(category, 'all')` labels the total row);
    aggregates read each row's own value."""
    name = output_name(expression)
    value = expression.this if isinstance(expression, exp.Alias) else expression
    if _key_text(value) in keys and _key_text(value) not in present:
        return exp.alias_(exp.Null(), name)
    changed = value.copy()
    for grouping in list(changed.find_all(exp.Grouping)):
        bits = 0
        for argument in grouping.expressions:
            bits = bits * 2 + (_key_text(argument) not in present)
        if grouping is changed:
            changed = exp.Literal.number(bits)
        else:
            grouping.replace(exp.Literal.number(bits))
    for sql, key in keys.items():
        if sql not in present:
            # (inside an aggregate, its argument, FILTER or WITHIN GROUP, the key is each row's own)
            for use in [c for c in changed.find_all(type(key))
                        if _key_text(c) == sql and c.find_ancestor(*AGGREGATES, exp.Filter) is None]:
                if use is changed:
                    changed = exp.Null()
                else:
                    use.replace(exp.Null())
    return exp.alias_(changed, name) if to_sql(changed) != to_sql(value) else expression.copy()


def _key_text(node: exp.Expression) -> str:
    """A grouping key's SQL with its columns unqualified: `GROUP BY ROLLUP (category)` names the column the SELECT
    list spells `v.category`. (Another table's column of that name in the list is no key: the parts that keep
    the key group by it alone, and the analysis refuses them.)"""
    return to_sql(node.transform(lambda n: exp.column(n.name) if isinstance(n, exp.Column) and n.table else n))


def _outer_order(tree: exp.Expression, names: list[str],
                 expressions: list[exp.Expression]) -> tuple[tuple[tuple[int, bool, bool], ...], int | None, int]:
    """ORDER BY, LIMIT and OFFSET of the whole statement, as output columns: a position, an output name, or an
    expression of the SELECT list."""
    order = []
    spelled = [to_sql(e.this if isinstance(e, exp.Alias) else e) for e in expressions]
    for ordered in (tree.args["order"].expressions if tree.args.get("order") else []):
        target = ordered.this
        if isinstance(target, exp.Literal) and not target.is_string and target.is_int:
            column = int(target.this) - 1
        elif isinstance(target, exp.Column) and not target.table and target.name in names:
            column = names.index(target.name)
        elif to_sql(target) in spelled:
            column = spelled.index(to_sql(target))
        else:
            raise UnsupportedQuery(f"ORDER BY {to_sql(target)} of a UNION or grouping sets is not an output column",
                                   "order by an output column's name or position")
        if not 0 <= column < len(names):
            raise UnsupportedQuery(f"ORDER BY position {column + 1} is not in the select list",
                                   "ORDER BY a column's name, or its position from 1 to the number of columns selected")
        descending = bool(ordered.args.get("desc"))
        nulls_first = ordered.args.get("nulls_first")
        order.append((column, descending, descending if nulls_first is None else bool(nulls_first)))
    return tuple(order), limit_clause(tree, "limit"), limit_clause(tree, "offset") or 0
