"""Parse: the analyst's text as exactly one SELECT statement (anything else is refused here)."""

from __future__ import annotations

import logging

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpsql.errors import PrivacyRefusal, QuerySyntaxError, UnsupportedQuery
from dpsql.sql.query import DIALECT

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its parser warnings would echo the analyst's text


def parse_select(sql: str) -> exp.Select:
    """The one SELECT statement of `sql`."""
    if not sql or not sql.strip():
        raise QuerySyntaxError("empty query", "send one SELECT statement")
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    except (ParseError, TokenError) as exc:
        raise QuerySyntaxError(f"syntax error: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise PrivacyRefusal(f"expected exactly one statement, got {len(statements)}",
                             "send one SELECT per query")
    tree = statements[0]
    if isinstance(tree, exp.SetOperation):
        raise UnsupportedQuery(f"{type(tree).__name__.upper()} is not supported",
                               "run each SELECT separately; each answer is noised and charged on its own")
    if not isinstance(tree, exp.Select):
        kind = tree.name.upper() if isinstance(tree, exp.Command) else tree.key.upper()
        raise PrivacyRefusal(f"only SELECT queries are answered, not {kind}",
                             "dpsql answers aggregate SELECT queries with noisy results; it never changes data")
    return tree


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
