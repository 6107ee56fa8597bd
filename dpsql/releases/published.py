"""Queries over public data: tables the schema declares public (reference data), and tables a release published
(`public = true` with `released = "..."`, post-processing of a release already charged), are answered exactly and
at no cost. A query whose every table is public runs as checked (one regenerated SELECT, read-only, with the
statement timeout), through every door alike (`dpsql serve` reads the same rows from its catalog copy); a public
table of locally randomized reports is estimated from instead (`dpsql.local.estimates`); any other query goes through
the analysis as always."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types

from dpsql.analysis.plan import Output
from dpsql.schema import PrivacySchema
from dpsql.sql import CheckedQuery
from dpsql.sql.dialect import Statement

TYPE_NAMES = {"BIGINT": "int8", "INT": "int8", "SMALLINT": "int8", "DOUBLE": "float8", "FLOAT": "float8",
              "DECIMAL": "float8", "TEXT": "text", "VARCHAR": "text", "BOOLEAN": "bool", "DATE": "date",
              "TIMESTAMP": "timestamp", "TIMESTAMPTZ": "timestamptz"}


@dataclass(frozen=True)
class PublishedQuery:
    statement: Statement
    outputs: list[Output]
    tables: tuple[str, ...]  # the released tables it reads
    public: tuple[str, ...] = ()  # the other public tables it reads

    @property
    def notes(self) -> list[str]:
        notes = [f"{', '.join(self.tables)}: released data (post-processing of a release already charged): "
                 "answered exactly, at no cost"] if self.tables else []
        if self.public:
            notes.append(f"{', '.join(self.public)}: public (the privacy schema says so): answered exactly, at no "
                         "cost")
        return notes


def plan_published(query: CheckedQuery, schema: PrivacySchema) -> PublishedQuery | None:
    """The exact plan of a query over public tables only (or over none: constants, and the noisy values of
    scalar subqueries answered before it), else None."""
    tables = [schema.tables.get(t.name) for t in query.tree.find_all(exp.Table)]
    if any(t is None or not t.public for t in tables):
        return None
    local = {name for t in tables for name, c in t.columns.items() if c.local is not None}
    if any(c.name in local for c in query.tree.find_all(exp.Column)):
        return None  # locally randomized reports are only estimated from (dpsql.local.estimates)
    typed = annotate_types(query.tree.copy(), schema=schema.sqlglot_schema(), dialect="postgres")
    outputs = [Output(name, exp.column(name), _type_name(e), False)
               for name, e in zip(query.output_names, typed.expressions, strict=True)]
    return PublishedQuery(Statement(query.tree.copy()), outputs, tuple(sorted({t.name for t in tables if t.released})),
                          tuple(sorted({t.name for t in tables if not t.released})))


def _type_name(node: exp.Expression) -> str:
    kind = node.type.this.name if node.type is not None else "TEXT"
    return TYPE_NAMES.get(kind, "text")


def exact_rows(plan: PublishedQuery, rows: list[tuple]) -> list[tuple]:
    """The rows as the declared output types hold them (PostgreSQL's numeric SUM as a float or an integer)."""
    kinds = [o.type_name for o in plan.outputs]
    return [tuple(float(v) if isinstance(v, Decimal) and kind == "float8" else
                  int(v) if isinstance(v, Decimal) and kind == "int8" else v for v, kind in zip(row, kinds,
                                                                                               strict=True))
            for row in rows]


__all__ = ["PublishedQuery", "exact_rows", "plan_published"]
