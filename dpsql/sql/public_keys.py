"""The statements that read a public table's values of a query's group keys (`GROUP BY s.name` over `states s`).

A key that is a column of a public table takes only the values that table holds (under the WHERE's conditions on
that table alone), whatever the private rows joined to it. Those values are public data, so the analysis may
release every one of them, an empty group too, as it releases a declared domain (`analysis.groups`), instead of
partition selection dropping the small groups (the nations of TPC-H, the states of the demo). The statement is
built here from the checked query and the schema alone; the engine runs it (public data, exact, free) and hands
the values to the analysis. It reads the one public table and nothing else, and spells the key as the analysis
will (text byte by byte), so the values compare equal to the keys the answer's statement returns.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.schema import PrivacySchema
from dpsql.sql.query import MAX_DOMAIN, CheckedQuery, bytewise, operands, to_sql

MAX_PUBLIC_KEYS = MAX_DOMAIN  # more values than the analysis releases in full are not read


def public_key_statements(query: CheckedQuery, schema: PrivacySchema) -> dict[str, exp.Select]:
    """For each GROUP BY key that is a declared column of a public table in FROM or JOIN, the statement that reads
    that table's distinct values of it (at most MAX_PUBLIC_KEYS + 1 rows), by the key's SQL text."""
    tree = query.tree
    group = tree.args.get("group")
    if group is None:
        return {}
    relations = [tree.args["from_"].this, *(join.this for join in tree.args.get("joins") or [])]
    tables = {r.alias_or_name: r for r in relations if isinstance(r, exp.Table)}
    where = operands(tree.args["where"].this) if tree.args.get("where") else []
    statements = {}
    for key in group.expressions:
        relation = tables.get(key.table) if isinstance(key, exp.Column) else None
        table = schema.tables.get(relation.name) if relation is not None else None
        column = table.columns.get(key.name) if table is not None and table.public else None
        if column is None or column.local is not None or table.released is not None:
            continue
        value = bytewise(key.copy()) if column.type == "text" else key.copy()  # as the analysis spells the key
        select = exp.select(value).distinct().from_(relation.copy()).limit(MAX_PUBLIC_KEYS + 1)
        own = [c for c in where if _reads_only(c, key.table)]
        if own:
            select = select.where(exp.and_(*(c.copy() for c in own)))
        statements[to_sql(key)] = select
    return statements


def _reads_only(condition: exp.Expression, alias: str) -> bool:
    """Whether a WHERE conjunct reads the one relation `alias` and nothing else (no subquery, no aggregate)."""
    columns = list(condition.find_all(exp.Column))
    return bool(columns) and all(c.table == alias for c in columns) and not condition.find(
        exp.Subquery, exp.Select, exp.Exists, exp.AggFunc)
