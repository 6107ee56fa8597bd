"""Pass: the unit of every joined row, and k, the most joined rows one unit can hold.

Rules, by privacy model:
- unit-level privacy: private tables are joined on their unit columns or along declared parent keys (a
  child's unique parent key fixes the parent's row), so every joined row belongs to one unit, whose id is
  that row's unit column (dpsql joins a table's parents itself when the unit is only reached through them).
  k is the product of the declared rows per unit of the tables whose rows are not fixed by another's,
  times the public joins' fan-out (`public_joins`). The rewrite enforces k per unit, unless each joined row
  is provably a whole unit (unique constraints), when it aggregates the rows directly;
- row-level privacy over several private tables (in joins or WHERE subqueries): joined rows mix units, and
  k is the join's stability, how many joined rows one added or removed row changes (`joins`);
- a subquery in FROM grouped by a key under row-level privacy (`derived`) has its stability already.
An outer join can add rows that belong to no unit or give one unit's rows different group keys, so it
always takes the per-unit path.
"""

from __future__ import annotations

import math

from sqlglot import exp

from dpsql.analysis import public_joins, semijoins
from dpsql.analysis.joins import join_stability
from dpsql.analysis.relations import column_equalities
from dpsql.analysis.scope import Equality, Scope
from dpsql.errors import UnsupportedQuery
from dpsql.schema import Table
from dpsql.sql import dialect


def bound_rows(scope: Scope) -> None:
    """Set the unit expression, k, whether the rewrite may aggregate joined rows directly, whether there is an
    outer join, and which aliases one unit's row determines; add the joins that reach the unit."""
    if scope.stability is not None:  # row-level privacy, reading a grouped subquery
        semijoins.check(scope)
        k, unit, fast, outer, determined = scope.stability, None, True, False, set()
    elif _rows_of_several_units(scope):
        k = join_stability(scope, scope.joins, scope.equalities, scope.semijoins).stability
        unit, fast, outer, determined = None, True, False, set()
    else:
        fanout, determined, verified = public_joins.fanout(scope, scope.equalities, scope.private)
        unit, k_private, parent_joins = find_unit(scope, scope.private, scope.equalities)
        scope.joins += parent_joins
        semijoins.check(scope)
        k = k_private * fanout
        if scope.rows_cap is not None and scope.rows_cap < k:  # chosen privately for this query, below the declared
            scope.notes.append(f"rows per unit: {scope.rows_cap}, chosen for this query below the declared {k}")
            k = scope.rows_cap
        outer = any(j.side for j in scope.joins)
        # a per-unit table's row is its unit's, but a bound on its units' totals (R2T's race) is enforced per unit
        totals_of_units_table = scope.total_cap is not None and scope.from_ is not None
        fast = (not outer and k == 1 and verified and all(scope.row_is_unit(a) for a in scope.private)
                and not totals_of_units_table)
        if not fast and unit is None:  # each row is its own unit
            unit = dialect.row_id(scope.private[0])
        scope.notes.append(f"rows per unit in the joined relation: at most {k}"
                           + (" (guaranteed by unique constraints)" if fast else " (enforced per unit)"))
    scope.rows_per_unit, scope.unit, scope.direct = k, None if fast else unit, fast
    scope.outer_join, scope.determined = outer, determined


def find_unit(scope: Scope, private: list[str], equalities: list[Equality]) \
        -> tuple[exp.Expression | None, int, list[exp.Join]]:
    """The unit id of each joined row, the bound on one unit's rows across the private tables, and the joins
    dpsql adds to reach the unit from tables that hold it only through a parent (`parent = "col -> t.key"`).

    Private tables must be joined on their unit columns or along parent keys, so that every joined row
    belongs to one unit. A row reached through a unique parent key is fixed by its child's row, so only the
    other tables' row bounds multiply."""
    if scope.schema.row_level:  # one private table (several take the stability path)
        return None, 1, []
    component, root = scope.unit_components(private, equalities)
    links = [(child.table, parent.table)  # (child alias, parent alias): the child's row fixes the parent's
             for left, right in equalities for child, parent in ((left, right), (right, left))
             if child.table in component and parent.table in component and scope.is_parent_link(child, parent)]
    if not any(j.side for j in scope.joins):  # an outer join keeps rows that nothing fixes
        links += _key_links(scope, component, equalities)
    else:
        links += _left_joined_key_links(scope, component)
    added: list[exp.Join] = []
    pending = list(private)
    while pending:
        alias = pending.pop()
        table = scope.aliases[alias]
        if table.unit_column is not None or any(child == alias for child, _ in links):
            continue
        join, parent_alias = _parent_join(scope, alias, table, len(added) + 1)
        added.append(join)
        component[parent_alias] = root(alias)
        links.append((alias, parent_alias))
        pending.append(parent_alias)
    aliases = list(component)
    if len({root(a) for a in aliases}) > 1:
        raise UnsupportedQuery(
            "private tables must be joined on their unit columns or along their declared parent keys ("
            + ", ".join(scope.link_text(a) for a in private) + ")",
            "joins on other keys between private tables come with general equijoin support")
    free = set(aliases)
    for child, parent in links:
        if child in free and parent != child:
            free.discard(parent)
    columns = [exp.column(scope.aliases[a].unit_column, table=a) for a in aliases
               if scope.aliases[a].unit_column is not None]
    unit = columns[0] if len(columns) == 1 or _equal_on_every_row(scope, columns, equalities) \
        else exp.Coalesce(this=columns[0], expressions=columns[1:])
    for join in added:
        scope.notes.append(f"dpsql joins {join.this.name} AS {join.this.alias} to reach the unit")
    for alias in aliases:
        table = scope.aliases[alias]
        fixed_by = next((child for child, parent in links if parent == alias and child in free), None)
        declared = scope.schema.tables.get(table.name)
        why = "by its row numbers" if declared is not None and table.max_rows_per_unit < declared.max_rows_per_unit \
            else "declared"  # a windowed source kept to each unit's first rows (`windowed`)
        how = (f"fixed by {fixed_by}'s row (unique key)" if alias not in free and fixed_by
               else f"at most {table.max_rows_per_unit} row{'s' * (table.max_rows_per_unit != 1)} per unit ({why})")
        reach = (f"unit column {table.unit_column}" if table.unit_column
                 else f"reaches the unit through {table.parent}")
        scope.notes.append(f"relation {scope.relation_text(alias, table.name)}: {how}; {reach}")
    return unit, math.prod(scope.aliases[a].max_rows_per_unit for a in aliases if a in free), added


def _equal_on_every_row(scope: Scope, columns: list[exp.Column], equalities: list[Equality]) -> bool:
    """Whether inner joins' equalities make `columns` one value on every joined row (none NULL), so the first
    stands for their COALESCE: PostgreSQL then sees the unit as a join key and can group the units in the order
    a merge join reads them (TPC-H Q12 with the order as the unit: 2.7 s hashing COALESCE(o_orderkey,
    l_orderkey), 1.3 s grouping o_orderkey in index order). An outer join keeps rows whose columns are NULL."""
    if any(join.side for join in scope.joins):
        return False
    pairs = [(_column_key(left), _column_key(right)) for left, right in equalities]
    reached, grown = {_column_key(columns[0])}, True
    while grown:  # every column equated with the first, through chains of equalities
        before = len(reached)
        reached |= {c for pair in pairs if reached.intersection(pair) for c in pair}
        grown = len(reached) > before
    return all(_column_key(c) in reached for c in columns)


def _column_key(column: exp.Column) -> tuple[str, str]:
    return column.table, column.name


def _key_links(scope: Scope, aliases: dict, equalities: list[Equality]) -> list[tuple[str, str]]:
    """(fixing alias, fixed alias) for each private table joined on a whole unique key of its own (one column, or
    several that the catalog guarantees unique together) to the columns of one other table of the unit: each of
    that table's rows meets at most one of its rows."""
    links = []
    for alias in aliases:
        name = scope.aliases[alias].name
        matched: dict[str, set[str]] = {}
        for left, right in equalities:
            for mine, other in ((left, right), (right, left)):
                if mine.table == alias and other.table in aliases and other.table != alias:
                    matched.setdefault(other.table, set()).add(mine.name)
        links += [(other, alias) for other, names in matched.items() if scope.whole_keys(name, names)]
    return links


def _left_joined_key_links(scope: Scope, aliases: dict) -> list[tuple[str, str]]:
    """Under LEFT JOINs only: (fixing alias, fixed alias) for each table LEFT JOINed on a whole unique key of its own
    to the columns of a table before it, in its own ON (`visits v LEFT JOIN (… GROUP BY visit_id) r ON r.visit_id =
    v.visit_id`). Each row before it meets at most one of its rows, or none and is kept with NULLs: the join adds
    no row. A RIGHT or FULL join keeps rows nothing fixes, so there are none."""
    if any((join.side or "").upper() in ("RIGHT", "FULL") for join in scope.joins):
        return []
    links = []
    for join in scope.joins:
        alias, on = join.this.alias_or_name, join.args.get("on")
        if (join.side or "").upper() == "LEFT" and on is not None and alias in aliases:
            links += [link for link in _key_links(scope, aliases, column_equalities([on])) if link[1] == alias]
    return links


def _parent_join(scope: Scope, alias: str, table: Table, number: int) -> tuple[exp.Join, str]:
    """A LEFT JOIN of the parent table that gives `alias`'s rows their unit (rows without one are dropped
    by the per-unit stage)."""
    link = table.parent
    scope.require_unique_parent(table.name, link)
    parent_alias = f"dpsql_parent_{number}"
    while parent_alias in scope.aliases:  # never shadow a name the query uses itself
        parent_alias += "_"
    scope.aliases[parent_alias] = scope.schema.tables[link.table]
    on = exp.EQ(this=exp.column(link.key, table=parent_alias), expression=exp.column(link.column, table=alias))
    source = exp.Table(this=exp.to_identifier(link.table),
                       alias=exp.TableAlias(this=exp.to_identifier(parent_alias)))
    return exp.Join(this=source, on=on, side="LEFT"), parent_alias


def _rows_of_several_units(scope: Scope) -> bool:
    """Whether joined rows can combine rows of several units: row-level privacy with more than one private
    table read, in the joins or in a subquery."""
    subqueries = [a for s in scope.semijoins for a in s.aliases if not scope.aliases[a].public]
    return scope.schema.row_level and len(scope.private) + len(subqueries) > 1
