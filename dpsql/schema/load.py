"""Load: a privacy schema file (TOML, see `schemas/demo.toml`), validated as a whole."""

from __future__ import annotations

import tomllib
from pathlib import Path

from dpsql.errors import SchemaError
from dpsql.schema.model import PrivacySchema
from dpsql.schema.validate import parse_schema


def load_schema(path: str | Path) -> PrivacySchema:
    """Read and validate a privacy schema file; raise SchemaError listing every problem found."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SchemaError(f"privacy schema file {path} does not exist",
                          f"check the path (a relative one is read from {Path.cwd()})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SchemaError(f"privacy schema {path} is not valid TOML: {exc}") from None
    return parse_schema(raw, str(path))
