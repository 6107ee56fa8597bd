"""A window over each unit's rows inside a subquery, spelled as a per-unit subquery joined on the unit:

    SELECT bucket, COUNT(DISTINCT person_id) FROM (SELECT person_id, CASE WHEN SUM(amount) OVER (PARTITION BY
        person_id) > 500 THEN 'hi' ELSE 'lo' END AS bucket FROM visits) t GROUP BY 1

is

    SELECT bucket, COUNT(DISTINCT person_id) FROM (SELECT person_id, CASE WHEN dpsql_w.dpsql_w0 > 500 THEN 'hi'
        ELSE 'lo' END AS bucket FROM visits JOIN (SELECT person_id AS dpsql_w_unit, SUM(amount) AS dpsql_w0
        FROM visits GROUP BY person_id) AS dpsql_w ON dpsql_w.dpsql_w_unit = person_id) t GROUP BY 1

An aggregate over a whole partition (no ORDER BY, no frame) is the same value on each of the partition's rows: the
aggregate of the rows the subquery reads with that unit, which the joined subquery computes over the same FROM,
joins and WHERE. Only a partition by the unit column of a declared table, without outer joins (a row without a unit
is then in no partition the analysis keeps, and the join drops it too); the analysis then reads the joined subquery
as a table of one row per unit (`analysis.derived`).

Any other window over each unit's rows (each person's first visit by ROW_NUMBER(), the days since their last visit
by LAG, a running total) is computed in a subquery of its own over the table, its windows as named columns:

    SELECT category, COUNT(*) FROM (SELECT v.*, ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY day) AS rn
        FROM visits v) t WHERE rn = 1 GROUP BY category

is

    SELECT category, COUNT(*) FROM (SELECT v.visit_id, …, v.rn AS rn FROM (SELECT v.visit_id, v.person_id, …,
        ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY day) AS rn FROM visits v) AS v) t WHERE rn = 1
        GROUP BY category

(a window inside an expression, `day - LAG(day) OVER (…)`, is the source's column dpsql_win0, …), which the
analysis reads as the table with more columns (`analysis.windowed`, which also breaks the ties of rows such windows
order): each of its rows is a row of the table, its window values a function of its unit's rows alone. The
subquery may join the table to tables of one row per unit on the unit (each person's visits and their one row of
people): a unit's rows then all meet its one row or none, so the window reads the same rows in the source, which
takes the WHERE's conditions on the table's columns, while those on the joined tables' stay outside (they keep or
drop a unit's rows together). A subquery that already has that shape is read as it is. Anything else is left as
written (and refused where it was).

PostgreSQL's DISTINCT ON a unit in such a subquery is first spelled as ROW_NUMBER() = 1 (`distinct_on_as_row_numbers`),
and a unit's first value by an ordered array, `(array_agg(c ORDER BY k))[1]` in a subquery grouped by the unit, as
the MIN of FIRST_VALUE(c) over its rows (`first_of_ordered_arrays`).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from dpsql.schema import PrivacySchema, Table
from dpsql.sql.query import AGGREGATES, operands, to_sql, written_as
from dpsql.sql.refuse import WINDOW_FUNCTIONS
from dpsql.sql.shape import BEYOND_WHERE, is_windowed_source, tables_read

WINDOWED = "dpsql_w"  # the joined subquery's alias, its unit column's and its values' names
FIRST = "dpsql_first"  # a unit's rows numbered for DISTINCT ON
FIRST_VALUES = "dpsql_firstv"  # a unit's first value of a column, for (array_agg(c ORDER BY k))[1]: dpsql_firstv0, …
WINDOW_COLUMN = "dpsql_win"  # a windowed source's column for a window inside an expression: dpsql_win0, …
LATERAL_UNIT, LATERAL_RANK = "dpsql_lateral_unit", "dpsql_lateral_n"  # a LATERAL subquery's unit and row numbers


def unit_windows_as_joins(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` with each subquery in FROM or JOIN (not `tree` itself: its windows run over the released rows) that
    computes aggregates over whole partitions by the unit reading them from a per-unit subquery joined to it."""
    return _each_subquery(tree, schema, _joined)


def _each_subquery(tree: exp.Select, schema: PrivacySchema,
                   rewrite: Callable[[exp.Select, PrivacySchema], None]) -> exp.Select:
    """`tree` with `rewrite` applied to the SELECT of each of its subqueries and WITH queries (none under row-level
    privacy, where each row is a unit of its own)."""
    if schema.row_level:
        return tree
    for select in list(tree.find_all(exp.Select)):
        if select is not tree and isinstance(select.parent, exp.Subquery | exp.CTE):
            rewrite(select, schema)
    return tree


def _joined(select: exp.Select, schema: PrivacySchema) -> None:
    if any(select.args.get(k) for k in ("group", "having", "distinct", "limit", "offset", "with_")) \
            or select.args.get("from_") is None or any(join.side for join in select.args.get("joins") or []):
        return  # (under an outer join, a NULL unit is a partition of its own, which the join would drop)
    windows = [w for item in select.expressions for w in item.find_all(exp.Window)]
    if not all(_whole_partition(w) for w in windows):
        return  # a windowed source computes them all (`unit_windows_as_sources`)
    units = {_unit(w.args["partition_by"][0], select, schema) for w in windows}
    if not windows or len(units) != 1 or None in units or any(n.name.startswith(WINDOWED)
                                                             for n in select.find_all(exp.Identifier)):
        return
    unit = units.pop()
    per_unit = exp.select(exp.alias_(unit.copy(), f"{WINDOWED}_unit")).from_(select.args["from_"].this.copy())
    for join in select.args.get("joins") or []:
        per_unit = per_unit.join(join.copy())
    if select.args.get("where"):
        per_unit.set("where", select.args["where"].copy())
    joined = written_as(exp.Subquery(this=per_unit, alias=exp.TableAlias(this=exp.to_identifier(WINDOWED))),
                        *windows)
    for i, window in enumerate(windows):
        per_unit.select(exp.alias_(window.this.copy(), f"{WINDOWED}{i}"), copy=False)
        window.replace(written_as(exp.column(f"{WINDOWED}{i}", table=WINDOWED), window))
    per_unit.set("group", exp.Group(expressions=[unit.copy()]))
    select.join(joined, on=written_as(exp.column(f"{WINDOWED}_unit", table=WINDOWED), unit).eq(unit.copy()),
                copy=False)


def _whole_partition(window: exp.Window) -> bool:
    """An aggregate over its whole partition of one column: no ORDER BY, no frame."""
    partition = window.args.get("partition_by") or []
    return (isinstance(window.this, tuple(AGGREGATES)) and len(partition) == 1 and isinstance(partition[0], exp.Column)
            and not window.args.get("order") and not window.args.get("spec") and not window.this.find(exp.Window))


def _unit(column: exp.Column, select: exp.Select, schema: PrivacySchema) -> exp.Column | None:
    """`column` where it is the unit column of a declared private table `select` reads."""
    tables = {t.alias_or_name: schema.tables.get(t.name.lower()) for t in tables_read(select)}
    owners = [a for a, t in tables.items() if t is not None and not t.public and t.unit_column == column.name
              and (not column.table or column.table == a)]
    return column if len(owners) == 1 and (column.table or len(tables) == 1) else None


def unit_windows_as_sources(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` with each subquery in FROM or JOIN (not `tree` itself) whose windows run over each unit's rows of its
    one table reading that table from a windowed source: a subquery of the table's declared columns and those
    windows, the subquery's WHERE inside it (the windows read the rows it keeps)."""
    return _each_subquery(tree, schema, _sourced)


def _sourced(select: exp.Select, schema: PrivacySchema) -> None:
    windows = [w for item in select.expressions for w in item.find_all(exp.Window)]
    source = _windowed_table(select, windows)
    if not windows or not isinstance(source, exp.Table) or source.db or is_windowed_source(select) \
            or any(select.args.get(k) for k in BEYOND_WHERE if k != "joins"):
        return
    declared = schema.tables.get(source.name.lower())
    keys = unit_partition_keys(declared) if declared is not None and not declared.public else set()
    alias = source.alias_or_name
    outside = [n for n in select.find_all(*AGGREGATES) if n.find_ancestor(exp.Select) is select
               and not (isinstance(n.parent, exp.Window) and n is n.parent.this)]
    mine = _owned_by_source(select, schema, source, declared) if keys else None
    if mine is None or outside or not all(_movable(w, keys, mine) for w in windows):
        return
    inside, kept = _where_split(select, mine)
    if inside is None:
        return
    columns = list(declared.columns)
    inner = exp.select(*(exp.column(c, table=alias) for c in columns)).from_(source.copy())
    if inside:
        inner.where(exp.and_(*(c.copy() for c in inside)), copy=False)
    select.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
    taken = set(columns)
    for i, window in enumerate(windows):
        # named as the analyst named it where it stands alone (refusals and notes then read `v.rn`)
        name = window.parent.alias if isinstance(window.parent, exp.Alias) else f"{WINDOW_COLUMN}{i}"
        while name in taken:
            name = f"{WINDOW_COLUMN}{i}" if name != f"{WINDOW_COLUMN}{i}" else f"{name}_"
        taken.add(name)
        window_copy = window.copy()
        for column in window_copy.find_all(exp.Column):  # (the source reads its one table)
            column.set("table", exp.to_identifier(alias))
        inner.select(exp.alias_(window_copy, name), copy=False)
        window.replace(written_as(exp.column(name, table=alias), window))
    for item in list(select.expressions):  # the table's columns, not the windows dpsql adds to its source
        if _star_of(item, alias):
            item.replace(exp.Tuple(expressions=[exp.column(c, table=alias) for c in columns]))
    select.set("expressions", [e for item in select.expressions
                               for e in (item.expressions if isinstance(item, exp.Tuple) else [item])])
    source.replace(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(alias))))


def _star_of(item: exp.Expression, alias: str) -> bool:
    """`*`, or `alias.*`."""
    return isinstance(item, exp.Star) or isinstance(item, exp.Column) and isinstance(item.this, exp.Star) \
        and item.table in ("", alias)


def _windowed_table(select: exp.Select, windows: list[exp.Window]) -> exp.Expression | None:
    """The source whose rows `windows` read: the one their columns name, or with no qualifier the FROM table."""
    named = {c.table for w in windows for c in w.find_all(exp.Column)} - {""}
    sources = [select.args["from_"].this] if select.args.get("from_") else []
    sources += [join.this for join in select.args.get("joins") or []]
    if not named:
        return sources[0] if sources else None
    return next((s for s in sources if {s.alias_or_name} == named), None)


def _owned_by_source(select: exp.Select, schema: PrivacySchema, source: exp.Table,
                     table: Table) -> Callable[[exp.Column], bool] | None:
    """Whether a column of `select` is its windowed table's (`source`), where its joins leave each unit's rows of that
    table as they are: only tables of one row per unit, joined on the unit columns alone (`visits v JOIN people p ON
    p.person_id = v.person_id`, or USING; LEFT where the windowed table is the FROM one; inner where it is the one
    joined, the only join), so that a unit's rows all meet its one row or none, and a window over them reads the
    same rows with or without the join. None for any other join, and for `*` over a join (it would read the
    windows too)."""
    alias = source.alias_or_name
    joins = select.args.get("joins") or []
    if not joins:
        return lambda column: column.table in ("", alias)
    first = select.args["from_"].this
    if source is not first and (len(joins) != 1 or joins[0].side or joins[0].kind not in ("", "INNER")):
        return None
    others: set[str] = set()
    using: set[str] = set()
    for join in joins:
        other = first if join.this is source else join.this
        held = schema.tables.get(other.name.lower()) if isinstance(other, exp.Table) else None
        if held is None or held.public or held.unit_column is None or held.max_rows_per_unit != 1 \
                or table.unit_column is None or other.db or join.side not in ("", "LEFT") \
                or join.kind not in ("", "INNER", "OUTER") or not _on_units(join, source, table, other, held):
            return None
        others |= set(held.columns)
        using |= {u.name for u in join.args.get("using") or []}
    if any(isinstance(item, exp.Star) for item in select.expressions):
        return None
    return lambda column: column.table == alias or not column.table and column.name in table.columns and (
        column.name not in others or column.name in using)


def _on_units(join: exp.Join, source: exp.Table, table: Table, other: exp.Table, held: Table) -> bool:
    """Whether `join` meets the windowed table and `other` (of one row per unit) on the unit alone: ON a.unit =
    j.unit, or USING (unit)."""
    using = join.args.get("using") or []
    if using:
        return [u.name for u in using] == [table.unit_column] == [held.unit_column]
    on = join.args.get("on")
    sides = {(c.table, c.name) for c in (on.this, on.expression)} if isinstance(on, exp.EQ) and all(
        isinstance(c, exp.Column) for c in (on.this, on.expression)) else set()
    return sides == {(source.alias_or_name, table.unit_column), (other.alias_or_name, held.unit_column)}


def _where_split(select: exp.Select, mine: Callable[[exp.Column], bool]) -> tuple[list | None, list]:
    """`select`'s WHERE as the conditions on its FROM table's columns (its windowed source filters its rows with
    them before its windows read them) and those on its joined tables' alone, which keep or drop a unit's rows
    together (None: a condition reads both, or a subquery)."""
    where = select.args.get("where")
    if where is None:
        return [], []
    if where.find(exp.Select):
        return None, []
    inside, kept = [], []
    for condition in operands(where.this):
        owners = {mine(c) for c in condition.find_all(exp.Column)}
        if owners == {True, False}:
            return None, []
        (kept if owners == {False} else inside).append(condition)
    return inside, kept


def unit_partition_keys(table: Table) -> set[str]:
    """The columns of a private table whose value fixes one unit: its unit column, or for a child table its parent
    key (the rows of one visit are one person's). A window partitioned by one of them reads one unit's rows."""
    return {table.unit_column} if table.unit_column else {table.parent.column} if table.parent else set()


def _movable(window: exp.Window, keys: set[str], mine: Callable[[exp.Column], bool]) -> bool:
    """A window over partitions within one unit (its PARTITION BY holds a column that fixes the unit), of a function
    a windowed source computes, over plain columns of the source's table (`mine`)."""
    partition = window.args.get("partition_by") or []
    order = window.args["order"].expressions if window.args.get("order") else []
    function = window.this
    arguments = [function.this] if isinstance(function.this, exp.Expression) and not isinstance(
        function, exp.Ntile) else []
    return (isinstance(function, WINDOW_FUNCTIONS) and not window.args.get("alias")
            and all(isinstance(c, exp.Column) for c in partition)
            and any(c.name in keys for c in partition) and all(mine(c) for c in window.find_all(exp.Column))
            and all(isinstance(o.this, exp.Column) for o in order)
            and all(isinstance(a, exp.Column | exp.Star) for a in arguments) and not window.find(exp.Select)
            and _constant_or_column(function.args.get("default")))


def _constant_or_column(default: exp.Expression | None) -> bool:
    """A LAG's or LEAD's default that a windowed source computes: none, NULL, a constant, or a column (of its
    table, as every column of the window)."""
    constant = default.this if isinstance(default, exp.Neg) else default
    return default is None or isinstance(default, exp.Null | exp.Column) or isinstance(constant, exp.Literal)


def distinct_on_as_row_numbers(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` with each subquery in FROM or JOIN that keeps one row per unit by DISTINCT ON (each person's first or
    latest row: `SELECT DISTINCT ON (person_id) person_id, category FROM visits ORDER BY person_id, day DESC`)
    written as the rows whose ROW_NUMBER() over the unit's rows, in the rest of its ORDER BY, is 1 (which
    `unit_windows_as_sources` then computes in a windowed source). PostgreSQL keeps the first row of each key in
    that order, any of the rows that tie on it."""
    return _each_subquery(tree, schema, _first_rows)


def _first_rows(select: exp.Select, schema: PrivacySchema) -> None:
    source = select.args["from_"].this if select.args.get("from_") else None
    distinct = select.args.get("distinct")
    if distinct is None or distinct.args.get("on") is None or not isinstance(source, exp.Table) or any(
            select.args.get(k) for k in ("joins", "group", "having", "limit", "offset", "with_", "qualify", "windows")):
        return
    declared = schema.tables.get(source.name.lower())
    if declared is None or declared.public or not unit_partition_keys(declared):
        return
    columns = [exp.column(c, table=source.alias_or_name) for c in declared.columns]
    outputs = [e for item in select.expressions for e in (  # a * is the table's declared columns
        columns if isinstance(item, exp.Star) or isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        else [item])]
    items = {item.alias: item.this for item in outputs if isinstance(item, exp.Alias)}
    keys = [_column_of(k, outputs, items) for k in select.args["distinct"].args["on"].expressions]
    order = [_ordered_by(o, outputs, items) for o in (select.args["order"].expressions
                                                      if select.args.get("order") else [])]
    if None in keys or None in order or not all(isinstance(item, exp.Column | exp.Alias) for item in outputs) \
            or not any(k.name in unit_partition_keys(declared) and k.table in ("", source.alias_or_name) for k in keys):
        return
    if order and {to_sql(o.this) for o in order[:len(keys)]} != {to_sql(k) for k in keys}:
        return  # (PostgreSQL requires the ORDER BY to lead with the DISTINCT ON keys)
    window = exp.Window(this=exp.RowNumber(), partition_by=[k.copy() for k in keys],
                        order=exp.Order(expressions=order[len(keys):]) if order[len(keys):] else None)
    numbered = exp.select(*(item.copy() for item in outputs), exp.alias_(window, FIRST)).from_(source.copy())
    if select.args.get("where"):
        numbered.set("where", select.args["where"].copy())
    name = source.alias_or_name  # the rows read under the table's own name, as notes and refusals show them
    first = exp.select(*(exp.column(item.alias_or_name, table=name) for item in outputs)).from_(
        exp.Subquery(this=numbered, alias=exp.TableAlias(this=exp.to_identifier(name))))
    select.replace(first.where(exp.column(FIRST, table=name).eq(exp.Literal.number(1))))


def first_of_ordered_arrays(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` with each subquery grouped by the unit alone that picks a unit's first value by an ordered array
    (each person's first category: `SELECT person_id, (array_agg(category ORDER BY day))[1] AS first_cat FROM
    visits GROUP BY person_id`) reading that value as MIN(FIRST_VALUE(category) OVER (PARTITION BY person_id
    ORDER BY day)) from its rows with that window beside them (which `unit_windows_as_sources` then computes in a
    windowed source): the window holds one value on all of a unit's rows, the first in that order, NULL where
    that row's is, as the array's first element. Only the first element, of a column, ordered by columns."""
    return _each_subquery(tree, schema, _firsts_as_windows)


def _firsts_as_windows(select: exp.Select, schema: PrivacySchema) -> None:
    source = select.args["from_"].this if select.args.get("from_") else None
    group = select.args["group"].expressions if select.args.get("group") else []
    firsts = [b for item in select.expressions for b in item.find_all(exp.Bracket) if _first_of_array(b)]
    if not firsts or not isinstance(source, exp.Table) or source.db or len(group) != 1 or select.find(exp.Window) \
            or any(select.args.get(k) for k in ("joins", "distinct", "with_", "qualify", "windows")):
        return
    declared = schema.tables.get(source.name.lower())
    alias = source.alias_or_name
    outputs = list(select.expressions)
    unit = _column_of(group[0], outputs, {i.alias: i.this for i in outputs if isinstance(i, exp.Alias)})
    if declared is None or declared.public or unit is None or unit.name not in unit_partition_keys(declared) \
            or unit.table not in ("", alias):
        return
    rows = exp.select(exp.column(exp.Star(), table=alias)).from_(source.copy())
    if select.args.get("where"):
        rows.set("where", select.args["where"].copy())
        select.set("where", None)
    for i, first in enumerate(firsts):
        ordered = first.this.unnest().this
        window = exp.Window(this=exp.FirstValue(this=ordered.this.copy()), partition_by=[unit.copy()],
                            order=exp.Order(expressions=[o.copy() for o in ordered.expressions]))
        rows.select(exp.alias_(window, f"{FIRST_VALUES}{i}"), copy=False)
        first.replace(exp.Min(this=written_as(exp.column(f"{FIRST_VALUES}{i}", table=alias), first)))
    source.replace(exp.Subquery(this=rows, alias=exp.TableAlias(this=exp.to_identifier(alias))))


def _first_of_array(bracket: exp.Bracket) -> bool:
    """`(array_agg(c ORDER BY k, …))[1]`: a column's first value in an order of columns."""
    aggregate = bracket.this.unnest()
    ordered = aggregate.this if isinstance(aggregate, exp.ArrayAgg) else None
    index = bracket.expressions
    return (isinstance(ordered, exp.Order) and isinstance(ordered.this, exp.Column)
            and all(isinstance(o.this, exp.Column) for o in ordered.expressions) and len(index) == 1
            and isinstance(index[0], exp.Literal) and index[0].is_int and int(index[0].this) == 0
            and not aggregate.args.get("filter"))


def _ordered_by(ordered: exp.Ordered, outputs: list[exp.Expression], aliases: dict[str, exp.Expression]
                ) -> exp.Ordered | None:
    """An ORDER BY key as the column it orders by."""
    key = _column_of(ordered.this, outputs, aliases)
    if key is None:
        return None
    copy = ordered.copy()
    copy.set("this", key.copy())
    return copy


def _column_of(key: exp.Expression, outputs: list[exp.Expression], aliases: dict[str, exp.Expression]
               ) -> exp.Column | None:
    """A DISTINCT ON or ORDER BY key as the column it names, an output's position or name read as the output."""
    if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.this) <= len(outputs):
        key = outputs[int(key.this) - 1].unalias()
    elif isinstance(key, exp.Column) and not key.table and key.name in aliases:
        key = aliases[key.name]
    return key if isinstance(key, exp.Column) else None


def lateral_rows_as_row_numbers(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """A LATERAL subquery of each unit's first rows (each person's latest visit: `people p LEFT JOIN LATERAL (SELECT
    amount FROM visits v WHERE v.person_id = p.person_id ORDER BY day DESC LIMIT 1) t ON true`) joined as those rows
    numbered by ROW_NUMBER() over each unit's rows in its ORDER BY: `LEFT JOIN (SELECT amount, v.person_id AS
    dpsql_lateral_unit, ROW_NUMBER() OVER (PARTITION BY v.person_id ORDER BY day DESC) AS dpsql_lateral_n FROM
    visits v) t ON t.dpsql_lateral_unit = p.person_id AND t.dpsql_lateral_n <= 1`, the same rows (which
    `unit_windows_as_sources` then reads from a windowed source). Only a subquery of one table tied to the outer row
    by its unit column alone, with a constant LIMIT, joined ON true; anything else is left as written (refused)."""
    if schema.row_level:
        return tree
    for select in list(tree.find_all(exp.Select)):
        for join in list(select.args.get("joins") or []):
            if isinstance(join.this, exp.Lateral):
                _lateral_as_join(join, schema)
    return tree


def _lateral_as_join(join: exp.Join, schema: PrivacySchema) -> None:
    lateral, on = join.this, join.args.get("on")
    inner = lateral.this.this if isinstance(lateral.this, exp.Subquery) else None
    if not isinstance(inner, exp.Select) or not lateral.alias or lateral.args.get("view") \
            or lateral.args.get("ordinality") or (join.side or "").upper() not in ("", "LEFT") \
            or on is not None and not (isinstance(on, exp.Boolean) and on.this is True):
        return
    source = inner.args["from_"].this if inner.args.get("from_") else None
    limit = inner.args.get("limit")
    rows = limit.expression if isinstance(limit, exp.Limit) else None
    if not isinstance(source, exp.Table) or not (isinstance(rows, exp.Literal) and rows.is_int) or any(
            inner.args.get(k) for k in ("joins", "group", "having", "distinct", "offset", "with_", "windows")):
        return
    declared = schema.tables.get(source.name.lower())
    alias = source.alias_or_name
    if declared is None or declared.public or declared.unit_column is None:
        return
    conditions = operands(inner.args["where"].this) if inner.args.get("where") else []
    outside = [c for c in conditions if any(col.table not in ("", alias) for col in c.find_all(exp.Column))]
    tie = _unit_tie(outside[0], declared.unit_column, alias) if len(outside) == 1 else None
    items = {item.alias: item.this for item in inner.expressions if isinstance(item, exp.Alias)}
    order = [_ordered_by(o, inner.expressions, items) for o in (inner.args["order"].expressions
                                                                if inner.args.get("order") else [])]
    if tie is None or None in order or any(col.table not in ("", alias) for item in inner.expressions
                                           for col in item.find_all(exp.Column)):
        return
    unit = exp.column(declared.unit_column, table=alias)
    window = exp.Window(this=exp.RowNumber(), partition_by=[unit.copy()],
                        order=exp.Order(expressions=order) if order else None)
    numbered = exp.select(*(item.copy() for item in inner.expressions), exp.alias_(unit, LATERAL_UNIT),
                          exp.alias_(window, LATERAL_RANK)).from_(source.copy())
    kept = [c.copy() for c in conditions if c is not outside[0]]
    if kept:
        numbered.set("where", exp.Where(this=exp.and_(*kept)))
    name = lateral.alias
    tied = exp.and_(exp.column(LATERAL_UNIT, table=name).eq(tie.copy()),
                    exp.LTE(this=exp.column(LATERAL_RANK, table=name), expression=rows.copy()))
    join.replace(exp.Join(this=exp.Subquery(this=numbered, alias=exp.TableAlias(this=exp.to_identifier(name))),
                          on=tied, side=join.side or None))


def _unit_tie(condition: exp.Expression, unit: str, alias: str) -> exp.Column | None:
    """The outer column a LATERAL subquery's unit column is equal to in `condition` (`v.person_id = p.person_id`)."""
    if not isinstance(condition, exp.EQ):
        return None
    for mine, other in ((condition.this, condition.expression), (condition.expression, condition.this)):
        if isinstance(mine, exp.Column) and mine.name == unit and mine.table in ("", alias) \
                and isinstance(other, exp.Column) and other.table not in ("", alias):
            return other
    return None
