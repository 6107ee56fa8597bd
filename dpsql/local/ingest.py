"""`dpsql ingest`: load rows whose local columns were already randomized on the devices into a declared table.

Every value of a locally randomized column must be a report its randomizer can output (a boolean for rr, a
domain value for krr, one bit per domain value for oue, a cell id of the grid for geo): a value outside the
output space cannot be a report, and would be a true value in the clear or a mistake. The whole file is
checked before anything is written, and it is written in one transaction, so a bad file loads nothing.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from dpsql.errors import InvalidParameter, UnknownObject
from dpsql.local import randomizer
from dpsql.schema import Column, PrivacySchema

SHOWN_PROBLEMS = 5
TRUE, FALSE = {"t", "true", "1", "yes", "on"}, {"f", "false", "0", "no", "off"}


def ingest(database: str, schema: PrivacySchema, table: str, path: str | Path,
           progress: Callable[[str, int, int], None] | None = None) -> int:
    """Check and load the CSV or Parquet file `path` into `table`; return the number of rows loaded."""
    declared = schema.tables.get(table.lower())
    if declared is None:
        raise UnknownObject(f'table "{table}" is not declared in the privacy schema',
                            f"declared tables: {', '.join(sorted(schema.tables))}")
    header, rows = _read(Path(path))
    csv_file = Path(path).suffix.lower() != ".parquet"
    where, first = ("line", 2) if csv_file else ("row", 1)  # a CSV's line 1 is its header
    unknown = [name for name in header if name not in declared.columns]
    if unknown:
        raise InvalidParameter(f"{path} has columns that {declared.name} does not declare: {', '.join(unknown)}",
                               f"declared columns: {', '.join(declared.columns)}")
    columns = [declared.columns[name] for name in header]
    checked, problems = [], []
    for number, row in enumerate(rows, start=first):
        if len(row) != len(columns):
            problems.append(f"{where} {number} has {len(row)} values where the header names {len(columns)} (quote a "
                            "value that holds a comma, such as \"{t,f}\")")
            continue
        values = []
        for column, raw in zip(columns, row, strict=True):
            value, problem = _value(column, raw)
            if problem:
                problems.append(f"{where} {number}, {column.name} = {raw!r}: {problem}")
            values.append(value)
        checked.append(values)
    if problems:
        more = f" (and {len(problems) - SHOWN_PROBLEMS} more)" if len(problems) > SHOWN_PROBLEMS else ""
        raise InvalidParameter(f"{path}: {len(problems)} value(s) cannot be reports of their column's randomizer; "
                               f"nothing was loaded:\n  " + "\n  ".join(problems[:SHOWN_PROBLEMS]) + more,
                               "randomize each value on the device first (dpsql.local.randomize) and load the "
                               "reports")
    with psycopg.connect(database) as conn:
        conn.execute(_create_table(declared.name, declared.columns.values()))
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
            sql.Identifier(declared.name), sql.SQL(", ").join(sql.Identifier(c.name) for c in columns))
        with conn.cursor().copy(copy_sql) as copy:
            for done, values in enumerate(checked, start=1):
                copy.write_row(values)
                if progress and (done % 10_000 == 0 or done == len(checked)):
                    progress(declared.name, done, len(checked))
    return len(checked)


def _read(path: Path) -> tuple[list[str], list[list[Any]]]:
    if not path.exists():
        raise InvalidParameter(f"{path} does not exist")
    if path.suffix.lower() == ".parquet":
        try:
            import pandas as pd
            frame = pd.read_parquet(path)
        except ImportError as exc:
            raise InvalidParameter("reading Parquet needs pandas and pyarrow", "pip install pandas pyarrow") from exc
        frame = frame.astype(object).where(frame.notna(), None)
        return [str(c).lower() for c in frame.columns], frame.values.tolist()
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [name.strip().lower() for name in next(reader, [])]
        if not header:
            raise InvalidParameter(f"{path} is empty: a CSV needs a header line naming its columns")
        return header, [[None if v == "" else v for v in row] for row in reader]


def _value(column: Column, raw: Any) -> tuple[Any, str | None]:
    """The value to load, or a problem, for a local column; other columns load as PostgreSQL parses them."""
    if raw is None or column.local is None:
        return raw, None
    spec = column.local
    try:
        if spec.mechanism == "rr":
            value: Any = _boolean(raw)
        elif spec.mechanism == "oue":
            value = _bits(raw)
        elif column.is_integer:
            value = int(raw)
        else:
            value = str(raw)
    except ValueError as exc:
        return None, str(exc)
    if not randomizer(spec).accepts(value):
        return None, f"not a report of {spec.mechanism} ({_space(column)})"
    return (list(value) if spec.mechanism == "oue" else value), None


def _boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in TRUE | FALSE:
        return text in TRUE
    raise ValueError("not a boolean")


def _bits(raw: Any) -> tuple[bool, ...]:
    """A unary-encoded report: a list of booleans, PostgreSQL's {t,f,...}, [true, false, ...] or a 0/1 string."""
    if hasattr(raw, "tolist"):  # a Parquet list arrives as a numpy array
        raw = raw.tolist()
    if isinstance(raw, list | tuple):
        return tuple(_boolean(b) for b in raw)
    text = str(raw).strip()
    if text[:1] in "{[" and text[-1:] in "}]":
        return tuple(_boolean(b) for b in text[1:-1].split(",")) if text[1:-1].strip() else ()
    if text and set(text) <= {"0", "1"}:
        return tuple(c == "1" for c in text)
    raise ValueError("not a list of bits")


def _space(column: Column) -> str:
    spec = column.local
    if spec.mechanism == "oue":
        return f"{len(spec.labels)} bits, one per value of {list(spec.labels)}"
    if spec.mechanism == "rr":
        return "true or false"
    return f"one of {list(column.domain)}" if len(column.domain) <= 10 else \
        f"a cell id from 0 to {len(column.domain) - 1}"


def _create_table(name: str, columns: Any) -> sql.Composed:
    """CREATE TABLE IF NOT EXISTS with the declared columns and types (an existing table is used as it is)."""
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        sql.Identifier(name), sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type))
                                                 for c in columns))


__all__ = ["ingest"]
