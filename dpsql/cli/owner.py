"""The data owner's commands over the privacy schema: check (against the database too) and draft."""

from __future__ import annotations

import argparse


def schema_check(args: argparse.Namespace) -> int:
    from dpsql.schema import load_schema
    schema = load_schema(args.file)
    print(f"{args.file}: valid. Privacy unit: {schema.describe_unit()} ({schema.neighbouring} neighbours), "
          f"at most {schema.max_groups_per_unit} groups per unit.")
    for table in schema.tables.values():
        rows = f"{table.max_rows_per_unit} row{'s' * (table.max_rows_per_unit != 1)}"
        kind = "public" if table.public else f"private, at most {rows} per unit"
        if table.parent is not None:
            kind += f", reaching the unit through {table.parent}"
        print(f"  {table.name} ({kind})")
        for column in table.columns.values():
            facts = [column.type]
            if column.bounded:
                facts.append(column.describe_bounds())
            if column.domain:
                facts.append(f"domain of {len(column.domain)} values")
            if column.unique:
                facts.append("unique")
            if column.max_frequency:
                facts.append(f"max frequency {column.max_frequency}")
            print(f"    {column.name}: {', '.join(facts)}")
    if args.database:
        _check_against_database(schema, args.database)
    return 0


def _check_against_database(schema, url: str) -> None:
    """The schema against the catalog (SchemaError on a mismatch), then the owner's view of the data."""
    import psycopg

    from dpsql.backends import PostgresBackend
    from dpsql.owner import data_report
    from dpsql.schema.catalog import require_catalog
    backend = PostgresBackend(url, max_connections=1)
    try:
        require_catalog(schema, backend.catalog())
    finally:
        backend.close()
    print(f"{url}: every declared table and column exists with a compatible type, and every private table reaches "
          "the unit through a foreign key.")
    with psycopg.connect(url) as conn:
        conn.read_only = True
        found = data_report(conn, schema)
    print("The data against the schema (exact counts read with your access, for you only: not a release):")
    for line in found or ["every value is inside its domain and bounds, and no unit is above its table's cap"]:
        print(f"  - {line}")


def schema_draft(args: argparse.Namespace) -> int:
    import psycopg

    from dpsql.backends import PostgresBackend
    from dpsql.owner import draft
    backend = PostgresBackend(args.database, max_connections=1)
    try:
        catalog = backend.catalog()
    finally:
        backend.close()
    with psycopg.connect(args.database) as conn:
        conn.read_only = True
        print(draft(conn, catalog, args.unit), end="")
    return 0
