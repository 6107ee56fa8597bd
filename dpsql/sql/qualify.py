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
from dpsql.sql.shape import is_windowed_source


def qualify_columns(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` over declared tables only, its columns qualified, its mergeable subqueries merged."""
    check_tables(tree, schema)
    try:
        tree = qualify(tree, schema=schema.sqlglot_schema(), dialect=DIALECT, validate_qualify_columns=True,
                       quote_identifiers=False)
    except OptimizeError as exc:
        raise UnknownColumn(_column_message(str(exc)),
                            "every column must be declared in the privacy schema; `dpsql schema check` lists them"
                            ) from None
    return _plain_aliases(_merged(tree))


def _merged(tree: exp.Select) -> exp.Select:
    """`tree` with its mergeable subqueries merged, its windowed sources (`shape.is_windowed_source`) kept as the
    tables they stand for: sqlglot would merge one into a subquery that reads its windows without a filter, and
    then that subquery could not merge into the query that filters them (`WHERE rn = 1`)."""
    hidden: dict[str, exp.Subquery] = {}
    for select in list(tree.find_all(exp.Select)):
        if select is not tree and is_windowed_source(select):
            name = f"dpsql_windowed{len(hidden)}"
            hidden[name] = select.parent
            select.parent.replace(exp.Table(this=exp.to_identifier(name), alias=select.parent.args["alias"].copy()))
    tree = merge_subqueries(tree)
    for table in list(tree.find_all(exp.Table)):
        if table.name in hidden:  # under the alias the merge gave it, where it renamed the source
            source = hidden[table.name]
            source.set("alias", table.args["alias"].copy())
            table.replace(source)
    return tree


PLAIN = re.compile(r"^[a-z_][a-z0-9_]*$")  # what PostgreSQL reads the same quoted or not


def _plain_aliases(tree: exp.Select) -> exp.Select:
    """Names PostgreSQL reads only quoted (`"People"`, Metabase's name for a joined table; `"Total"`, a column of
    a subquery) renamed to plain lowercase ones, wherever they are read: dpsql writes the names it reads into new
    SQL unquoted, where `People.person_id` would mean `people.person_id`. The query's own output names are kept
    (the client sees them as written)."""
    if all(PLAIN.match(a.name) or not a.name for a in tree.find_all(exp.TableAlias)) and all(
            PLAIN.match(e.alias) for e in tree.find_all(exp.Alias) if isinstance(e.parent, exp.Select)
            and isinstance(e.parent.parent, exp.Subquery | exp.CTE)):
        return tree  # most queries: every name plain
    # the names sources go by (qualify aliases every table), and columns' own (a subquery's column renamed must
    # not take a name another of its columns has): the renamed name is the lowercase one where that is free
    taken = {alias.name for alias in tree.find_all(exp.TableAlias)} | {c.name for c in tree.find_all(exp.Column)} \
        | {e.alias for e in tree.find_all(exp.Alias)}

    def plain(name: str) -> str:
        base = re.sub(r"[^a-z0-9_]", "_", name.lower()).lstrip("0123456789") or "t"
        new = base if base not in taken else next(f"{base}_{i}" for i in range(2, len(taken) + 3)
                                                  if f"{base}_{i}" not in taken)
        taken.add(new)
        return new

    sources: dict[str, str] = {}  # table, subquery and CTE names
    for alias in tree.find_all(exp.TableAlias):
        if alias.name and not PLAIN.match(alias.name):
            sources.setdefault(alias.name, plain(alias.name))
            alias.set("this", exp.to_identifier(sources[alias.name]))
    columns: dict[tuple[str, str], str] = {}  # (source, column) -> plain column name
    for select in tree.find_all(exp.Select):
        parent = select.parent
        if not isinstance(parent, exp.Subquery | exp.CTE) or not parent.alias_or_name:
            continue
        for item in select.expressions:
            if isinstance(item, exp.Alias) and not PLAIN.match(item.alias):
                columns[(parent.alias_or_name, item.alias)] = plain(item.alias)
                item.set("alias", exp.to_identifier(columns[(parent.alias_or_name, item.alias)]))
    if not sources and not columns:
        return tree
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    for column in tree.find_all(exp.Column):
        source = sources.get(column.table, column.table)
        if (source, column.name) in columns:
            column.set("this", exp.to_identifier(columns[(source, column.name)]))
        if column.table in sources:
            column.set("table", exp.to_identifier(source))
    for table in tree.find_all(exp.Table):  # a CTE's readers name it as a table
        if table.name in sources and sources[table.name] in ctes and not table.db:
            table.set("this", exp.to_identifier(sources[table.name]))
    return tree


def _column_message(sqlglot_message: str) -> str:
    """PostgreSQL's wording for the column sqlglot could not resolve (column "x" does not exist)."""
    found = re.match(r"(?:Column '(.+?)' could not be resolved|Unknown column: (\S+))", sqlglot_message)
    if found is None:
        return sqlglot_message.split(". Line:")[0]
    name = found.group(1) or found.group(2)
    return f'column {name} does not exist' if "." in name else f'column "{name}" does not exist'



def check_tables(tree: exp.Select, schema: PrivacySchema) -> None:
    """Every table `tree` reads is declared (or one of its WITH queries), as PostgreSQL would say."""
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
