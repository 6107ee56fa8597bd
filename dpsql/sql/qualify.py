"""Qualify: every table must be declared, every column is resolved to its table (sqlglot's qualify against
the declared schema), and simple subqueries and CTEs are merged into the outer query."""

from __future__ import annotations

import re

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.merge_subqueries import merge_subqueries
from sqlglot.optimizer.qualify import qualify

from dpsql.errors import PrivacyRefusal, UnknownColumn, UnknownObject
from dpsql.schema import PrivacySchema
from dpsql.sql.query import DIALECT, to_sql


def qualify_columns(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` over declared tables only, its columns qualified, its mergeable subqueries merged."""
    _check_tables(tree, schema)
    try:
        tree = qualify(tree, schema=schema.sqlglot_schema(), dialect=DIALECT, validate_qualify_columns=True,
                       quote_identifiers=False)
    except OptimizeError as exc:
        raise UnknownColumn(_column_message(str(exc)),
                            "every column must be declared in the privacy schema; `dpsql schema check` lists them"
                            ) from None
    return merge_subqueries(tree)


def _column_message(sqlglot_message: str) -> str:
    """PostgreSQL's wording for the column sqlglot could not resolve (column "x" does not exist)."""
    found = re.match(r"(?:Column '(.+?)' could not be resolved|Unknown column: (\S+))", sqlglot_message)
    if found is None:
        return sqlglot_message.split(". Line:")[0]
    name = found.group(1) or found.group(2)
    return f'column {name} does not exist' if "." in name else f'column "{name}" does not exist'



def _check_tables(tree: exp.Select, schema: PrivacySchema) -> None:
    cte_names = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if table.args.get("catalog") or (table.db and table.db.lower() != "public"):
            raise PrivacyRefusal(f"table {to_sql(table)} is outside the declared schema",
                                 "only tables declared in the privacy schema may be read")
        if name in cte_names and not table.db:
            continue
        if name not in schema.tables:
            raise UnknownObject(f'relation "{name}" does not exist',
                                "the privacy schema declares the tables " + ", ".join(sorted(schema.tables)))
