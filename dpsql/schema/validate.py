"""Validate: a schema's raw settings become the model, or SchemaError lists every problem at once, each naming
the table and column it concerns (a bound the analysis would rely on is never guessed)."""

from __future__ import annotations

import datetime
import math
from typing import Any

from dpsql.errors import SchemaError
from dpsql.mechanisms.local import MAX_LP_CELLS, Grid
from dpsql.schema.model import (
    INTEGER_TYPES,
    LOCAL_MECHANISMS,
    LOCAL_TYPES,
    MECHANISMS,
    NEIGHBOURING,
    NUMERIC_TYPES,
    OTHER_TYPES,
    ROW_LEVEL,
    ROWS_PER_UNIT,
    TEMPORAL_TYPES,
    TYPE_ALIASES,
    Column,
    LocalRandomizer,
    ParentKey,
    PrivacySchema,
    Table,
    temporal_number,
)


def parse_schema(raw: dict[str, Any], source: str = "<schema>") -> PrivacySchema:
    """The schema that `raw` (a parsed TOML document) declares; `source` names it in error messages."""
    problems: list[str] = []
    privacy = raw.get("privacy", {})
    unit = privacy.get("unit")
    unit_table = unit_column = None
    if not isinstance(unit, str):
        problems.append('[privacy] unit is missing: give "table.column" (e.g. "people.person_id") or "row"')
    elif unit != ROW_LEVEL:
        if unit.count(".") != 1:
            problems.append(f'[privacy] unit = "{unit}" must be "table.column" or "row"')
        else:
            unit_table, unit_column = unit.split(".")
    neighbouring = privacy.get("neighbouring", "add-remove")
    if neighbouring not in NEIGHBOURING:
        problems.append(f'[privacy] neighbouring = "{neighbouring}" must be one of {", ".join(NEIGHBOURING)}')
    max_groups = privacy.get("max_groups_per_unit", 4)
    if not _positive_int(max_groups):
        problems.append(f"[privacy] max_groups_per_unit = {max_groups!r} must be a whole number >= 1")

    min_frequency, group_size = privacy.get("min_frequency", 1), privacy.get("group_size", 1)
    for name, value in (("min_frequency", min_frequency), ("group_size", group_size)):
        if not _positive_int(value):
            problems.append(f"[privacy] {name} = {value!r} must be a whole number >= 1")
    mechanism = privacy.get("mechanism", "laplace")
    if mechanism not in MECHANISMS:
        problems.append(f'[privacy] mechanism = "{mechanism}" must be one of {", ".join(MECHANISMS)}')
    rows_per_unit = privacy.get("rows_per_unit", "declared")
    if rows_per_unit not in ROWS_PER_UNIT:
        problems.append(f'[privacy] rows_per_unit = {rows_per_unit!r} must be one of {", ".join(ROWS_PER_UNIT)}: '
                        "declared (each table's max_rows_per_unit) or auto (chosen per query from the data below it)")

    raw_tables = raw.get("tables")
    if not isinstance(raw_tables, dict) or not raw_tables:
        problems.append("no [tables.NAME] sections: declare at least the table that holds the privacy unit")
        raw_tables = {}
    tables = {}
    for name, spec in raw_tables.items():
        table = _parse_table(name.lower(), spec, unit_table, unit_column, problems)
        if table is not None:
            tables[table.name] = table

    if unit_table is not None and unit_table not in tables:
        problems.append(f'[privacy] unit names table "{unit_table}", which no [tables.{unit_table}] declares')
    _check_parents(tables, problems)
    if unit_table is None and unit == ROW_LEVEL and not any(not t.public for t in tables.values()):
        problems.append("row-level privacy needs at least one private table")
    if problems:
        raise SchemaError(f"privacy schema {source} is invalid:\n  - " + "\n  - ".join(problems),
                          "fix the lines named above; `dpsql schema check FILE` re-checks the file")
    return PrivacySchema(tables=tables, unit_table=unit_table, unit_column=unit_column,
                         neighbouring=neighbouring, max_groups_per_unit=int(max_groups), mechanism=mechanism,
                         min_frequency=int(min_frequency), group_size=int(group_size), rows_per_unit=rows_per_unit,
                         path=source)


def _parse_table(name: str, spec: Any, unit_table: str | None, unit_column: str | None,
                 problems: list[str]) -> Table | None:
    where = f"[tables.{name}]"
    if not isinstance(spec, dict):
        problems.append(f"{where} must be a table of settings")
        return None
    unknown = set(spec) - {"public", "unit_column", "max_rows_per_unit", "columns", "parent", "released", "path",
                          "trust_link"}
    if unknown:
        problems.append(f"{where} has unknown settings: {', '.join(sorted(unknown))}")
    public = spec.get("public", False)
    if not isinstance(public, bool):
        problems.append(f"{where} public must be true or false")
        public = False
    columns = {}
    raw_columns = spec.get("columns")
    if not isinstance(raw_columns, dict) or not raw_columns:
        problems.append(f"{where} declares no columns: add [tables.{name}.columns]")
        raw_columns = {}
    for col_name, col_spec in raw_columns.items():
        column = _parse_column(f"{name}.{col_name.lower()}", col_name.lower(), col_spec, problems)
        if column is not None:
            columns[column.name] = column

    table_unit_column = spec.get("unit_column")
    max_rows = spec.get("max_rows_per_unit", 1 if name == unit_table else None)
    parent = _parse_parent(where, spec["parent"], columns, problems) if "parent" in spec else None
    path = spec.get("path")
    if path is not None and not (isinstance(path, str) and path):
        problems.append(f'{where} path = "..." names the Parquet files of the table (for the Spark backend)')
        path = None
    released = spec.get("released")
    if released is not None and not (public and isinstance(released, str) and released):
        problems.append(f'{where} released = "..." describes a public table that a release published: it needs '
                        "public = true and a description")
        released = None
    trust_link = spec.get("trust_link", False)
    if not isinstance(trust_link, bool):
        problems.append(f"{where} trust_link must be true or false")
        trust_link = False
    if public:
        if table_unit_column is not None or "max_rows_per_unit" in spec or parent is not None or trust_link:
            problems.append(f"{where} is public: unit_column, parent, max_rows_per_unit and trust_link do not apply")
        return Table(name, columns, public=True, released=released, path=path)
    if unit_table is None:  # row-level privacy
        if table_unit_column is not None or parent is not None:
            problems.append(f"{where} unit_column and parent do not apply under row-level privacy")
        if max_rows not in (None, 1):
            problems.append(f"{where} max_rows_per_unit must be 1 under row-level privacy")
        return Table(name, columns, unit_column=None, max_rows_per_unit=1, path=path)
    if name == unit_table:
        table_unit_column = table_unit_column or unit_column
        if table_unit_column != unit_column:
            problems.append(f"{where} is the unit table: its unit_column must be {unit_column}")
    if table_unit_column is not None and parent is not None:
        problems.append(f"{where} declares both unit_column and parent: a table reaches the unit one way")
    if table_unit_column is None and parent is None:
        problems.append(f"{where} is private but has no unit_column: name the column that references "
                        f"{unit_table}.{unit_column}, give a parent = \"column -> table.key\" through which "
                        "its rows reach the unit, or mark the table public = true")
    elif table_unit_column is not None and table_unit_column not in columns:
        problems.append(f"{where} unit_column {table_unit_column} is not among its declared columns")
    if not _positive_int(max_rows):
        problems.append(f"{where} max_rows_per_unit = {max_rows!r}: a private table needs a whole number >= 1 "
                        "(the most rows one unit may have; rows beyond it are bounded away by the rewrite)")
        max_rows = 1
    return Table(name, columns, unit_column=table_unit_column, max_rows_per_unit=int(max_rows), parent=parent,
                 path=path, trust_link=trust_link)


def _parse_parent(where: str, spec: Any, columns: dict[str, Column], problems: list[str]) -> ParentKey | None:
    text = spec if isinstance(spec, str) else ""
    left, _, right = text.partition("->")
    table, _, key = right.strip().partition(".")
    column = left.strip().lower()
    if not (column and table and key):
        problems.append(f'{where} parent = {spec!r} must look like "column -> table.key"')
        return None
    if column not in columns:
        problems.append(f"{where} parent column {column} is not among its declared columns")
    return ParentKey(column, table.strip().lower(), key.strip().lower())


def _check_parents(tables: dict[str, Table], problems: list[str]) -> None:
    """Every parent is a declared private table with the key column, and each chain ends at a unit column."""
    for table in tables.values():
        seen, current = {table.name}, table
        while current.parent is not None:
            link = current.parent
            parent = tables.get(link.table)
            where = f"[tables.{current.name}] parent = \"{link}\""
            if parent is None or parent.public:
                problems.append(f"{where}: {link.table} must be a declared private table")
                break
            if link.key not in parent.columns:
                problems.append(f"{where}: {link.table} declares no column {link.key}")
                break
            if parent.name in seen:
                problems.append(f"{where}: the parents of {table.name} form a cycle")
                break
            seen.add(parent.name)
            current = parent


def _parse_column(where: str, name: str, spec: Any, problems: list[str]) -> Column | None:
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        problems.append(f"column {where} must be a type name or a table like {{ type = \"integer\" }}")
        return None
    unknown = set(spec) - {"type", "lower", "upper", "domain", "max_frequency", "unique", "local"}
    if unknown:
        problems.append(f"column {where} has unknown settings: {', '.join(sorted(unknown))}")
    raw_type = str(spec.get("type", "")).strip().lower()
    col_type = TYPE_ALIASES.get(raw_type, raw_type)
    if col_type not in NUMERIC_TYPES | OTHER_TYPES | (LOCAL_TYPES if "local" in spec else set()):
        problems.append(f"column {where} has type {raw_type!r}; supported: "
                        + ", ".join(sorted(NUMERIC_TYPES | OTHER_TYPES))
                        + (" (and boolean[] for local = { mechanism = \"oue\" })" if col_type in LOCAL_TYPES else ""))
        return None
    lower, upper = spec.get("lower"), spec.get("upper")
    if (lower is None) != (upper is None):
        problems.append(f"column {where} declares only one of lower/upper: declare both")
        lower = upper = None
    if lower is not None and col_type in TEMPORAL_TYPES:
        lower, upper = (_temporal_bound(where, col_type, v, problems) for v in (lower, upper))
        if None not in (lower, upper) and lower > upper:
            problems.append(f"column {where} has lower {spec['lower']} after upper {spec['upper']}")
    elif lower is not None:
        if col_type not in NUMERIC_TYPES:
            problems.append(f"column {where} has bounds but type {col_type} is neither numeric nor a date or time")
        elif not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                     for v in (lower, upper)):
            problems.append(f"column {where} bounds must be finite numbers")
        elif lower > upper:
            problems.append(f"column {where} has lower {lower} > upper {upper}")
        elif max(abs(lower), abs(upper)) > 1e12:
            problems.append(f"column {where} bounds beyond ±1e12 are not supported (noise would swamp any answer)")
        elif col_type in INTEGER_TYPES and math.ceil(lower) > math.floor(upper):
            # the clamp keeps integers inside [lower, upper]; with none there it could only leave the range
            problems.append(f"column {where} is an integer column whose bounds [{lower}, {upper}] hold no integer")
    domain = spec.get("domain")
    if domain is not None:
        if not isinstance(domain, list) or not domain:
            problems.append(f"column {where} domain must be a non-empty list of values")
            domain = None
        elif len(set(domain)) != len(domain):
            problems.append(f"column {where} domain lists a value twice")
        else:
            domain = tuple(domain)
    max_frequency = spec.get("max_frequency")
    if max_frequency is not None and not _positive_int(max_frequency):
        problems.append(f"column {where} max_frequency must be a whole number >= 1")
        max_frequency = None
    unique = spec.get("unique", False)
    if not isinstance(unique, bool):
        problems.append(f"column {where} unique must be true or false")
        unique = False
    local = None
    if "local" in spec:
        if lower is not None:
            problems.append(f"column {where} holds local reports: bounds do not apply (its values are the reports)")
        local = _parse_local(where, col_type, spec["local"], domain, problems)
        if local is not None and local.mechanism == "oue":
            domain = None  # the domain names the bits; the column's values are arrays of them
        elif local is not None and local.grid is not None:
            domain = tuple(range(_grid_cells(local.grid)))  # the cell ids a report may take
    return Column(name, col_type, None if lower is None else float(lower), None if upper is None else float(upper),
                  domain, max_frequency, unique, local)


LOCAL_TYPE = {"rr": {"boolean"}, "krr": {"text", *INTEGER_TYPES}, "oue": {"boolean[]"}, "geo": INTEGER_TYPES,
              "geo-lp": INTEGER_TYPES}


def _parse_local(where: str, col_type: str, spec: Any, domain: tuple | None,
                 problems: list[str]) -> LocalRandomizer | None:
    """`local = { mechanism = ..., epsilon = ... }`: the randomizer each person's device applied."""
    example = 'local = { mechanism = "rr", epsilon = 1.0 }'
    if not isinstance(spec, dict):
        problems.append(f"column {where} local must be a table like {example}")
        return None
    mechanism, epsilon = spec.get("mechanism"), spec.get("epsilon")
    allowed = {"mechanism", "epsilon"} | ({"grid"} if mechanism in ("geo", "geo-lp") else set()) \
        | ({"prior"} if mechanism == "geo-lp" else set())
    problem_count = len(problems)
    if set(spec) - allowed:
        problems.append(f"column {where} local has unknown settings: {', '.join(sorted(set(spec) - allowed))}")
    if mechanism not in LOCAL_MECHANISMS:
        problems.append(f"column {where} local mechanism {mechanism!r} must be one of {', '.join(LOCAL_MECHANISMS)}")
        return None
    if not (isinstance(epsilon, int | float) and not isinstance(epsilon, bool) and math.isfinite(epsilon)
            and epsilon > 0):
        problems.append(f"column {where} local epsilon must be a number > 0")
    if col_type not in LOCAL_TYPE[mechanism]:
        problems.append(f"column {where} local mechanism {mechanism} needs a column of type "
                        f"{' or '.join(sorted(LOCAL_TYPE[mechanism]))}, not {col_type}")
    if mechanism in ("krr", "oue") and (domain is None or len(domain) < 2):
        problems.append(f"column {where} local mechanism {mechanism} needs a domain of at least two values (the "
                        "values a person may hold)")
    grid = _parse_grid(where, spec.get("grid"), problems) if mechanism in ("geo", "geo-lp") else None
    if grid is not None and mechanism == "geo-lp" and _grid_cells(grid) > MAX_LP_CELLS:
        problems.append(f"column {where} local geo-lp grid has {_grid_cells(grid)} cells: an optimal obfuscation is "
                        f"solved for at most {MAX_LP_CELLS}; use a larger step, or mechanism = \"geo\"")
    prior = spec.get("prior")
    if prior is not None and not (isinstance(prior, list) and all(isinstance(v, int | float) and v >= 0
                                                                  for v in prior) and sum(prior) > 0
                                  and (grid is None or len(prior) == _grid_cells(grid))):
        problems.append(f"column {where} local prior must list one weight >= 0 per grid cell")
    if len(problems) > problem_count:
        return None
    return LocalRandomizer(mechanism, float(epsilon), domain if mechanism in ("krr", "oue") else None, grid,
                           None if prior is None else tuple(float(v) for v in prior))


def _parse_grid(where: str, spec: Any, problems: list[str]) -> tuple[float, float, float, float, float] | None:
    """`grid = { x = [x0, x1], y = [y0, y1], step = s }`, checked by the mechanism's own rules."""
    try:
        grid = Grid(*spec["x"], *spec["y"], spec["step"])
        return grid.x0, grid.x1, grid.y0, grid.y1, grid.step
    except (TypeError, KeyError, ValueError) as exc:
        detail = f": {exc}" if isinstance(exc, ValueError) else ""
        problems.append(f"column {where} local grid must look like {{ x = [0, 10], y = [0, 10], step = 1 }}{detail}")
        return None


def _grid_cells(grid: tuple[float, ...]) -> int:
    x0, x1, y0, y1, step = grid
    return round((x1 - x0) / step) * round((y1 - y0) / step)


def _temporal_bound(where: str, col_type: str, value: Any, problems: list[str]) -> float | None:
    """A date or timestamp bound (a TOML date or datetime, or an ISO 8601 string) as `temporal_number`."""
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            value = None
    if isinstance(value, datetime.datetime) and col_type == "date":
        value = value.date() if value.time() == datetime.time() and value.tzinfo is None else None
    elif isinstance(value, datetime.date) and not isinstance(value, datetime.datetime) and col_type != "date":
        value = datetime.datetime.combine(value, datetime.time())
    if not isinstance(value, datetime.date):
        example = "2024-01-01" if col_type == "date" else "2024-01-01T00:00:00"
        problems.append(f"column {where} is a {col_type} column: its bounds must be {col_type}s, e.g. {example}")
        return None
    return temporal_number(col_type, value)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
