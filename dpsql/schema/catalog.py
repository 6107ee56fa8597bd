"""The schema against the database's catalog: every declared table and column exists with a compatible type, and
every private table reaches the unit through keys the database holds. The catalog is structure only (names, types,
keys), never a row, so a schema that fails here fails on every database and checking it reveals nothing.

`check_catalog` lists the problems; the engine refuses to start on any (`dpsql schema check --database` shows them
first), so an owner's typo is never an analyst's charged failure.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from dpsql.errors import SchemaError
from dpsql.schema.model import INTEGER_TYPES, NUMERIC_TYPES, TYPE_ALIASES, PrivacySchema, Table

TEXT_TYPES = {"text", "character", "bpchar", "name", "citext", "uuid"}


@dataclass(frozen=True)
class Catalog:
    """What the database declares about its tables (one schema of it, `public` on PostgreSQL)."""

    columns: dict[str, dict[str, str]]  # table -> column -> type, as PostgreSQL's format_type spells it
    unique: frozenset[tuple[str, str]] = frozenset()  # (table, column) of single-column primary or unique keys
    unique_sets: frozenset[tuple[str, frozenset[str]]] = frozenset()  # (table, columns) of keys of several columns
    not_null: frozenset[tuple[str, str]] = frozenset()
    references: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # single-column foreign keys
    enums: frozenset[str] = frozenset()  # user-defined enum types: text to the schema
    keys_known: bool = True  # False where the engine holds no keys (Spark): links cannot be checked

    def base_type(self, table: str, column: str) -> str:
        """The column's type as the schema names types: without its modifiers, aliases resolved."""
        spelled = re.sub(r"\(.*?\)", "", self.columns[table][column]).strip()
        return TYPE_ALIASES.get(spelled, spelled)

    def schema_type(self, table: str, column: str) -> str:
        """The type to declare for the column: text for any textual type or enum, else its base type."""
        actual = self.base_type(table, column)
        return "text" if actual in TEXT_TYPES or actual in self.enums else actual


def check_catalog(schema: PrivacySchema, catalog: Catalog) -> list[str]:
    """Every way `schema` does not match `catalog`, each naming the table, the column and the fix."""
    problems: list[str] = []
    for table in schema.tables.values():
        if table.name not in catalog.columns:
            problems.append(f"[tables.{table.name}]: the database has no table {table.name}"
                            f"{_did_you_mean(table.name, catalog.columns)}")
            continue
        for column in table.columns.values():
            problems += _column_problems(table.name, column.name, column.type, catalog)
        if catalog.keys_known and not table.public:
            problems += _link_problems(schema, table, catalog)
    return problems


def require_catalog(schema: PrivacySchema, catalog: Catalog) -> None:
    """SchemaError listing every mismatch, or nothing."""
    problems = check_catalog(schema, catalog)
    if problems:
        raise SchemaError(f"privacy schema {schema.path or ''} does not match the database:\n  - "
                          + "\n  - ".join(problems),
                          "fix the schema (or the database); `dpsql schema check FILE --database URL` re-checks it")


def _column_problems(table: str, column: str, declared: str, catalog: Catalog) -> list[str]:
    where = f"column {table}.{column}"
    if column not in catalog.columns[table]:
        return [f"{where}: the table has no column {column}{_did_you_mean(column, catalog.columns[table])}"]
    actual = catalog.base_type(table, column)
    if not _compatible(declared, actual, catalog.enums):
        return [f"{where} is declared {declared} but the database holds {catalog.columns[table][column]}: "
                f"declare type = \"{catalog.schema_type(table, column)}\""]
    return []


def _compatible(declared: str, actual: str, enums: frozenset[str]) -> bool:
    """Whether values of the database's type can be treated as the declared type: an integer only as an integer, a
    fractional number as any non-integer numeric, text as text of any length or an enum, and the rest exactly."""
    if declared in INTEGER_TYPES:
        return actual in INTEGER_TYPES
    if declared in NUMERIC_TYPES:
        return actual in NUMERIC_TYPES
    if declared == "text":
        return actual in TEXT_TYPES or actual in enums
    return declared == actual


def _link_problems(schema: PrivacySchema, table: Table, catalog: Catalog) -> list[str]:
    """A private table's rows reach the unit through a foreign key to the unit's key (its unit column) or to a
    unique key of its parent, so that the unit the analysis counts is the one the owner meant; `trust_link = true`
    vouches for a link the database does not declare."""
    if schema.row_level or table.name == schema.unit_table or table.trust_link:
        return []
    where = f"[tables.{table.name}]"
    vouch = f"or, if the link holds without a key, add trust_link = true to {where}"
    if table.unit_column is not None:
        target = (schema.unit_table, schema.unit_column)
        found = catalog.references.get((table.name, table.unit_column))
        if found == target:
            return []
        refers = f"references {found[0]}.{found[1]}" if found else "is no foreign key"
        return [f"{where} unit_column = \"{table.unit_column}\" {refers}, so its rows need not belong to the unit "
                f"{target[0]}.{target[1]}: name the column that references {target[0]}.{target[1]} "
                f"(ALTER TABLE {table.name} ADD FOREIGN KEY ({table.unit_column}) REFERENCES "
                f"{target[0]} ({target[1]})), {vouch}"]
    link = table.parent
    problems = []
    if (link.table, link.key) not in catalog.unique:
        problems.append(f"{where} parent = \"{link}\": {link.table}.{link.key} is not a primary or unique key, so "
                        f"a {table.name} row could belong to several {link.table} rows: name the parent's key")
    elif catalog.references.get((table.name, link.column)) != (link.table, link.key):
        problems.append(f"{where} parent = \"{link}\": {table.name}.{link.column} is no foreign key to "
                        f"{link.table}.{link.key} (ALTER TABLE {table.name} ADD FOREIGN KEY ({link.column}) "
                        f"REFERENCES {link.table} ({link.key})), {vouch}")
    return problems


def _did_you_mean(name: str, known: dict) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return f" (did you mean {close[0]}?)" if close else ""


__all__ = ["Catalog", "check_catalog", "require_catalog"]
