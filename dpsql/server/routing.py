"""Where each statement a client sends goes: dpsql's own options, the data-free shadow database, or the engine.

    SET/SHOW/RESET dpsql.*                       -> the session's DP options
    other SET/SHOW/RESET                         -> the shadow (settings of the client's own session)
    queries reading no private table, or rows
    that cannot exist (WHERE 1 <> 1, LIMIT 0)    -> the shadow (same tables and columns, no private rows)
    queries reading private tables               -> the engine (noisy aggregates, or a refusal)
    anything else (writes, EXPLAIN, COPY, ...)   -> refused

Even without rows, some catalog views and functions describe the server rather than the schema: statistics,
sizes, other sessions' activity, transaction and WAL counters. Queries that name them are refused before
they reach the shadow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.tokens import TokenType

from dpsql.errors import PrivacyRefusal, UnsupportedQuery
from dpsql.server.statements import Statement
from dpsql.session import SessionCommand, parse_session_command

QUERY_WORDS = {"SELECT", "WITH", "VALUES", "TABLE", "("}
# names (matched whole, case-insensitively) that reveal the server's data or activity even in an empty database
SERVER_STATE = re.compile(
    r"pg_stat\w*|pg_statio\w*|\w*_size|pg_ls_\w+|pg_read_\w+|pg_file\w*|lo_\w+|dblink\w*|pg_sleep\w*|set_config"
    r"|pg_terminate_backend|pg_cancel_backend|pg_reload_conf|txid_\w+|pg_current_\w+|pg_control_\w+|pg_last_\w+"
    r"|pg_wal\w*|pg_xact\w*|pg_snapshot\w*|pg_visible_in_snapshot|pg_locks|pg_blocking_pids|pg_backend_memory\w*"
    r"|pg_shmem\w*|pg_get_wal\w*|pg_replication\w*|pg_prepared_xacts|pg_promote|pg_notify|pg_log_\w+|pg_switch_wal"
    r"|pg_export_snapshot|pg_create_\w+|pg_drop_\w+|pg_copy_\w+|pg_logical\w*|pg_advisory\w*|pg_import_system\w*"
    r"|setseed|(query|table|schema|database|cursor)_to_xml\w*|\w*frozenxid|\w*minmxid|xmin|xmax|mxid_age|pg_sequence_\w+",
    re.IGNORECASE)
GUARDED_SETTINGS = re.compile(
    r"^\s*(SET|RESET)\s+(SESSION\s+|LOCAL\s+)?(ROLE|SESSION\s+AUTHORIZATION|\"?default_transaction_read_only"
    r"|\"?transaction_read_only|\"?statement_timeout)\b", re.IGNORECASE)
# settings that change how later statements are lexed or encoded: a value other than these would let dpsql's
# parser and PostgreSQL read one string two ways (a quote that ends a literal for one and not the other)
LEXING_SETTINGS = {
    "standard_conforming_strings": {"on", "true", "yes", "1", "default"},
    "backslash_quote": {"safe_encoding", "default"},
    "escape_string_warning": {"on", "true", "yes", "1", "default"},
    "client_encoding": {"utf8", "utf-8", "unicode", "default"},
    "names": {"utf8", "utf-8", "unicode", "default"},  # SET NAMES is client_encoding
}
SET_VALUE = re.compile(r"^\s*SET\s+(?:SESSION\s+|LOCAL\s+)?\"?(\w+)\"?\s*(?:TO\b|=)?\s*(.*?)\s*;?\s*$",
                       re.IGNORECASE | re.DOTALL)
SCHEMA_CATALOGS = {"pg_statistic_ext"}  # definitions of statistics objects (psql's \d lists them), not their data
IDENTIFIER_TOKENS = {TokenType.VAR, TokenType.IDENTIFIER}


@dataclass(frozen=True)
class Route:
    kind: str  # option | setting | catalog | private | noop
    command: SessionCommand | None = None  # for option
    tag: str = ""  # for noop


def route(statement: Statement, private: frozenset[str]) -> Route:
    """Where `statement` goes; raises a dpsql error for what is refused."""
    word = statement.first_word
    if word in ("SET", "RESET", "SHOW"):
        command = parse_session_command(statement.sql)
        if command is not None:
            return Route("option", command)
        if GUARDED_SETTINGS.match(statement.sql) or re.search(r"\bREAD\s+WRITE\b", statement.sql, re.IGNORECASE):
            raise PrivacyRefusal("dpsql does not let a session change its role or read-only mode")
        _refuse_lexing_change(statement)
        return Route("setting")
    if word in QUERY_WORDS:
        if _reads_data(statement, private):
            return Route("private")
        _refuse_server_state(statement)
        return Route("catalog")
    if word == "UNLISTEN":
        return Route("noop", tag="UNLISTEN")
    if word == "EXPLAIN":
        raise PrivacyRefusal("EXPLAIN is not answered: a plan shows row estimates taken from the data",
                             "`dpsql explain` shows what a query would cost and how dpsql rewrites it")
    if word in ("LISTEN", "NOTIFY", "PREPARE", "EXECUTE", "DECLARE", "FETCH", "MOVE", "CLOSE"):
        raise UnsupportedQuery(f"{word} is not supported by dpsql",
                               "use your driver's prepared statements (the extended protocol) instead")
    raise PrivacyRefusal(f"dpsql only answers queries: {word or 'this statement'} is not allowed",
                         "send SELECT queries with aggregates (COUNT, SUM, AVG, ...); dpsql never writes")


def _refuse_lexing_change(statement: Statement) -> None:
    found = SET_VALUE.match(statement.sql) if statement.first_word == "SET" else None
    if found is None or found.group(1).lower() not in LEXING_SETTINGS:
        return
    name, value = found.group(1).lower(), found.group(2).strip("'\"").lower()
    if value not in LEXING_SETTINGS[name]:
        raise PrivacyRefusal(f"dpsql does not let a session set {name} to {found.group(2)}: it changes how "
                             "later statements are read", "dpsql speaks UTF8 with standard conforming strings; "
                             "write E'...' for backslash escapes")


def _reads_data(statement: Statement, private: frozenset[str]) -> bool:
    """Whether the query reads a private table in a way that could return its rows."""
    try:
        tree = sqlglot.parse_one(statement.sql, read="postgres")
    except ParseError:  # let whoever answers report the syntax error; be conservative about which one
        return any(t.token_type in IDENTIFIER_TOKENS and t.text.lower() in private for t in statement.tokens)
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    tables = {t.name.lower() for t in tree.find_all(exp.Table)
              if t.db.lower() in ("", "public") and t.name.lower() not in ctes}
    return bool(tables & private) and not _returns_no_rows(tree)


def _returns_no_rows(tree: exp.Expression) -> bool:
    """`... WHERE 1 <> 1` or `... LIMIT 0`: the probes BI tools send to learn a query's columns."""
    if not isinstance(tree, exp.Select):
        return False
    limit = tree.args.get("limit")
    if limit is not None and isinstance(limit.expression, exp.Literal) and limit.expression.this == "0":
        return True
    where = tree.args.get("where")
    return where is not None and _constant_false(where.this)


def _constant_false(node: exp.Expression) -> bool:
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.Boolean):
        return not node.this
    if isinstance(node, exp.And):
        return _constant_false(node.left) or _constant_false(node.right)
    compare = {exp.EQ: float.__eq__, exp.NEQ: float.__ne__, exp.GT: float.__gt__, exp.GTE: float.__ge__,
               exp.LT: float.__lt__, exp.LTE: float.__le__}.get(type(node))
    if compare and all(isinstance(s, exp.Literal) and not s.is_string for s in (node.left, node.right)):
        return not compare(float(node.left.this), float(node.right.this))
    return False


def _refuse_server_state(statement: Statement) -> None:
    if re.search(r"\bu&['\"]", statement.sql, re.IGNORECASE):
        raise PrivacyRefusal("Unicode-escaped names (U&\"...\") are not accepted in catalog queries")
    for token in statement.tokens:
        if (token.token_type in IDENTIFIER_TOKENS and SERVER_STATE.fullmatch(token.text)
                and token.text.lower() not in SCHEMA_CATALOGS):
            raise PrivacyRefusal(f'dpsql does not answer "{token.text}": it describes the server\'s data or '
                                 "activity (statistics, sizes, sessions, transaction counters)",
                                 "catalog queries see a copy of the declared tables without rows; ask for "
                                 "aggregates of the data instead")
