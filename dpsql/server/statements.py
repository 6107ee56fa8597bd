"""SQL text as the protocol sees it: split a simple-query string into statements and name each one's kind.

The statements keep their original text (comments and all): nothing is regenerated, so what runs is what
the client sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

from dpsql.recent import Recent

TRANSACTION_KINDS = {"BEGIN": "begin", "START": "begin", "COMMIT": "commit", "END": "commit",
                     "ROLLBACK": "rollback", "ABORT": "rollback", "SAVEPOINT": "savepoint", "RELEASE": "release"}


class StatementSyntaxError(ValueError):
    """The text cannot even be split into tokens (an unterminated string or comment)."""


@dataclass(frozen=True)
class Statement:
    sql: str
    tokens: tuple[Token, ...]

    @property
    def empty(self) -> bool:
        return not self.tokens

    @property
    def first_word(self) -> str:
        return self.tokens[0].text.upper() if self.tokens else ""

    @property
    def kind(self) -> str:
        """begin | commit | rollback | rollback_to | savepoint | release | deallocate | discard | declare | fetch
        (FETCH, MOVE) | close | copy | other."""
        word = self.first_word
        if word in ("ROLLBACK", "ABORT") and any(t.text.upper() == "TO" for t in self.tokens[1:3]):
            return "rollback_to"
        if word in TRANSACTION_KINDS:
            return TRANSACTION_KINDS[word]
        return {"DEALLOCATE": "deallocate", "DISCARD": "discard", "DECLARE": "declare", "FETCH": "fetch",
                "MOVE": "fetch", "CLOSE": "close", "COPY": "copy"}.get(word, "other")

    def word(self, index: int) -> str:
        """The index-th token's text, upper-cased (empty past the end)."""
        return self.tokens[index].text.upper() if index < len(self.tokens) else ""


def tokenize(sql: str) -> list[Token]:
    try:
        return sqlglot.tokenize(sql, read="postgres")
    except TokenError as exc:
        raise StatementSyntaxError(str(exc).splitlines()[0]) from None


CACHED_TEXT = 8192  # longer strings are split afresh each time rather than kept in memory


def split_statements(sql: str) -> tuple[Statement, ...]:
    """The statements of a simple-query string, in order; empty ones (`;;`, comments only) are dropped.
    Remembered for recent short strings: clients send the same few queries again and again."""
    if len(sql) > CACHED_TEXT:
        return _split(sql)
    statements = _SPLITS.get(sql)
    if statements is None:
        statements = _split(sql)
        _SPLITS.put(sql, statements)
    return statements


_SPLITS: Recent[str, tuple[Statement, ...]] = Recent(1024, second_sighting=True)


def _split(sql: str) -> tuple[Statement, ...]:
    statements, start, current = [], 0, []
    for token in tokenize(sql):
        if token.token_type == TokenType.SEMICOLON:
            if current:
                statements.append(Statement(sql[start:token.start].strip(), tuple(current)))
            start, current = token.end + 1, []
        else:
            if not current:
                start = token.start
            current.append(token)
    if current:
        statements.append(Statement(sql[start:].strip(), tuple(current)))
    return tuple(statements)


def closing_paren(tokens: tuple[Token, ...], opening: int) -> int:
    """The index of the token that closes the parenthesis at tokens[opening] (the last token if none does)."""
    depth = 0
    for index in range(opening, len(tokens)):
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tokens[index].token_type, 0)
        if depth == 0:
            return index
    return len(tokens) - 1


def single_statement(sql: str) -> Statement:
    """The one statement of an extended-protocol Parse (which may not hold several)."""
    statements = split_statements(sql)
    if len(statements) > 1:
        raise StatementSyntaxError("cannot insert multiple commands into a prepared statement")
    return statements[0] if statements else Statement("", ())
