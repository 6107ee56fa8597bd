"""Statements the conversation answers around a query: cursors (DECLARE, FETCH, MOVE, CLOSE) and COPY … TO
STDOUT. Each is read here into what it asks for; the query inside DECLARE or COPY runs like any other.

dpsql holds a cursor's rows once its query has run (a DP answer is small; a catalog result is capped), so a
cursor is a portal with a name, as it is in PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot.tokens import Token, TokenType

from dpsql.server.statements import Statement, StatementSyntaxError, closing_paren, single_statement, tokenize


class CommandError(ValueError):
    """A cursor or COPY statement dpsql cannot read or does not support: (sqlstate, message)."""

    def __init__(self, sqlstate: str, message: str, hint: str | None = None):
        super().__init__(message)
        self.sqlstate, self.message, self.hint = sqlstate, message, hint


@dataclass(frozen=True)
class Declare:
    name: str
    query: Statement
    hold: bool


@dataclass(frozen=True)
class Fetch:
    name: str
    count: int | None  # None: ALL
    move: bool  # MOVE: position only, no rows


@dataclass(frozen=True)
class CopyOut:
    query: Statement
    csv: bool
    header: bool
    delimiter: str
    null: str


def cursor_name(token) -> str:
    """A cursor's name as PostgreSQL folds it: quoted names keep their case."""
    return token.text if token.token_type == TokenType.IDENTIFIER else token.text.lower()


def _retokenized(statement: Statement) -> Statement:
    """`statement` with every word a token, at offsets into its own text: sqlglot reads the rest of a DECLARE or
    FETCH as one string."""
    first = statement.tokens[0].text
    rest = tokenize(" " * len(first) + statement.sql[len(first):])
    return Statement(statement.sql, (Token(TokenType.VAR, first, start=0, end=len(first) - 1), *rest))


def read_declare(statement: Statement) -> Declare:
    """DECLARE name [ASENSITIVE | INSENSITIVE] [[NO] SCROLL] CURSOR [{WITH | WITHOUT} HOLD] FOR query."""
    statement = _retokenized(statement)
    words = [t.text.upper() for t in statement.tokens]
    if "FOR" not in words or "CURSOR" not in words or len(words) < 5:
        raise CommandError("42601", "syntax error in DECLARE", "DECLARE name CURSOR FOR query")
    at_for = words.index("FOR", words.index("CURSOR"))
    options = words[2:at_for]
    if "BINARY" in options:
        raise CommandError("0A000", "binary cursors are not supported by dpsql", "declare the cursor without BINARY")
    query = _rest(statement, at_for + 1)
    return Declare(cursor_name(statement.tokens[1]), query, hold="HOLD" in options and "WITHOUT" not in options)


def read_fetch(statement: Statement) -> Fetch:
    """FETCH/MOVE [NEXT | FORWARD [n | ALL] | ALL | n] [FROM | IN] name: the forward directions."""
    statement = _retokenized(statement)
    tokens = statement.tokens[1:]
    if not tokens:
        raise CommandError("42601", f"syntax error in {statement.first_word}")
    name, words = cursor_name(tokens[-1]), [t.text.upper() for t in tokens[:-1]]
    if words and words[-1] in ("FROM", "IN"):
        words = words[:-1]
    if words and words[0] == "FORWARD":
        words = words[1:] or ["NEXT"]
    if not words or words == ["NEXT"]:
        count: int | None = 1
    elif words == ["ALL"]:
        count = None
    elif len(words) == 1 and words[0].isdigit():
        count = int(words[0])
    else:
        raise CommandError("0A000", f"{statement.first_word} {' '.join(words)} is not supported by dpsql",
                           "dpsql cursors move forward: FETCH n, FETCH NEXT, FETCH ALL")
    return Fetch(name, count, statement.first_word == "MOVE")


def read_copy(statement: Statement) -> CopyOut:
    """COPY (query) TO STDOUT or COPY table [(columns)] TO STDOUT, with FORMAT text or csv, HEADER, DELIMITER and
    NULL, in the option list or PostgreSQL's older spelling (WITH CSV HEADER)."""
    statement = _retokenized(statement)
    words = [t.text.upper() for t in statement.tokens]
    if "TO" not in words or "FROM" in words[:words.index("TO")] and statement.word(1) != "(":
        raise CommandError("42501", "dpsql only answers queries: COPY FROM is not allowed", "dpsql never writes")
    tokens = statement.tokens
    if statement.word(1) == "(":
        close = closing_paren(tokens, 1)
        query = _slice(statement, 2, close)
        after = close + 1
    else:
        at_to = words.index("TO")
        table = statement.sql[tokens[1].start:tokens[at_to - 1].end + 1]
        columns = "*"
        if "(" in table:
            table, columns = table.split("(", 1)
            columns = columns.rsplit(")", 1)[0]
        query = single_statement(f"SELECT {columns} FROM {table}")
        after = at_to
    if words[after:after + 2] != ["TO", "STDOUT"]:
        raise CommandError("0A000", "dpsql copies only TO STDOUT", "use psql's \\copy to write a file on your side")
    return _copy_options(query, tokens[after + 2:])


def _copy_options(query: Statement, tokens) -> CopyOut:
    options: dict[str, str] = {}
    items = [t for t in tokens if t.token_type not in (TokenType.COMMA, TokenType.L_PAREN, TokenType.R_PAREN)]
    words = [t.text.upper() if t.token_type != TokenType.STRING else t.text for t in items]
    if words and words[0] == "WITH":
        words = words[1:]
    index = 0
    while index < len(words):
        word = words[index]
        value = words[index + 1] if index + 1 < len(words) else ""
        if word in ("CSV", "BINARY", "TEXT"):
            options["FORMAT"], index = word, index + 1
        elif word == "HEADER" and value.upper() not in ("TRUE", "FALSE", "ON", "OFF", "1", "0", "MATCH"):
            options["HEADER"], index = "TRUE", index + 1
        elif word in ("FORMAT", "HEADER", "DELIMITER", "NULL"):
            if value.upper() == "AS":
                index += 1
                value = words[index + 1] if index + 1 < len(words) else ""
            options[word], index = value, index + 2
        else:
            raise CommandError("0A000", f"COPY option {word} is not supported by dpsql",
                               "COPY … TO STDOUT takes FORMAT text or csv, HEADER, DELIMITER and NULL")
    fmt = options.get("FORMAT", "TEXT").upper()
    if fmt not in ("TEXT", "CSV"):
        raise CommandError("0A000", f"COPY format {fmt.lower()} is not supported by dpsql", "use FORMAT csv or text")
    is_csv = fmt == "CSV"
    delimiter = options.get("DELIMITER", "," if is_csv else "\t")
    if len(delimiter) != 1:
        raise CommandError("22023", "COPY delimiter must be a single one-byte character")
    header = options.get("HEADER", "FALSE").upper() in ("TRUE", "ON", "1")
    return CopyOut(query, is_csv, header, delimiter, options.get("NULL", "" if is_csv else "\\N"))


def copy_lines(copy: CopyOut, names: list[str], rows: list[list[str | None]]) -> list[bytes]:
    """The rows (already in PostgreSQL's text form) as COPY's lines, one per CopyData message."""
    lines = []
    if copy.header:
        lines.append(_line(copy, names))
    lines.extend(_line(copy, row) for row in rows)
    return lines


def _line(copy: CopyOut, values: list[str | None]) -> bytes:
    if copy.csv:
        fields = [copy.null if v is None else _csv_field(v, copy) for v in values]
    else:
        fields = [copy.null if v is None else _text_field(v) for v in values]
    return (copy.delimiter.join(fields) + "\n").encode()


def _csv_field(value: str, copy: CopyOut) -> str:
    """Quoted where PostgreSQL quotes: a value that holds the delimiter, a quote or a line break, or that reads
    as the NULL string."""
    if value == copy.null or any(c in value for c in (copy.delimiter, '"', "\n", "\r")):
        return '"' + value.replace('"', '""') + '"'
    return value


def _text_field(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _rest(statement: Statement, start: int) -> Statement:
    return _slice(statement, start, len(statement.tokens))


def _slice(statement: Statement, start: int, end: int) -> Statement:
    """The statement made of tokens[start:end], with its original text."""
    if start >= end:
        raise CommandError("42601", "syntax error at end of input")
    text = statement.sql[statement.tokens[start].start:statement.tokens[end - 1].end + 1]
    try:
        return single_statement(text)
    except StatementSyntaxError as exc:
        raise CommandError("42601", str(exc)) from None
