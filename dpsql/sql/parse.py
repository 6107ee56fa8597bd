"""Parse: the analyst's text as exactly one SELECT statement (anything else is refused here)."""

from __future__ import annotations

import logging

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpsql.errors import PrivacyRefusal, QuerySyntaxError, UnsupportedQuery
from dpsql.sql.query import DIALECT, forget_positions, name_written_outputs

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its parser warnings would echo the analyst's text


def parse_select(sql: str) -> exp.Select:
    """The one SELECT statement of `sql`."""
    tree = parse_statement(sql)
    if isinstance(tree, exp.SetOperation):
        raise set_operation_refused(tree)
    return tree


def set_operation_refused(tree: exp.SetOperation) -> UnsupportedQuery:
    """The refusal of a whole statement that is a set operation dpsql does not compose (INTERSECT, EXCEPT)."""
    return UnsupportedQuery(f"{type(tree).__name__.upper()} is not supported as a whole statement: it would release "
                            "the rows it selects",
                            "count them instead: SELECT COUNT(*) FROM (<the same statement>) s, where each SELECT "
                            "picks the privacy unit's column of one table (a set of people); UNION [ALL] of "
                            "aggregate SELECTs is answered as a whole statement")


def parse_statement(sql: str) -> exp.Select | exp.SetOperation:
    """The one SELECT statement of `sql`, or a set operation (UNION, INTERSECT, EXCEPT) of SELECTs."""
    if not sql or not sql.strip():
        raise QuerySyntaxError("empty query", "send one SELECT statement")
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    except ParseError as exc:
        first_word = sql.split(None, 1)[0]
        if first_word.upper() not in COMMAND_WORDS and first_word.isidentifier():
            raise QuerySyntaxError(f'syntax error at or near "{first_word}"') from None
        raise QuerySyntaxError(syntax_error(exc)) from None
    except TokenError as exc:
        raise QuerySyntaxError(f"syntax error: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise PrivacyRefusal(f"expected exactly one statement, got {len(statements)}",
                             "send one SELECT per query")
    tree = forget_positions(name_written_outputs(statements[0], sql))
    for raw in list(tree.find_all(exp.RawString)):  # $$text$$, $tag$text$tag$: PostgreSQL's string constants
        raw.replace(exp.Literal.string(raw.this))
    if isinstance(tree, exp.SetOperation):
        return tree
    if not isinstance(tree, exp.Select):
        kind = tree.name.upper() if isinstance(tree, exp.Command) else tree.key.upper()
        raise PrivacyRefusal(f"only SELECT queries are answered, not {kind}",
                             "dpsql answers aggregate SELECT queries with noisy results; it never changes data")
    return tree


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


# the words a PostgreSQL statement can begin with; any other first word is a syntax error there
COMMAND_WORDS = frozenset({
    "ABORT", "ALTER", "ANALYZE", "ANALYSE", "BEGIN", "CALL", "CHECKPOINT", "CLOSE", "CLUSTER", "COMMENT", "COMMIT",
    "COPY", "CREATE", "DEALLOCATE", "DECLARE", "DELETE", "DISCARD", "DO", "DROP", "END", "EXECUTE", "EXPLAIN", "FETCH",
    "GRANT", "IMPORT", "INSERT", "LISTEN", "LOAD", "LOCK", "MERGE", "MOVE", "NOTIFY", "PREPARE", "REASSIGN", "REFRESH",
    "REINDEX", "RELEASE", "RESET", "REVOKE", "ROLLBACK", "SAVEPOINT", "SECURITY", "SELECT", "SET", "SHOW", "START",
    "TABLE", "TRUNCATE", "UNLISTEN", "UPDATE", "VACUUM", "VALUES", "WITH", "("})


def syntax_error(exc: ParseError) -> str:
    """PostgreSQL's wording for a parse error: at or near the token it stopped at, or at the end of the input
    (sqlglot names the last token when the text ends too soon)."""
    first = exc.errors[0] if exc.errors else {}
    near = first.get("highlight") or ""
    ended = not (first.get("end_context") or "").strip()
    too_soon = str(first.get("description", "")).startswith(("Required keyword", "Expecting", "Expected"))
    if not near or ended and too_soon:
        return "syntax error at end of input"
    return f'syntax error at or near "{near}"'
