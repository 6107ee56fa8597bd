"""Pass: what the query reads FROM. A query must read a table; a grouped subquery in FROM becomes a private
table of one row per group, with declared bounds the rewrite enforces.

Rules:
- unit-level privacy: the subquery must GROUP BY the unit alone, so each of its rows is one whole unit. Its
  aggregates are clamped to what that unit's k rows could give (COUNT to [0, k], SUM to k times its row
  range, AVG, MIN and MAX to the row range), and the outer query sees a table with one row per unit and
  those bounds. The subquery may instead group by a key that fixes a row of one unit (`GROUP BY visit_id`, a
  unique NOT NULL column, or a child's parent key), or by the unit and other keys: then it is a table of one
  row per group, its unit's groups at most its k rows, which the outer query bounds as it bounds a table's
  rows per unit;
- row-level privacy: the subquery groups by one column of its tables whose frequency in the joined relation
  is declared and enforced (k rows per group). A change rewrites each group its changed joined rows fall in
  (a removal and an addition), so the table of groups has stability 2 · (groups one change touches), and
  the outer query is bounded by that stability.
"""

from __future__ import annotations

import dataclasses
import datetime
import math

from sqlglot import exp

from dpsql.analysis import public_joins, relations, semijoins, stability, units
from dpsql.analysis.clamps import clamp, clamp_to
from dpsql.analysis.joins import join_stability
from dpsql.analysis.scope import Equality, Scope
from dpsql.errors import PrivacyRefusal, UnsupportedQuery
from dpsql.schema import Column, Table
from dpsql.schema.model import temporal_number
from dpsql.sql import AGGREGATES, CheckedQuery, derived_select, in_analyst_words, joined_derived_selects, to_sql
from dpsql.sql.shape import tables_read


def bound_subquery(scope: Scope) -> None:
    """Refuse a query without FROM; for a grouped subquery in FROM, register it as a per-unit table and set
    the scope's FROM clause to the bounded subquery (and, under row-level privacy, its stability)."""
    tree = scope.tree
    if tree.args.get("from_") is None:
        raise PrivacyRefusal("a query without FROM reads no private data", "dpsql answers aggregates over tables")
    select = derived_select(tree)
    if select is None or tree.args.get("joins"):
        _bound_joined_subqueries(scope)
        return
    alias = tree.args["from_"].this.alias_or_name
    inner = _inner_scope(scope, select)
    table, bounded, unit_rows = _per_unit_table(inner, alias)
    scope.aliases[alias] = table
    if unit_rows:
        scope.unique = scope.unique | {(alias, table.unit_column)}  # GROUP BY the unit: one row per unit
    scope.stability, scope.truncate = inner.stability, inner.truncate
    scope.notes += [f"subquery {alias}: {note}" for note in inner.notes]
    scope.from_ = exp.From(this=_aliased(bounded, alias))


def _bound_joined_subqueries(scope: Scope) -> None:
    """A per-unit subquery JOINed to the query's tables (Tableau's FIXED level of detail, a segment or a cohort
    per unit: `FROM visits v JOIN (SELECT person_id, SUM(amount) AS total FROM visits GROUP BY person_id) t ON
    t.person_id = v.person_id`) is a table of one row per unit, as `people` is: grouped by the unit alone, each
    row is a function of that unit's rows only, clamped to declared bounds, so one unit added or removed adds or
    removes its row alone. The outer query then joins it on the unit like any table of one row per unit."""
    for alias, select in joined_derived_selects(scope.tree).items():
        if scope.schema.row_level:
            raise UnsupportedQuery(f"subquery {alias} is joined to other tables, which row-level privacy cannot "
                                   "bound", f"read {alias} alone in FROM, or join its tables inside it")
        if all(scope.schema.tables[t.name].public for t in select.find_all(exp.Table) if t.name in scope.schema.tables):
            raise UnsupportedQuery(f"subquery {alias} reads only public tables, which dpsql joins as tables, not as "
                                   "grouped subqueries", "join the public table itself and group the outer query, e.g. "
                                   "JOIN states s ON s.code = p.state … GROUP BY s.region")
        table, bounded, unit_rows = _per_unit_table(_inner_scope(scope, select), alias)
        if unit_rows:
            scope.unique = scope.unique | {(alias, table.unit_column)}
            scope.notes.append(f"subquery {alias}: one row per unit, its values bounded by what the unit's rows "
                               "can give")
        elif table.unit_column != "dpsql_unit":  # grouped by the unit and other keys: its rows unique on them all
            keys = _key_outputs(select)
            scope.unique_sets = scope.unique_sets | {(alias, frozenset(keys))}
            scope.notes.append(f"subquery {alias}: one row per {', '.join(sorted(keys))}, at most "
                               f"{table.max_rows_per_unit} a unit")
        else:
            _link_to_unit(scope, alias, table, select)
        scope.aliases[alias] = table
        scope.bounded_joins[alias] = _aliased(bounded, alias)


WEIGHED = ("sum", "avg", "var_pop", "var_samp", "stddev_pop", "stddev_samp", "percentile")  # a unit's rows weigh


def repeated_unit_values(scope: Scope) -> str | None:
    """Where a sum, average, spread or percentile reads a joined per-unit subquery's value over a unit's several
    rows (Tableau's FIXED total averaged per visit), what the answer leans to, said with it: each unit weighs as
    many rows as it has, and the bounds on a unit's rows and share cut the heaviest units' weight (the demo's
    per-person total averaged per visit: 32% low at 20,000 people, its interval covering 5% of answers)."""
    if not scope.bounded_joins or scope.rows_per_unit <= 1:
        return None
    read = {column: in_analyst_words(to_sql(column), scope.tree) for column in _weighed_columns(scope)
            if column.table in scope.bounded_joins}
    if not read:
        return None
    alias = min(read, key=to_sql).table
    unit = in_analyst_words(scope.unit.name, scope.tree) if isinstance(scope.unit, exp.Column) else "<unit column>"
    over_units = f"(…) {alias}" if not alias.startswith("dpsql_") else f"(SELECT {unit}, … GROUP BY 1) t"  # a window
    return (f"{', '.join(sorted(set(read.values())))}: one value per unit, repeated on each of its rows, so a unit "
            "weighs as many rows as it has, and the bounds on a unit's rows and share cut the heaviest units' "
            f"weight: the answer leans toward units with fewer rows, beyond its interval; aggregate it over units "
            f"instead: SELECT AVG(…) FROM {over_units}")


def values_of_unit_rows(scope: Scope) -> bool:
    """Whether a sum, average, spread or percentile reads a value computed from its unit's rows: a joined per-unit
    subquery's column, or a window of a windowed source (a person's total, each visit's share of it, the days since
    their last visit). Such a value depends on how many rows its unit has, so the rows a bound cuts from heavy units
    hold values unlike the rest, and cutting them from an average's numerator and denominator together moves it."""
    read = {alias: scope.aliases[alias] for alias in scope.windowed}
    windows = {(alias, name) for alias, table in read.items()
               for name in set(table.columns) - set(scope.schema.tables[table.name].columns)}
    return any(column.table in scope.bounded_joins or (column.table, column.name) in windows
               for column in _weighed_columns(scope))


def _weighed_columns(scope: Scope) -> list[exp.Column]:
    """The columns that sums, averages, spreads and percentiles read, where a unit weighs as many rows as it has."""
    weighed = [node for node in scope.tree.find_all(*AGGREGATES) if AGGREGATES.get(type(node)) in WEIGHED]
    return [column for node in weighed for column in node.find_all(exp.Column)]


def _link_to_unit(scope: Scope, alias: str, table: Table, select: exp.Select) -> None:
    """A joined subquery grouped by a key that fixes one unit's row (prescriptions per visit, `JOIN (SELECT visit_id,
    COUNT(*) AS n FROM prescriptions GROUP BY visit_id) r ON r.visit_id = v.visit_id`): one row per key, each of
    one unit's rows. Joined on that key to the row it names (the parent's key, or the same unique column), the row
    it meets is of the same unit, so the join also holds `r.<unit> = v.<unit>`, which the analysis needs to tie
    the two, and is added to its ON; its keys, the unit's among them, are unique. Refused for any other join."""
    targets = _fixing_keys(scope, select)
    names = {t.alias_or_name: t.name for t in tables_read(scope.tree)}
    joins = scope.tree.args.get("joins") or []
    reading = next((j for j in joins if j.this.alias_or_name == alias), joins[0] if joins else None)
    on = reading.args.get("on") if reading is not None else None
    for condition in on.flatten() if isinstance(on, exp.And) else [on] if on is not None else []:
        sides = [condition.this, condition.expression] if isinstance(condition, exp.EQ) else []
        if not all(isinstance(side, exp.Column) for side in sides):
            continue
        for mine, other in (sides, sides[::-1]):
            held = scope.schema.tables.get(names.get(other.table, ""))
            if mine.table == alias and targets.get(mine.name) == (names.get(other.table), other.name) \
                    and held is not None and held.unit_column is not None and not held.public:
                link = exp.column(table.unit_column, table=alias).eq(exp.column(held.unit_column, table=other.table))
                keys = _key_outputs(select)
                scope.unit_links[reading.this.alias_or_name] = link
                scope.unique_sets = scope.unique_sets | {(alias, frozenset(keys | {table.unit_column}))}
                scope.notes.append(f"subquery {alias}: one row per {mine.name}, each of one unit's rows; joined on "
                                   f"it, {to_sql(link)}")
                return
    raise UnsupportedQuery(f"subquery {alias} is joined to other tables, so it must GROUP BY the unit alone, or by "
                           "a key of one unit's rows that it is joined on to the row that key names",
                           f"group {alias} by the unit's column, or join it on its key to that row's table, e.g. "
                           f"JOIN visits v ON {alias}.visit_id = v.visit_id")


def _key_outputs(select: exp.Select) -> set[str]:
    """The names of a grouped subquery's outputs that aggregate nothing: its keys."""
    return {item.alias_or_name for item in select.expressions if not item.unalias().find(*AGGREGATES)}


def _fixing_keys(scope: Scope, select: exp.Select) -> dict[str, tuple[str, str]]:
    """The subquery's outputs that are group keys fixing one unit's row, each with the (table, column) it names: a
    child's parent key names its parent's row (prescriptions.visit_id: visits.visit_id), a unique NOT NULL column
    its own table's row."""
    tables = {t.alias_or_name: t.name for t in tables_read(select)}
    grouped = {to_sql(key) for key in select.args["group"].expressions}
    found = {}
    for item in select.expressions:
        node = item.unalias()
        name = tables.get(node.table) if isinstance(node, exp.Column) else None
        declared = scope.schema.tables.get(name) if name is not None else None
        if declared is None or to_sql(node) not in grouped:
            continue
        if declared.parent is not None and declared.parent.column == node.name:
            found[item.alias_or_name] = (declared.parent.table, declared.parent.key)
        elif (name, node.name) in scope.unique and (name, node.name) in scope.not_null:
            found[item.alias_or_name] = (name, node.name)
    return found


def _inner_scope(scope: Scope, select: exp.Select) -> Scope:
    inner = Scope(CheckedQuery(select, (), canonical=""), scope.schema, scope.unique)  # never a cache key
    inner.unique_sets, inner.not_null, inner.time_zone = scope.unique_sets, scope.not_null, scope.time_zone
    return inner


def _aliased(select: exp.Select, alias: str) -> exp.Subquery:
    return exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier(alias)))


def _per_unit_table(scope: Scope, alias: str) -> tuple[Table, exp.Select, bool]:
    """The subquery `scope` (grouped by the unit or by keys within one unit, or under row-level privacy by a
    column whose frequency is declared) as a table of one row per group, its bounded SQL, and whether each row
    is a whole unit (grouped by the unit alone: the SQL guarantees it, whatever k is)."""
    tree = scope.tree
    group = tree.args["group"].expressions
    if tree.args.get("having") or tree.args.get("order") or tree.args.get("limit"):
        raise UnsupportedQuery(f"subquery {alias} may not have HAVING, ORDER BY or LIMIT",
                               "filter and order in the outer query")
    within = []  # keys that fix a row of one unit: a row per group, several groups per unit
    if scope.schema.row_level:
        k = _row_level_groups(scope, alias, group)
    else:
        relations.read(scope)
        unit, k, parent_joins = units.find_unit(scope, scope.private, scope.equalities)
        scope.joins += parent_joins
        semijoins.check(scope)
        fanout, determined, _ = public_joins.fanout(scope, scope.equalities, scope.private)
        k *= fanout
        per_unit = _unit_first(scope, group, determined)
        within = [] if per_unit else _keys_within_units(scope, group)
        if not per_unit and not within:
            raise _not_grouped_by_unit(scope, alias)
        group = per_unit or [unit, *within]
    unit_sql = to_sql(group[0])
    attributes = {to_sql(node) for node in group[1:]}
    columns: dict[str, Column] = {}
    outputs = []
    unit_name = None
    for item in tree.expressions:
        name, node = item.alias_or_name, item.unalias()
        if to_sql(node) == unit_sql:
            declared = scope.declared_column(node)
            columns[name] = Column(name, declared.type if declared else "bigint")
            unit_name = name
            outputs.append(exp.alias_(group[0].copy(), name))
            continue
        if to_sql(node) in attributes:
            expr, column = _unit_attribute(scope, name, node)
        else:
            expr, column = _per_unit_aggregate(scope, name, node, k, bool(within))
        columns[name] = column
        outputs.append(exp.alias_(expr, name))
    if unit_name is None:  # the outer query needs the unit even if the subquery does not name it
        unit_name = "dpsql_unit"
        if unit_name in columns:
            raise UnsupportedQuery(f"subquery {alias} must select the unit column if it names a column "
                                   "dpsql_unit", f"add {unit_sql} to its SELECT list")
        columns[unit_name] = Column(unit_name, "bigint")
        outputs.append(exp.alias_(group[0].copy(), unit_name))
    where = scope.exprs.guard(tree.args["where"].this) if tree.args.get("where") else None
    present = exp.Not(this=exp.Is(this=group[0].copy(), expression=exp.Null()))
    bounded = exp.select(*outputs).from_(scope.guarded(relations.bounded_source(tree.args["from_"], scope.read_as)))
    for join in scope.joins:
        bounded = bounded.join(scope.guarded(join))
    bounded = bounded.where(present if where is None else exp.and_(exp.paren(where), present))
    bounded = bounded.group_by(*(node.copy() for node in (group if within else group[:1])))
    groups = min(k, _groups_per_unit(scope, within) or k)  # (the public values of its keys may allow fewer)
    scope.notes.append(f"one row per group; each group's aggregates bounded by what {k} rows can give"
                       + (f"; a unit's groups, at most {groups}, are bounded outside as its rows" if within else "")
                       + (" (as many as its keys' public values allow)" if within and groups < k else ""))
    unit_column = None if scope.schema.row_level else unit_name
    table = Table(alias, columns, unit_column=unit_column, max_rows_per_unit=groups if within else 1)
    return table, bounded, unit_column is not None and not within


def _groups_per_unit(scope: Scope, within: list[exp.Expression]) -> int | None:
    """How many groups of one unit keys within units allow (a retention matrix's months: 12 in a declared year),
    where every key but the unit's column has public values; None where one has not. The outer rewrite enforces
    it as the table's rows per unit, as any bound."""
    from dpsql.analysis.groups import key_domain  # (groups reads the scope this module fills)

    sizes = [key_domain(scope, node, None) for node in within
             if not (isinstance(node, exp.Column) and scope.is_unit(node))]
    return math.prod(len(domain) for domain in sizes) if sizes and None not in sizes else None


def _keys_within_units(scope: Scope, group: list[exp.Expression]) -> list[exp.Expression]:
    """The GROUP BY keys if each group is of one unit's rows: they hold the unit column, or are columns one of which
    fixes a row of a private table (a unique key of it that is NOT NULL, or a child's parent key: `GROUP BY
    o.order_id` in a query of orders); else none. A table on the outer side of a join fixes nothing: its NULLs
    are one group."""
    fixed = [alias for alias in scope.private if alias not in scope.nullable()]
    if any(isinstance(node, exp.Column) and node.table in fixed and scope.is_unit(node) for node in group):
        return group
    if not all(isinstance(node, exp.Column) for node in group):
        return []
    names: dict[str, set[str]] = {}
    for node in group:
        names.setdefault(node.table, set()).add(node.name)
    for alias in set(names) & set(fixed):
        table, columns = scope.aliases[alias], names[alias]
        keys = [key for key in scope.whole_keys(table.name, columns)
                if all((table.name, name) in scope.not_null for name in key)]
        if keys or table.parent is not None and table.parent.column in columns:
            return group
    return []


def _unit_first(scope: Scope, group: list[exp.Expression], determined: set[str]) -> list[exp.Expression] | None:
    """The subquery's GROUP BY with the unit first: the unit, and any other key a column of a table whose row the
    unit's row determines (`GROUP BY p.person_id, p.sex`, which PostgreSQL needs to select p.sex): grouping by
    those too still gives one row per unit. None if it groups by anything else."""
    unit = next((node for node in group if isinstance(node, exp.Column) and scope.is_unit(node)), None)
    attributes = [node for node in group if node is not unit]
    # (a table declared to hold one row per unit determines it too where the catalog cannot say: the MIN below
    # keeps one row per unit whatever the data holds)
    one_row = determined | {a for a in scope.private if scope.aliases[a].max_rows_per_unit == 1}
    if unit is None or not all(isinstance(node, exp.Column) and (node.table in one_row or scope.is_unit(node))
                               for node in attributes):
        return None
    return [unit, *attributes]


def _not_grouped_by_unit(scope: Scope, alias: str) -> UnsupportedQuery:
    return UnsupportedQuery(f"subquery {alias} must GROUP BY the privacy unit alone ("
                            + ", ".join(scope.link_text(a) for a in scope.private if scope.aliases[a].unit_column)
                            + "), with columns of a table that holds one row per unit, or by a key that fixes one "
                            "unit's row (a unique NOT NULL column, or a child's parent key)",
                            "group by the unit inside, then aggregate or group its results outside")


def _unit_attribute(scope: Scope, name: str, node: exp.Column) -> tuple[exp.Expression, Column]:
    """A column the unit's row determines, selected by a per-unit subquery that groups by it: its one value per
    unit, as MIN over the unit's rows (the same value on every row; the bounded subquery groups by the unit
    alone, so it holds one row per unit whatever the data), declared outside as it is declared inside. An
    expression (`CASE WHEN p.age < 40 THEN 'young' ELSE 'old' END`, `upper(v.category)`) is declared by what its
    values are known to be (`_derived_column`)."""
    if not isinstance(node, exp.Column):
        guarded = scope.exprs.guard(node.copy())
        column = _derived_column(scope, name, node)
        return exp.LogicalAnd(this=guarded) if column.type == "boolean" else exp.Min(this=guarded), column
    declared = scope.declared_column(node)
    if declared is None:
        raise UnsupportedQuery(f"{to_sql(node)} is not a declared column", "select declared columns")
    guarded = scope.exprs.guard(node)
    value = exp.LogicalAnd(this=guarded) if declared.type == "boolean" else exp.Min(this=guarded)
    return value, dataclasses.replace(declared, name=name, unique=False, max_frequency=None)


def _derived_column(scope: Scope, name: str, node: exp.Expression) -> Column:
    """How the outer query sees a grouping expression of a per-unit subquery: a condition is a boolean, text keeps
    the values it is known to take (`groups.key_domain`: a CASE's constants, a domain column's upper()), a number
    its bounds; anything else is refused."""
    from dpsql.analysis.groups import key_domain, text_key  # (groups reads the scope this module fills)

    if scope.exprs.is_boolean(node):
        return Column(name, "boolean")
    if text_key(scope.exprs, node):
        domain = key_domain(scope, node, None)
        return Column(name, "text", domain=tuple(domain) if domain is not None and all(
            isinstance(v, str) for v in domain) else None)
    value_range = scope.exprs.value_range(node)
    if value_range is not None and value_range.bounded:
        return Column(name, "integer" if value_range.integer else "double precision", value_range.lo, value_range.hi)
    time_type, bounds = scope.exprs.time_type(node), scope.exprs.time_bounds(node)
    if time_type is not None and bounds is not None:  # a time within its column's bounds (date_trunc('month', day))
        periods = key_domain(scope, node, None)  # its periods' starts where they are public: the first and last
        if periods and all(isinstance(v, datetime.date) for v in periods):
            bounds = (min(periods), max(periods))
        return Column(name, time_type, *(temporal_number(time_type, b) for b in bounds))
    raise UnsupportedQuery(f"the subquery's key {to_sql(node)} AS {name} is neither a condition, text, a bounded "
                           "number nor a bounded time", f"select the columns it reads and compute {name} in the "
                           "outer query")


def _row_level_groups(scope: Scope, alias: str, group: list[exp.Expression]) -> int:
    """Under row-level privacy, a subquery grouped by one column: reads its relation, and returns how many
    joined rows one group holds (the column's frequency in the joined relation, enforced). Sets the stability
    of the table of groups: a change rewrites the groups its changed joined rows fall in, each a removal and
    an addition."""
    relations.read(scope)
    if len(group) != 1 or not isinstance(group[0], exp.Column) or group[0].table not in scope.outer:
        raise UnsupportedQuery(f"subquery {alias} must GROUP BY one column of its tables",
                               "group by a key, e.g. GROUP BY c.c_custkey, then aggregate its results outside")
    if scope.semijoins:
        raise UnsupportedQuery(f"subquery {alias} may not contain subqueries", "move them to the outer query")
    key = group[0]
    joined = join_stability(scope, scope.joins, scope.equalities, [], key)
    rows = joined.frequencies.get(f"{key.table}.{key.name}")
    if rows is None:
        scope.frequency(scope.aliases[key.table], key)  # raises: how many rows share a group is undeclared
    touched = _groups_touched(scope, key, scope.equalities)
    grouped = stability.grouped(joined, touched)
    scope.notes.append(f"at most {rows} joined row(s) per group; one neighbour rewrites at most "
                       f"{grouped.stability // 2} group(s): stability {grouped.stability}")
    scope.stability = grouped.stability
    return rows


def _groups_touched(scope: Scope, key: exp.Column, equalities: list[Equality]) -> int | None:
    """How many groups of `key` one changed row can touch, when each table's changed rows fix the group: the
    grouped table's own changed rows (1 + its truncated keys), or a table joined directly on the group key and
    truncated on that key alone (an added row pushes out only rows with the same key). None if unknown."""
    per_table: dict[str, int] = {}
    for alias in scope.outer:
        table = scope.aliases[alias]
        if table.public:
            continue
        truncated = {c for c, _ in scope.truncate.get(table.name, ())}
        on_key = {mine.name for left, right in equalities for mine, other in ((left, right), (right, left))
                  if mine.table == alias and (other.table, other.name) == (key.table, key.name)}
        if alias == key.table:  # rows pushed out by truncation on the group key are in the same group
            touched = 1 if truncated <= {key.name} else 1 + len(truncated)
        elif on_key and len(truncated) <= 1 and truncated <= on_key:
            touched = 1
        else:
            return None
        per_table[table.name] = per_table.get(table.name, 0) + touched
    return max(per_table.values())


def _per_unit_aggregate(scope: Scope, name: str, node: exp.Expression, k: int,
                        within: bool) -> tuple[exp.Expression, Column]:
    """One unit's aggregate, clamped to what k of its rows could give, and its declared range outside. Where a
    unit has several groups (`within`), a count or sum over all of them is what its k rows give in all: the
    column's `unit_total`."""
    kind = AGGREGATES.get(type(node))
    if kind not in ("count", "sum", "avg", "min", "max"):
        raise UnsupportedQuery(f"{to_sql(node)} in a per-unit subquery: use COUNT, SUM, AVG, "
                               "MIN or MAX of a column or bounded expression, or the unit column itself",
                               "e.g. SELECT AVG(n) FROM (SELECT <the unit's column>, COUNT(*) AS n FROM t "
                               "GROUP BY 1) s")
    distinct = node.this.expressions if isinstance(node.this, exp.Distinct) else None
    argument = distinct[0] if distinct and len(distinct) == 1 else node.this
    declared = scope.declared_column(argument) if isinstance(argument, exp.Column) else None
    if kind == "count":
        # COUNT(DISTINCT category) is at most the declared values' number (8), not the unit's rows (100): a
        # key of it releases only the counts it can take
        values = None if not isinstance(node.this, exp.Distinct) or declared is None else declared.declared_values
        most = k if values is None else min(k, values)
        # a group holds a row, so its COUNT(*) is never 0 (keys from 1); at one row a unit, [0, 1] leaves AVG(n)
        # a range to measure, which [1, 1] would not
        least = 1 if isinstance(node.this, exp.Star) and most > 1 else 0
        return clamp_to(node, least, most, "integer"), Column(name, "bigint", float(least), float(most),
                                                              unit_total=float(k) if within else None)
    if kind in ("min", "max") and declared is not None and declared.domain is not None and all(
            isinstance(v, str) for v in declared.domain):
        # a unit's first or last category (in the database's order): one of its values, so outside one of the
        # declared ones (a value the data holds beyond them is never released as a key)
        guarded = node.copy()
        guarded.set("this", scope.exprs.guard(argument))
        return guarded, Column(name, "text", domain=declared.domain)
    if kind in ("min", "max") and declared is not None and declared.is_temporal and declared.bounded:
        # a unit's first or last date (a cohort): within the column's declared bounds, clamped to them
        guarded = node.copy()
        guarded.set("this", scope.exprs.guard(argument))
        return clamp(guarded, declared), Column(name, declared.type, declared.lower, declared.upper)
    row = scope.exprs.numeric(argument, kind)
    lo, hi = (min(0.0, k * row.lo), max(0.0, k * row.hi)) if kind == "sum" else (row.lo, row.hi)
    guarded = node.copy()
    guarded.set("this", scope.exprs.guard(node.this))
    integer = row.integer and kind != "avg"
    # SUM and AVG of integers are numeric in PostgreSQL (SUM of integer is bigint, which widens to numeric)
    result_kind = scope.exprs.kind(argument)
    if kind in ("sum", "avg") and result_kind == "integer":
        result_kind = "numeric"
    return (clamp_to(guarded, lo, hi, result_kind),
            Column(name, "bigint" if integer else "double precision", lo, hi,
                   unit_total=hi if within and kind == "sum" else None))
