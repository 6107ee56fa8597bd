"""What the protocol asks of the server it runs in: a `Host` (authentication data, a session per login) and the
`HostSession`'s answers (descriptions, outcomes, errors). The gateway is dpsql's host; the protocol knows no more
of it than this."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dpsql.server.codec import Column, Notice
from dpsql.server.statements import Statement

ERROR, FATAL = "ERROR", "FATAL"


class StatementError(Exception):
    """A statement failed; the client gets `notice` as an ErrorResponse and the connection stays usable."""

    def __init__(self, notice: Notice):
        super().__init__(notice.message)
        self.notice = notice


def error(sqlstate: str, message: str, hint: str | None = None) -> StatementError:
    return StatementError(Notice(ERROR, sqlstate, message, hint))


@dataclass
class Description:
    param_types: list[int]
    columns: list[Column] | None  # None: the statement returns no rows


@dataclass
class Outcome:
    tag: str
    columns: list[Column] | None = None
    rows: Sequence[Sequence[Any]] = ()
    notices: list[Notice] = field(default_factory=list)
    parameter_changes: dict[str, str] = field(default_factory=dict)
    copy: list[bytes] | None = None  # COPY … TO STDOUT: the lines sent as CopyData instead of rows


class HostSession(Protocol):
    def status_parameters(self) -> dict[str, str]: ...

    def describe(self, statement: Statement, param_types: list[int]) -> Description: ...

    def execute(self, statement: Statement, params: list[Any], param_types: list[int],
                binary: bool = False) -> Outcome:
        """Run `statement`; with `binary`, the client reads every column in binary format (values PostgreSQL
        sends in that form pass through as values.RawValue)."""

    def check(self, statement: Statement) -> None:
        """Raise StatementError if executing `statement` would be refused; run nothing."""

    def read_value(self, text: str, type_oid: int) -> Any:
        """A text parameter of a date or time type, read as PostgreSQL reads it in this session."""

    def discard(self) -> dict[str, str]: ...

    def cancel(self) -> None: ...

    def close(self) -> None: ...


class Host(Protocol):
    def verifier(self, user: str) -> str | None: ...

    def open_session(self, user: str, database: str, parameters: dict[str, str]) -> HostSession: ...

    def login_failed(self, user: str, sqlstate: str) -> None: ...
