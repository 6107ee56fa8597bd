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
as a table of one row per unit (`analysis.derived`). Anything else is left as written (and refused where it was).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.schema import PrivacySchema
from dpsql.sql.query import AGGREGATES
from dpsql.sql.shape import tables_read

WINDOWED = "dpsql_w"  # the joined subquery's alias, its unit column's and its values' names


def unit_windows_as_joins(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` with each subquery in FROM or JOIN (not `tree` itself: its windows run over the released rows) that
    computes aggregates over whole partitions by the unit reading them from a per-unit subquery joined to it."""
    if schema.row_level:
        return tree
    for select in list(tree.find_all(exp.Select)):
        if select is not tree and isinstance(select.parent, exp.Subquery | exp.CTE):
            _joined(select, schema)
    return tree


def _joined(select: exp.Select, schema: PrivacySchema) -> None:
    if any(select.args.get(k) for k in ("group", "having", "distinct", "limit", "offset", "with_")) \
            or select.args.get("from_") is None or any(join.side for join in select.args.get("joins") or []):
        return  # (under an outer join, a NULL unit is a partition of its own, which the join would drop)
    windows = [w for item in select.expressions for w in item.find_all(exp.Window) if _whole_partition(w)]
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
    for i, window in enumerate(windows):
        per_unit.select(exp.alias_(window.this.copy(), f"{WINDOWED}{i}"), copy=False)
        window.replace(exp.column(f"{WINDOWED}{i}", table=WINDOWED))
    per_unit.set("group", exp.Group(expressions=[unit.copy()]))
    select.join(exp.Subquery(this=per_unit, alias=exp.TableAlias(this=exp.to_identifier(WINDOWED))),
                on=exp.column(f"{WINDOWED}_unit", table=WINDOWED).eq(unit.copy()), copy=False)


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
