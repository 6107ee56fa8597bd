"""A per-unit subquery joined to a table of one row per unit, spelled as that subquery with the row joined inside:

    SELECT p.sex, AVG(t.spend) FROM people p
    JOIN (SELECT person_id, SUM(amount) AS spend FROM visits GROUP BY person_id) t ON t.person_id = p.person_id
    GROUP BY p.sex

is

    SELECT t.sex, AVG(t.spend) FROM (SELECT visits.person_id, SUM(visits.amount) AS spend, p.sex AS sex
        FROM visits JOIN people p ON p.person_id = visits.person_id GROUP BY visits.person_id, p.sex) t
    GROUP BY t.sex

which the analysis reads as one row per unit (`analysis.derived`: a key of a table whose row the unit's row
determines). Each group of the subquery is one unit's rows, and the joined table holds at most one row for that
unit, so the join inside adds that row's columns to the unit's rows and changes no aggregate. Where the data
breaks the declared one row per unit, the bounded subquery still keeps one row per unit (it groups by the unit
alone), so the guarantee holds whatever the data.

Runs after qualifying, on columns resolved to their tables. Joined INNER (either side first), with the
subquery's rows preserved (`t LEFT JOIN people p`), or with every unit's row preserved (`people p LEFT JOIN t`,
where t reads one table: it then reads that table LEFT JOINed to the units' rows, and the outer query sees its
values only where the unit has rows), on the subquery's unit column equal to the table's; anything else is left as
written (and refused where it was).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.schema import PrivacySchema, Table
from dpsql.sql.query import inside, replace_keeping_precedence


def unit_row_joined_inside(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` with a table of one row per unit, joined to its per-unit subquery, moved into that subquery. The two
    are the query's first two sources; the joins after them are kept (a public table joined to the row's
    columns reads them from the subquery)."""
    joins = tree.args.get("joins") or []
    if schema.row_level or not joins or tree.args.get("from_") is None:
        return tree
    join = joins[0]
    first, second = tree.args["from_"].this, join.this
    for subquery_side, table_side in ((first, second), (second, first)):
        subquery = _grouped_source(tree, subquery_side)
        table = _unit_rows_table(schema, table_side)
        kind = _join_kind(join, subquery_side is first)
        if subquery is None or table is None or kind is None:
            continue
        unit = _joined_unit(join, subquery_side.alias_or_name, table_side.alias_or_name, table, subquery)
        if unit is not None and (kind != EVERY_UNIT or _reads_one_table(subquery, unit[1])):
            return _moved_inside(tree, subquery_side, subquery, table_side, table, unit, kind, schema)
    return tree


def _grouped_source(tree: exp.Select, source: exp.Expression) -> exp.Select | None:
    """The grouped SELECT that `source` reads (a subquery, or a WITH query read once), if simple enough to take a
    join: no HAVING, ORDER BY, LIMIT, DISTINCT, window or subquery of its own."""
    select = None
    if isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select):
        select = source.this
    elif isinstance(source, exp.Table) and tree.args.get("with_") and not source.db:
        ctes = [c for c in tree.args["with_"].expressions if c.alias_or_name == source.name]
        readers = [t for t in tree.find_all(exp.Table) if t.name == source.name and not t.db]
        if len(ctes) == 1 and len(readers) == 1 and isinstance(ctes[0].this, exp.Select):
            select = ctes[0].this
    if select is None or not select.args.get("group") or select.find(exp.Window) or any(
            select.args.get(k) for k in ("having", "order", "limit", "offset", "distinct", "with_")) \
            or any(n is not select for n in select.find_all(exp.Select)):
        return None
    return select


def _unit_rows_table(schema: PrivacySchema, source: exp.Expression) -> Table | None:
    """The declared private table `source` reads, if it holds at most one row per unit and names the unit."""
    if not isinstance(source, exp.Table) or source.db and source.db.lower() != "public":
        return None
    table = schema.tables.get(source.name.lower())
    if table is None or table.public or table.unit_column is None or table.max_rows_per_unit != 1:
        return None
    return table


INNER, SUBQUERY_ROWS, EVERY_UNIT = "inner", "the subquery's rows", "every unit's row"


def _join_kind(join: exp.Join, subquery_first: bool) -> str | None:
    """INNER; SUBQUERY_ROWS, a LEFT JOIN that keeps the subquery's rows (read first); EVERY_UNIT, a LEFT JOIN that
    keeps the table's, every unit's row, the subquery's values NULL where it has no row for the unit; else None."""
    side, kind = ((join.args.get(k) or "").upper() for k in ("side", "kind"))
    if kind not in ("", "INNER") or join.args.get("using") or side not in ("", "LEFT"):
        return None
    return INNER if side == "" else SUBQUERY_ROWS if subquery_first else EVERY_UNIT


def _reads_one_table(select: exp.Select, unit_column: exp.Column) -> bool:
    """A subquery over one table, grouped by its unit column alone, with no subquery in its WHERE: one that can
    read its table LEFT JOINed to the units' rows instead."""
    group = select.args["group"].expressions
    return isinstance(select.args["from_"].this, exp.Table) and not select.args.get("joins") \
        and len(group) == 1 and group[0].sql() == unit_column.sql()


def _joined_unit(join: exp.Join, subquery: str, table: str, declared: Table,
                 select: exp.Select) -> tuple[str, exp.Column, list[exp.Expression]] | None:
    """The subquery's column the join equates with the table's unit column (its output name and the grouped
    column it selects), and the join's other conditions (only an inner join may have any: they filter the joined
    rows as WHERE does); None if the join says anything else."""
    conditions = list((join.args.get("on") or exp.true()).flatten()) if isinstance(join.args.get("on"), exp.And) \
        else [join.args.get("on")]
    for on in conditions:
        if not isinstance(on, exp.EQ) or not all(isinstance(side, exp.Column) for side in (on.this, on.expression)):
            continue
        sides = {on.this.table: on.this.name, on.expression.table: on.expression.name}
        if set(sides) != {subquery, table} or sides[table] != declared.unit_column:
            continue
        output = next((e for e in select.expressions if e.alias_or_name == sides[subquery]), None)
        column = output.unalias() if output is not None else None
        grouped = {g.sql() for g in select.args["group"].expressions}
        others = [c for c in conditions if c is not on]
        if isinstance(column, exp.Column) and column.sql() in grouped and not (others and join.side):
            return sides[subquery], column, others
    return None


def _moved_inside(tree: exp.Select, subquery_side: exp.Expression, select: exp.Select, table_side: exp.Table,
                  declared: Table, unit: tuple[str, exp.Column, list[exp.Expression]], kind: str,
                  schema: PrivacySchema) -> exp.Select:
    """`tree` reading the subquery alone, with the table joined inside it on the unit (and the public tables
    joined to that table's row after it), and the columns of those tables the outer query reads selected and
    grouped by there (under their own names where free). Where the join keeps every unit's row, the subquery
    reads its table LEFT JOINed to the units' rows, and the outer query reads its values only where the unit has
    rows (`_every_unit_inside`)."""
    alias = subquery_side.alias_or_name
    unit_name, unit_column, conditions = unit
    later = _public_tables_joined(tree.args["joins"][1:], {table_side.alias_or_name}, schema)
    sources = [table_side, *(j.this for j in later)]
    names = {a.name for a in select.find_all(exp.TableAlias)} | {t.name for t in select.find_all(exp.Table)}
    renamed: dict[str, str] = {}
    for source in sources:
        old = source.alias_or_name
        if sum(a.name == old and not inside(a, select) for a in tree.find_all(exp.TableAlias)) > 1:
            return tree  # another source of the query goes by the table's name: left as written
        renamed[old] = _fresh(old, names)
        names.add(renamed[old])
    readers = [c for c in tree.find_all(exp.Column) if c.table in renamed and not inside(c, select)
               and not any(inside(c, j) for j in later)]
    taken = {e.alias_or_name for e in select.expressions}
    passed = {(table_side.alias_or_name, declared.unit_column): unit_name}  # a column -> the output holding it
    for column in readers:
        if (column.table, column.name) not in passed:
            name = _fresh(column.name if column.name not in taken else f"{column.table}_{column.name}", taken)
            taken.add(name)
            passed[(column.table, column.name)] = name
            value = exp.column(column.name, renamed[column.table])
            select.select(exp.alias_(value, name), copy=False)
            select.args["group"].append("expressions", value.copy())
    on = exp.EQ(this=exp.column(declared.unit_column, renamed[table_side.alias_or_name]), expression=unit_column.copy())
    if kind == EVERY_UNIT:
        _every_unit_inside(tree, alias, select, _renamed(table_side, renamed), on, unit_name, taken)
    else:
        select.join(_renamed(table_side, renamed), on=on, join_type="LEFT" if kind == SUBQUERY_ROWS else None,
                    copy=False)
    for inner_join in later:
        select.append("joins", _renamed(inner_join, renamed))
    for column in readers:
        column.set("this", exp.to_identifier(passed[(column.table, column.name)]))
        column.set("table", exp.to_identifier(alias))
    with_ = tree.args.get("with_")
    if isinstance(subquery_side, exp.Table):  # a WITH query, read here only: now the subquery itself
        kept = [c for c in with_.expressions if c.this is not select]
        tree.set("with_", exp.With(expressions=kept) if kept else None)
    tree.set("joins", [j for j in tree.args["joins"][1:] if not any(j is m for m in later)] or None)
    if conditions:
        tree.where(exp.and_(*conditions), copy=False)
    tree.set("from_", exp.From(this=exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier(alias)))))
    return tree


def _every_unit_inside(tree: exp.Select, alias: str, select: exp.Select, table: exp.Table, on: exp.EQ,
                       unit_name: str, taken: set[str]) -> None:
    """`people p LEFT JOIN (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) t`: the subquery as
    `SELECT p.person_id, COUNT(visits.person_id) AS n, COUNT(visits.person_id) AS rows FROM people p LEFT JOIN
    visits ON visits.person_id = p.person_id AND <its WHERE> GROUP BY p.person_id`, one row per unit, and the
    outer query reading each of its values as `CASE WHEN t.rows > 0 THEN t.n END`: NULL for a unit the subquery
    had no row for, as the LEFT JOIN gave. COUNT(*) counts the table's rows (the unit's column, never NULL on a
    row the join found); the other aggregates are NULL over no rows already."""
    source, unit_column = select.args["from_"].this, on.expression
    readers = [c for c in tree.find_all(exp.Column) if c.table == alias and not inside(c, select)]
    for count in select.find_all(exp.Count):
        if isinstance(count.this, exp.Star):
            count.set("this", unit_column.copy())
    rows = _fresh("dpsql_rows", taken)
    taken.add(rows)
    select.select(exp.alias_(exp.Count(this=unit_column.copy()), rows), copy=False)
    where = select.args.get("where")
    condition = exp.and_(on.copy(), exp.paren(where.this.copy())) if where else on.copy()
    select.set("where", None)
    select.set("from_", exp.From(this=table))
    select.set("joins", [exp.Join(this=source, on=condition, side="LEFT")])
    unit = on.this  # the units' own column
    for item in select.expressions:
        if item.alias_or_name == unit_name:
            item.replace(exp.alias_(unit.copy(), unit_name))
    select.args["group"].set("expressions", [unit.copy(), *select.args["group"].expressions[1:]])
    for column in readers:
        guarded = exp.Case(ifs=[exp.If(this=exp.GT(this=exp.column(rows, alias), expression=exp.Literal.number(0)),
                                       true=column.copy())])
        replace_keeping_precedence(column, guarded)


def _public_tables_joined(joins: list[exp.Join], moved: set[str], schema: PrivacySchema) -> list[exp.Join]:
    """The joins, from the first, of public tables on conditions that read only the tables moved before them
    (`JOIN states s ON s.code = p.state`): they move inside with the row they are joined to."""
    taken = []
    for join in joins:
        table = join.this
        declared = schema.tables.get(table.name.lower()) if isinstance(table, exp.Table) else None
        on = join.args.get("on")
        if declared is None or not declared.public or on is None or join.args.get("using") \
                or (join.args.get("side") or "").upper() not in ("", "LEFT") \
                or any(c.table not in moved | {table.alias_or_name} for c in on.find_all(exp.Column)):
            break
        taken.append(join)
        moved = moved | {table.alias_or_name}
    return taken


def _renamed(node: exp.Expression, renamed: dict[str, str]) -> exp.Expression:
    """A copy of `node` (a table or a join) with the sources `renamed` names under their new names."""
    copy = node.copy()
    for column in copy.find_all(exp.Column):
        if column.table in renamed:
            column.set("table", exp.to_identifier(renamed[column.table]))
    for table in copy.find_all(exp.Table):
        if table.alias_or_name in renamed:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(renamed[table.alias_or_name])))
    return copy


def _fresh(name: str, taken: set[str]) -> str:
    """`name`, or `name_2`, `name_3`, … : the first not in `taken`."""
    return name if name not in taken else next(f"{name}_{i}" for i in range(2, len(taken) + 3)
                                               if f"{name}_{i}" not in taken)
