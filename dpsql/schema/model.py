"""The privacy schema's model: tables, columns and their declared bounds, the unit and how tables reach it.

Every bound here is declared, never read from the data; the rewrite enforces each one, so a sensitivity
computed from them holds on every neighbouring database.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

NUMERIC_TYPES = {"smallint", "integer", "bigint", "real", "double precision", "numeric"}
INTEGER_TYPES = {"smallint", "integer", "bigint"}
TEMPORAL_TYPES = {"date", "timestamp", "timestamptz"}
OTHER_TYPES = {"text", "boolean"} | TEMPORAL_TYPES
TYPE_ALIASES = {
    "int": "integer", "int4": "integer", "int2": "smallint", "int8": "bigint", "float": "double precision",
    "float8": "double precision", "float4": "real", "double": "double precision", "decimal": "numeric",
    "varchar": "text", "character varying": "text", "string": "text", "bool": "boolean",
    "timestamp without time zone": "timestamp", "timestamp with time zone": "timestamptz",
}
NEIGHBOURING = ("add-remove", "replace")
MECHANISMS = ("laplace", "gaussian")
ROWS_PER_UNIT = ("declared", "auto")  # a unit's rows: the declared bound, or chosen per query below it
ROW_LEVEL = "row"


EPOCH = datetime.datetime(1970, 1, 1)


def temporal_number(type_name: str, value: datetime.date) -> float:
    """A date as days since 1970-01-01, a timestamp as seconds since then (UTC where it has a time zone): how
    bounds of temporal columns are kept, and how quantiles of them are computed."""
    if type_name == "date":
        return float((value - EPOCH.date()).days)
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return (value - EPOCH).total_seconds()


def temporal_value(type_name: str, number: float) -> datetime.date:
    """The date or timestamp that `temporal_number` maps to `number` (rounded to the day or the second)."""
    if type_name == "date":
        return EPOCH.date() + datetime.timedelta(days=round(number))
    value = EPOCH + datetime.timedelta(seconds=round(number))
    return value.replace(tzinfo=datetime.UTC) if type_name == "timestamptz" else value


LOCAL_MECHANISMS = ("rr", "krr", "oue", "geo", "geo-lp")
LOCAL_TYPES = {"boolean[]"}  # optimized unary encoding's reports: one bit per domain value


@dataclass(frozen=True)
class LocalRandomizer:
    """How a locally private column's values were randomized on each person's device before collection: the
    column holds reports, and ε is each report's guarantee (per unit of distance for locations)."""

    mechanism: str  # rr | krr | oue | geo (planar Laplace on a grid) | geo-lp (optimal obfuscation on a grid)
    epsilon: float
    labels: tuple | None = None  # krr and oue: the values a person may hold
    grid: tuple[float, float, float, float, float] | None = None  # geo: x0, x1, y0, y1, step
    prior: tuple[float, ...] | None = None  # geo-lp: where people are, by cell


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    lower: float | None = None  # for dates and timestamps, as temporal_number gives them
    upper: float | None = None
    domain: tuple[Any, ...] | None = None
    max_frequency: int | None = None
    unique: bool = False
    local: LocalRandomizer | None = None  # set for a column of locally randomized reports
    # a grouped subquery's count or sum whose unit has several groups (rows): the most one unit's rows of it add
    # up to, the unit's k rows in all, below its rows times its upper bound. Out of repr, which digests a schema
    # (`Engine._schema_digest`): no declared column has one
    unit_total: float | None = field(default=None, repr=False)

    @property
    def is_numeric(self) -> bool:
        return self.type in NUMERIC_TYPES

    @property
    def is_integer(self) -> bool:
        return self.type in INTEGER_TYPES

    @property
    def is_temporal(self) -> bool:
        return self.type in TEMPORAL_TYPES

    @property
    def bounded(self) -> bool:
        return self.lower is not None

    @property
    def declared_values(self) -> int | None:
        """How many values the column is declared to take besides NULL: its domain's, a boolean's two; None if
        its values are not declared."""
        return len(self.domain) if self.domain is not None else 2 if self.type == "boolean" else None

    @property
    def wire_type(self) -> str:
        """The type an answer's column holding this column's values has (as the wire protocol names it)."""
        if self.is_integer:
            return "int8"
        if self.is_numeric:
            return "float8"
        return {"boolean": "bool"}.get(self.type, self.type if self.is_temporal else "text")

    def describe_bounds(self) -> str:
        if self.is_temporal:
            return f"[{temporal_value(self.type, self.lower)}, {temporal_value(self.type, self.upper)}]"
        return f"[{self.lower:g}, {self.upper:g}]"


@dataclass(frozen=True)
class ParentKey:
    """A private table without the unit column reaches the unit through a parent: each row belongs to the unit
    of the one parent row whose `key` equals its `column` (the key must be unique in the database)."""

    column: str
    table: str
    key: str

    def __str__(self) -> str:
        return f"{self.column} -> {self.table}.{self.key}"


@dataclass(frozen=True)
class Table:
    name: str
    columns: dict[str, Column]
    public: bool = False
    unit_column: str | None = None  # the column holding the privacy unit's id (None: row-level or public)
    max_rows_per_unit: int = 1
    parent: ParentKey | None = None  # for a private table without unit_column: the link towards the unit
    released: str | None = None  # a public table a release published (what it was): answered exactly, free
    path: str | None = None  # on Spark: Parquet files holding the table, where the Spark catalog has none
    trust_link: bool = False  # the owner vouches for unit_column or parent where no foreign key declares it


@dataclass(frozen=True)
class PrivacySchema:
    tables: dict[str, Table]
    unit_table: str | None  # None means row-level privacy: each row of a private table is its own unit
    unit_column: str | None
    neighbouring: str = "add-remove"
    max_groups_per_unit: int = 4
    mechanism: str = "laplace"  # noise for counts and sums unless the session or query picks another
    min_frequency: int = 1  # a released group holds at least this many units (enforced with DP; sessions may raise it)
    group_size: int = 1  # the guarantee is also stated for groups of this many units (households)
    rows_per_unit: str = "declared"  # auto: each query's rows per unit chosen from the data below the declared cap
    path: str | None = field(default=None, compare=False)

    @property
    def row_level(self) -> bool:
        return self.unit_table is None

    def describe_unit(self) -> str:
        return "each row" if self.row_level else f"{self.unit_table}.{self.unit_column}"

    def example_query(self) -> str:
        """A query this schema answers, for hints: a count per value of a column with a declared domain (or a
        boolean) of a private table, the unit's own table first; else a count of the unit's table's rows."""
        private = sorted((t for t in self.tables.values() if not t.public),
                         key=lambda t: (t.name != self.unit_table, t.name))
        for table in private:
            for column in table.columns.values():
                if column.local is None and (column.domain is not None or column.type == "boolean"):
                    return f"SELECT {column.name}, COUNT(*) FROM {table.name} GROUP BY {column.name}"
        return f"SELECT COUNT(*) FROM {private[0].name}" if private else "SELECT COUNT(*) FROM t"

    def sqlglot_schema(self) -> dict[str, dict[str, str]]:
        """The declared tables in the form `sqlglot.optimizer.qualify` takes."""
        return {t.name: {c.name: c.type for c in t.columns.values()} for t in self.tables.values()}
