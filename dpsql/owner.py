"""The data owner's tools: a privacy schema drafted from a database's catalog, and a schema compared with the data.

Both read with the owner's own access and print to the owner: nothing here is a release, and nothing here is
reachable by an analyst. The draft reads structure (tables, types, keys) and, to propose a domain, the distinct
values of small text columns and each private table's largest count of rows per unit, and says so beside each.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import sql

from dpsql.errors import ConfigError
from dpsql.schema.catalog import Catalog
from dpsql.schema.model import NUMERIC_TYPES, OTHER_TYPES, PrivacySchema, Table, temporal_value

DOMAIN_LIMIT = 24  # a text column with at most this many distinct values gets a candidate domain


@dataclass(frozen=True)
class Link:
    """How a private table's rows reach the unit: its own unit column, or a parent key."""

    column: str
    table: str  # the unit's table, or the parent's
    key: str
    direct: bool


def draft(conn: psycopg.Connection, catalog: Catalog, unit: str | None = None) -> str:
    """A privacy schema (TOML) for the database behind `conn`: `unit` ("table.key") or the key most tables reach
    through foreign keys as the privacy unit, every table reaching it private, every other public."""
    unit_table, unit_key = _unit(conn, catalog, unit)
    links = _links(catalog, unit_table, unit_key)
    others = sorted(f"{t}.{k}" for t, k in catalog.unique if t != unit_table and _links(catalog, t, k))
    lines = ["# A privacy schema drafted by `dpsql schema draft` from the database's catalog. Lines marked CONFIRM",
             "# are decisions only you can make; `dpsql schema check FILE --database URL` checks the result.", "",
             "[privacy]",
             f"# CONFIRM: one {unit_table} row is the person (or firm) protected"
             + (f"; other keys that tables reach: {', '.join(others)}" if others else ""),
             f'unit = "{unit_table}.{unit_key}"',
             'neighbouring = "add-remove"      # neighbours differ by all the rows of one unit',
             "max_groups_per_unit = 4          # a unit counts in at most 4 groups of a GROUP BY over private keys",
             'rows_per_unit = "auto"           # each query\'s rows per unit chosen from the data below each cap']
    for table in sorted(catalog.columns, key=lambda t: (t != unit_table, t not in links, t)):
        lines += ["", *_table_lines(conn, catalog, table, unit_table, unit_key, links.get(table))]
    return "\n".join(lines) + "\n"


def _unit(conn: psycopg.Connection, catalog: Catalog, unit: str | None) -> tuple[str, str]:
    if unit is not None:
        table, _, key = unit.partition(".")
        if (table, key) not in catalog.unique:
            raise ConfigError(f"--unit {unit} is not a primary or unique key of a table of the database",
                              "name the key of the table that holds one row per person, as TABLE.KEY")
        return table, key
    reached = {key: len(_links(catalog, *key)) for key in catalog.unique if key in catalog.references.values()}
    if not reached:
        raise ConfigError("no foreign key leads to a key of the database, so the draft cannot tell whose data it is",
                          "name the privacy unit: --unit TABLE.KEY (the key of the table with one row per person)")
    most = max(reached.values())
    tied = sorted(key for key, count in reached.items() if count == most)
    # as many tables reach a person as a place they visit: people outnumber places
    return max(tied, key=lambda key: _row_count(conn, key[0])) if len(tied) > 1 else tied[0]


def _links(catalog: Catalog, unit_table: str, unit_key: str) -> dict[str, Link]:
    """Each table that reaches the unit through foreign keys: directly to the unit's key, else to the unique key
    of a table that does (the first found, nearest the unit)."""
    links: dict[str, Link] = {}
    for (table, column), target in sorted(catalog.references.items()):
        if target == (unit_table, unit_key) and table != unit_table and table not in links:
            links[table] = Link(column, unit_table, unit_key, direct=True)
    grew = True
    while grew:
        grew = False
        for (table, column), (parent, key) in sorted(catalog.references.items()):
            if table not in links and table != unit_table and parent in links and (parent, key) in catalog.unique:
                links[table], grew = Link(column, parent, key, direct=False), True
    return links


def _table_lines(conn: psycopg.Connection, catalog: Catalog, table: str, unit_table: str, unit_key: str,
                 link: Link | None) -> list[str]:
    lines = [f"[tables.{table}]"]
    private = table == unit_table or link is not None
    if not private:
        lines.append("public = true  # CONFIRM: no foreign key leads from it to the unit; if it holds personal "
                     "data, make it private")
    elif table == unit_table:
        most = _most_rows(conn, table, unit_key)
        lines.append(f"max_rows_per_unit = {max(most, 1)}  # one row per unit: {unit_key} is its key")
    else:
        most = _most_rows(conn, table, link.column) if link.direct else None
        lines.append(f'unit_column = "{link.column}"  # references {unit_table}.{unit_key}' if link.direct else
                     f'parent = "{link.column} -> {link.table}.{link.key}"  # a foreign key: each row belongs to '
                     f"the unit of its {link.table} row")
        cap = _round_up(most) if most else 100
        seen = f"the most a unit holds today is {most:,} (read with your access)" if most else "CONFIRM"
        lines.append(f"max_rows_per_unit = {cap}  # a hard cap; each query chooses its bound below it; {seen}")
    lines.append(f"[tables.{table}.columns]")
    for column in catalog.columns[table]:
        lines.append(_column_line(conn, catalog, table, column, private))
    return lines


def _column_line(conn: psycopg.Connection, catalog: Catalog, table: str, column: str, private: bool) -> str:
    type_name = catalog.schema_type(table, column)
    if type_name not in NUMERIC_TYPES | OTHER_TYPES:
        return f"# {column}: its type {catalog.columns[table][column]} is not one dpsql reads; left out"
    line = f'{column} = {{ type = "{type_name}" }}'
    if not private or (table, column) in catalog.unique or (table, column) in catalog.references:
        return line
    if type_name == "text":
        values = _few_values(conn, table, column)
        if values is not None:
            listed = ", ".join(f'"{v}"' for v in values)
            return (f"# CONFIRM: the values found in the data (read with your access, not a release); list every "
                    f'value that may occur\n{column} = {{ type = "text", domain = [{listed}] }}')
    if type_name in NUMERIC_TYPES or type_name in ("date", "timestamp", "timestamptz"):
        return ("# CONFIRM: to SUM, AVG or group by period, add lower = ..., upper = ... (the widest values that "
                f"make sense, not the data's)\n{line}")
    return line


def _row_count(conn: psycopg.Connection, table: str) -> int:
    return int(conn.execute(sql.SQL("SELECT COUNT(*) FROM {}").format(sql.Identifier(table))).fetchone()[0])


def _most_rows(conn: psycopg.Connection, table: str, column: str) -> int:
    query = sql.SQL("SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM {} GROUP BY {}) t").format(
        sql.Identifier(table), sql.Identifier(column))
    return int(conn.execute(query).fetchone()[0])


def _few_values(conn: psycopg.Connection, table: str, column: str) -> list[str] | None:
    query = sql.SQL("SELECT DISTINCT {} FROM {} WHERE {} IS NOT NULL ORDER BY 1 LIMIT {}").format(
        sql.Identifier(column), sql.Identifier(table), sql.Identifier(column), sql.Literal(DOMAIN_LIMIT + 1))
    values = [str(row[0]) for row in conn.execute(query)]
    if len(values) > DOMAIN_LIMIT or any('"' in v or "\\" in v for v in values):
        return None
    return values


def _round_up(count: int) -> int:
    """A cap above `count` with room to grow: the next of 10, 20, 50, 100, 200, 500, ..."""
    for power in range(0, 12):
        for step in (1, 2, 5):
            if step * 10 ** power >= 2 * count:
                return step * 10 ** power
    return count * 2


def data_report(conn: psycopg.Connection, schema: PrivacySchema) -> list[str]:
    """What the data holds beyond what the schema declares, in the owner's view (exact counts, read in the clear):
    values outside a domain or a bound, rows whose unit is missing, units above their table's cap."""
    return [line for table in schema.tables.values() if not table.public for line in _table_report(conn, schema, table)]


def _table_report(conn: psycopg.Connection, schema: PrivacySchema, table: Table) -> Iterator[str]:
    name = sql.Identifier(table.name)
    for column in table.columns.values():
        ident = sql.Identifier(column.name)
        if column.domain is not None and column.local is None:
            query = sql.SQL("SELECT {c}::text, COUNT(*) FROM {t} WHERE {c} IS NOT NULL AND NOT ({c} = ANY({d})) "
                            "GROUP BY 1 ORDER BY 2 DESC").format(c=ident, t=name, d=sql.Literal(list(column.domain)))
            for value, count in conn.execute(query):
                yield (f"{table.name}.{column.name}: {count:,} rows hold {value!r}, outside the declared domain: "
                       "answers grouped by it leave them out; add the value to the domain if it may occur")
        if column.bounded and (column.is_numeric or column.is_temporal):
            lower, upper = ((temporal_value(column.type, column.lower), temporal_value(column.type, column.upper))
                            if column.is_temporal else (column.lower, column.upper))
            query = sql.SQL("SELECT COUNT(*) FILTER (WHERE {c} < {lo}), COUNT(*) FILTER (WHERE {c} > {hi}) "
                            "FROM {t}").format(c=ident, t=name, lo=sql.Literal(lower), hi=sql.Literal(upper))
            below, above = conn.execute(query).fetchone()
            if below or above:
                lower, upper = (f"{v:g}" if isinstance(v, float) else str(v) for v in (lower, upper))
            yield (f"{table.name}.{column.name}: {below:,} rows below {lower} and {above:,} above {upper}: "
                       "sums and averages clamp them to the bounds; widen the bounds if such values are real")
    if table.unit_column is not None and table.name != schema.unit_table:
        ident = sql.Identifier(table.unit_column)
        query = sql.SQL("SELECT COUNT(*) FILTER (WHERE n > {cap}), MAX(n) FROM (SELECT COUNT(*) AS n FROM {t} "
                        "WHERE {c} IS NOT NULL GROUP BY {c}) t").format(t=name, c=ident,
                                                                         cap=sql.Literal(table.max_rows_per_unit))
        over, most = conn.execute(query).fetchone()
        if over:
            yield (f"{table.name}: {over:,} units hold more than max_rows_per_unit = {table.max_rows_per_unit} rows "
                   f"(the most: {most:,}); every answer leaves their extra rows out: raise the cap to about "
                   f"{_round_up(most)} (with rows_per_unit = \"auto\" each query still chooses a bound below it)")
        missing = conn.execute(sql.SQL("SELECT COUNT(*) FROM {t} WHERE {c} IS NULL").format(t=name, c=ident))
        count = missing.fetchone()[0]
        if count:
            yield (f"{table.name}: {count:,} rows have no {table.unit_column}: they belong to no unit, and no answer "
                   "counts them")


__all__ = ["data_report", "draft"]
