"""A subquery grouped by the unit and keys, regrouped outside by those same keys, spelled as one grouped query:

    SELECT category, COUNT(*), AVG(n) FROM
        (SELECT person_id, category, COUNT(*) AS n FROM visits GROUP BY person_id, category) t
    GROUP BY category

is

    SELECT visits.category, COUNT(DISTINCT visits.person_id), COUNT(*) / COUNT(DISTINCT visits.person_id)
    FROM visits GROUP BY visits.category

Each outer group holds one inner row per unit that has rows with those keys, so counting the inner rows counts
distinct units, summing an inner COUNT or SUM is the COUNT or SUM over the group's rows, and averaging an inner
COUNT divides that by the units. The grouped query is the form the analysis bounds (a unit reaches as many groups
as its rows do), so nothing about the guarantee changes: this is a spelling.

Runs after qualifying, on columns resolved to their tables, and only where a key is a column of a table with
more than one row per unit (keys of the unit's own row are one row per unit already, which `analysis.derived`
reads as written). Outer WHERE conditions on the keys move inside. Anything else (MIN or MAX of an inner value,
an AVG of an inner SUM, an outer grouping by fewer keys, a HAVING inside) is left as written.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.schema import PrivacySchema
from dpsql.sql.query import inside, to_sql


def unit_key_groups_merged(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` as one grouped query where it regroups, by the same keys, a subquery grouped by the unit and keys."""
    source = tree.args.get("from_").this if tree.args.get("from_") else None
    if schema.row_level or tree.args.get("joins") or not isinstance(source, exp.Subquery) \
            or not isinstance(source.this, exp.Select) or not tree.args.get("group"):
        return tree
    inner, alias = source.this, source.alias_or_name
    unit, keys = _unit_and_keys(inner, schema)
    if unit is None:
        return tree
    outputs = {item.alias_or_name: item.unalias() for item in inner.expressions}
    grouped = [g for g in tree.args["group"].expressions]
    if not all(isinstance(g, exp.Column) and g.table == alias and g.name in outputs for g in grouped) \
            or {to_sql(outputs[g.name]) for g in grouped} != {to_sql(k) for k in keys} or len(grouped) != len(keys):
        return tree
    units = exp.Count(this=exp.Distinct(expressions=[unit.copy()]))
    merged = tree.copy()
    outside = [n for n in merged.walk() if not inside(n, merged.args["from_"])]
    for node in [n for n in outside if isinstance(n, AGGREGATES) and not isinstance(n.parent, exp.Window)]:
        replaced = _regrouped(node, alias, outputs, units)
        if replaced is None:
            return tree
        node.replace(replaced)
    outside = [n for n in merged.walk() if not inside(n, merged.args["from_"])]  # the aggregates replaced
    for column in [n for n in outside if isinstance(n, exp.Column) and n.table == alias]:
        value = outputs.get(column.name)
        if value is None or value.find(exp.AggFunc):
            return tree  # an inner aggregate read outside an aggregate
        column.replace(value.copy())
    where = [w.this for w in (inner.args.get("where"), merged.args.get("where")) if w is not None]
    merged.set("from_", inner.args["from_"].copy())
    merged.set("joins", [j.copy() for j in inner.args.get("joins") or []])
    merged.set("where", exp.Where(this=exp.and_(*(exp.paren(w.copy()) for w in where))) if where else None)
    return merged


def _unit_and_keys(inner: exp.Select, schema: PrivacySchema) -> tuple[exp.Column | None, list[exp.Expression]]:
    """The unit column `inner` groups by and its other keys, where it is simple enough (no HAVING, ORDER BY,
    LIMIT, DISTINCT, window or subquery) and some key is a column of a table with many rows per unit."""
    group = inner.args["group"].expressions if inner.args.get("group") else []
    if len(group) < 2 or inner.find(exp.Window) or any(n is not inner for n in inner.find_all(exp.Select)) \
            or any(inner.args.get(k) for k in ("having", "order", "limit", "offset", "distinct", "with_")):
        return None, []
    tables = {t.alias_or_name: schema.tables.get(t.name.lower()) for t in inner.find_all(exp.Table)}
    units = [g for g in group if isinstance(g, exp.Column) and tables.get(g.table) is not None
             and not tables[g.table].public and g.name == tables[g.table].unit_column]
    if len(units) != 1:
        return None, []
    keys = [g for g in group if g is not units[0]]
    many = [k for k in keys if isinstance(k, exp.Column) and tables.get(k.table) is not None
            and not tables[k.table].public and tables[k.table].max_rows_per_unit != 1]
    return (units[0], keys) if many else (None, [])


AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def _regrouped(node: exp.Expression, alias: str, outputs: dict[str, exp.Expression],
               units: exp.Expression) -> exp.Expression | None:
    """An aggregate of the outer query as one over the regrouped rows (COUNT(*): the units; SUM of an inner COUNT
    or SUM: that COUNT or SUM; AVG of an inner COUNT: it over the units), or None where it cannot be said."""
    argument = node.this
    if isinstance(node, exp.Count) and isinstance(argument, exp.Star):
        return units.copy()
    if not isinstance(argument, exp.Column) or argument.table != alias or argument.name not in outputs:
        return None
    value = outputs[argument.name]
    if isinstance(node, exp.Count) and value.sql() == units.this.expressions[0].sql():
        return units.copy()  # COUNT(t.person_id): the unit is never NULL here
    if not isinstance(value, exp.Count | exp.Sum) or isinstance(value.this, exp.Distinct):
        return None
    if isinstance(node, exp.Sum):
        return value.copy()
    if isinstance(node, exp.Avg) and isinstance(value, exp.Count):  # PostgreSQL's AVG of a bigint is numeric
        return exp.Div(this=exp.Cast(this=value.copy(), to=exp.DataType.build("numeric")), expression=units.copy())
    return None  # (an AVG of an inner SUM(x) is over the units with an x: a count of units dpsql does not bound)
