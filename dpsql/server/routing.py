"""Where each statement a client sends goes: dpsql's own options, the data-free shadow database, or the engine.

    SET/SHOW/RESET dpsql.*                       -> the session's DP options
    other SET/SHOW/RESET                         -> the shadow (settings of the client's own session)
    queries reading no private table, or rows
    that cannot exist (WHERE 1 <> 1, LIMIT 0)    -> the shadow (same tables and columns, no private rows)
    queries reading private tables               -> the engine (noisy aggregates, or a refusal)
    anything else (writes, EXPLAIN, COPY FROM)   -> refused
    (DECLARE/FETCH/CLOSE and COPY ... TO STDOUT are the conversation's: the query inside is routed as above)

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
from sqlglot.tokens import Token, TokenType

from dpsql.errors import PrivacyRefusal, QuerySyntaxError, UnsupportedQuery
from dpsql.server.statements import Statement, closing_paren
from dpsql.session import SessionCommand, parse_session_command
from dpsql.sql.parse import COMMAND_WORDS

QUERY_WORDS = {"SELECT", "WITH", "VALUES", "TABLE", "("}
# names (matched whole, case-insensitively) that reveal the server's data or activity even in an empty database
SERVER_STATE = re.compile(
    r"pg_stat\w*|pg_statio\w*|pg_ls_\w+|pg_read_\w+|pg_file\w*|lo_\w+|dblink\w*|pg_sleep\w*"
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
# sizes of the shadow's own (empty) tables describe no data; sizes of databases and tablespaces would describe
# the real one, and are answered NULL
SHADOW_SIZES = {"pg_table_size", "pg_relation_size", "pg_total_relation_size", "pg_indexes_size", "pg_size_pretty",
                "pg_size_bytes", "pg_column_size"}
NULL_SIZES = {"pg_database_size", "pg_tablespace_size"}
GUARDED_NAMES = {"role", "session_authorization", "default_transaction_read_only", "transaction_read_only",
                 "statement_timeout"}
USER_TOKENS = {TokenType.CURRENT_USER, TokenType.SESSION_USER}
USER_WORDS = {"user", "current_role"}
SCHEMA_CATALOGS = {"pg_statistic_ext"}  # definitions of statistics objects (psql's \d lists them), not their data
IDENTIFIER_TOKENS = {TokenType.VAR, TokenType.IDENTIFIER}
THIS_DATABASE = "(SELECT * FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())"


@dataclass(frozen=True)
class Route:
    kind: str  # option | setting | catalog | private | noop
    command: SessionCommand | None = None  # for option
    tag: str = ""  # for noop
    sets: bool = False  # a catalog query that calls set_config (its parameter changes are reported)


def route(statement: Statement, private: frozenset[str]) -> Route:
    """Where `statement` goes; raises a dpsql error for what is refused."""
    word = statement.first_word
    if word in ("SET", "RESET", "SHOW"):
        command = parse_session_command(statement.sql)
        if command is not None:
            return Route("option", command)
        if GUARDED_SETTINGS.match(statement.sql) or re.search(r"\bREAD\s+WRITE\b", statement.sql, re.IGNORECASE):
            raise PrivacyRefusal("dpsql does not let a session change its role or read-only mode",
                                 "dpsql sessions keep the server's role and read-only mode; set dpsql's own options "
                                 "instead: SET dpsql.epsilon = 0.5")
        _refuse_lexing_change(statement)
        return Route("setting")
    if word in QUERY_WORDS:
        if _reads_data(statement, private):
            return Route("private")
        _refuse_server_state(statement)
        return Route("catalog", sets=any(_is_call(statement.tokens, i, "set_config")
                                         for i in range(len(statement.tokens))))
    if word == "UNLISTEN":
        return Route("noop", tag="UNLISTEN")
    if word == "EXPLAIN":
        raise PrivacyRefusal("EXPLAIN is not answered: a plan shows row estimates taken from the data",
                             "`dpsql explain` shows what a query would cost and how dpsql rewrites it")
    if word in ("LISTEN", "NOTIFY", "PREPARE", "EXECUTE"):
        raise UnsupportedQuery(f"{word} is not supported by dpsql",
                               "use your driver's prepared statements (the extended protocol) instead")
    if word not in COMMAND_WORDS:
        raise QuerySyntaxError(f'syntax error at or near "{statement.tokens[0].text}"')
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
        raise PrivacyRefusal("Unicode-escaped names (U&\"...\") are not accepted in catalog queries",
                             "write the names plainly: pg_class, not U&\"...\"")
    tokens = statement.tokens
    for index, token in enumerate(tokens):
        if _is_call(tokens, index, "set_config"):
            _check_set_config(tokens, index)
            continue
        if (token.text.lower().endswith("_size") and _is_call(tokens, index, token.text.lower())
                and token.text.lower() not in SHADOW_SIZES | NULL_SIZES):
            raise PrivacyRefusal(f'dpsql does not answer "{token.text}"', "catalog queries may ask for the sizes of "
                                 "tables (of the empty copies dpsql keeps); database sizes are NULL")
        if (token.token_type in IDENTIFIER_TOKENS and SERVER_STATE.fullmatch(token.text)
                and token.text.lower() not in SCHEMA_CATALOGS):
            raise PrivacyRefusal(f'dpsql does not answer "{token.text}": it describes the server\'s data or '
                                 "activity (statistics, sizes, sessions, transaction counters)",
                                 "catalog queries see a copy of the declared tables without rows; ask for "
                                 "aggregates of the data instead")


def _reads_databases(tokens: tuple[Token, ...], index: int) -> bool:
    """Whether tokens[index] is pg_database (or pg_catalog.pg_database) read as a table in a FROM list."""
    if tokens[index].token_type not in IDENTIFIER_TOKENS or tokens[index].text.lower() != "pg_database":
        return False
    if index + 1 < len(tokens) and tokens[index + 1].token_type in (TokenType.DOT, TokenType.L_PAREN):
        return False
    before = index - 3 if index >= 2 and tokens[index - 1].token_type == TokenType.DOT else index - 1
    return before >= 0 and tokens[before].token_type in (TokenType.FROM, TokenType.JOIN, TokenType.COMMA)


def _is_call(tokens: tuple[Token, ...], index: int, name: str | set[str]) -> bool:
    """Whether tokens[index] names the function `name` (one of `name`) and a call of it follows."""
    names = {name} if isinstance(name, str) else name
    return (tokens[index].token_type in IDENTIFIER_TOKENS and tokens[index].text.lower() in names
            and index + 1 < len(tokens) and tokens[index + 1].token_type == TokenType.L_PAREN)


def _check_set_config(tokens: tuple[Token, ...], index: int) -> None:
    """set_config(name, value, is_local) is SET: allowed for a literal name, with SET's limits (asyncpg turns
    jit off this way)."""
    arguments = tokens[index + 2:index + 6]
    if len(arguments) < 4 or arguments[0].token_type != TokenType.STRING:
        raise PrivacyRefusal("set_config needs a literal setting name in catalog queries", "write SET name TO value")
    name = arguments[0].text.lower()
    if name in GUARDED_NAMES:
        raise PrivacyRefusal("dpsql does not let a session change its role, read-only mode or timeout",
                             "dpsql sessions keep the server's role, read-only mode and timeout; set dpsql's own "
                             "options instead: SET dpsql.epsilon = 0.5")
    if name in LEXING_SETTINGS and (arguments[2].token_type != TokenType.STRING or arguments[3].token_type
                                    != TokenType.COMMA or arguments[2].text.lower() not in LEXING_SETTINGS[name]):
        raise PrivacyRefusal(f"dpsql does not let a session change {name}: it changes how later statements are read",
                             "dpsql speaks UTF8 with standard conforming strings; write E'...' for backslash escapes")


def catalog_text(statement: Statement, analyst: str) -> str:
    """The text to run in the shadow for a catalog query: the analyst as the current user (the shadow's role is
    not theirs), NULL for the size of a database or tablespace (they would describe the real data), and
    pg_database holding the shadow alone (the client sees one database, under the name it connected to)."""
    tokens, sql = statement.tokens, statement.sql
    offset = statement.tokens[0].start if tokens else 0
    edits: list[tuple[int, int, str]] = []  # (start, end exclusive, replacement) in the statement's text
    depth = 0
    for index, token in enumerate(tokens):
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(token.token_type, 0)
        if _is_call(tokens, index, NULL_SIZES):
            start = tokens[index - 2].start if index >= 2 and tokens[index - 1].token_type == TokenType.DOT \
                else token.start
            edits.append((start - offset, tokens[closing_paren(tokens, index + 1)].end + 1 - offset,
                          "CAST(NULL AS bigint)"))
        elif depth == 0 and (token.token_type in USER_TOKENS or token.token_type == TokenType.VAR
                             and token.text.lower() in USER_WORDS):
            literal = "CAST('" + analyst.replace("'", "''") + "' AS name)"
            alone = index + 1 == len(tokens) or tokens[index + 1].token_type in (TokenType.COMMA, TokenType.FROM)
            if alone and index and tokens[index - 1].token_type in (TokenType.SELECT, TokenType.COMMA):
                literal += f' AS "{token.text.lower()}"'
            edits.append((token.start - offset, token.end + 1 - offset, literal))
        elif _reads_databases(tokens, index):
            start = tokens[index - 2].start if tokens[index - 1].token_type == TokenType.DOT else token.start
            aliased = index + 1 < len(tokens) and tokens[index + 1].token_type in {*IDENTIFIER_TOKENS, TokenType.ALIAS}
            edits.append((start - offset, token.end + 1 - offset,
                          THIS_DATABASE + ("" if aliased else " AS pg_database")))
    for start, end, replacement in reversed(edits):
        sql = sql[:start] + replacement + sql[end:]
    return sql
