"""The privacy schema: what is private, who the privacy unit is, and the bounds the analysis may rely on.

A schema is a TOML file (see `schemas/demo.toml`). Every bound in it is declared, never read from the data,
and the rewrite enforces each one, so the sensitivity holds on every neighbouring database.
- `model`: the tables, columns and bounds; `load`: `load_schema` reads a file; `validate`: `parse_schema`
  checks a parsed document as a whole and reports every problem at once, each naming its table and column.
"""

from __future__ import annotations

from dpsql.schema.load import load_schema
from dpsql.schema.model import (
    INTEGER_TYPES,
    MECHANISMS,
    NEIGHBOURING,
    NUMERIC_TYPES,
    ROW_LEVEL,
    ROWS_PER_UNIT,
    TEMPORAL_TYPES,
    Column,
    ParentKey,
    PrivacySchema,
    Table,
    temporal_value,
)
from dpsql.schema.validate import parse_schema

__all__ = ["INTEGER_TYPES", "MECHANISMS", "NEIGHBOURING", "NUMERIC_TYPES", "ROWS_PER_UNIT", "ROW_LEVEL",
           "TEMPORAL_TYPES", "Column", "ParentKey", "PrivacySchema", "Table", "load_schema", "parse_schema",
           "temporal_value"]
