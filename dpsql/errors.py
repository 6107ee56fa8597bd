"""Errors that dpsql raises, with stable codes.

Every error carries a dpsql code (stable, for programs), a PostgreSQL SQLSTATE (for the wire server), a
message that says what went wrong and, where one exists, a hint that says how to fix it. The classes are
also the PEP 249 exception hierarchy of `dpsql.dbapi`. PostgreSQL's own error text never goes into them.
"""

from __future__ import annotations


class Warning(Exception):  # noqa: A001 - the name is required by PEP 249
    """PEP 249 Warning (dpsql raises none; kept for the interface)."""


class Error(Exception):
    """Base class of every dpsql error (PEP 249 `Error`)."""

    code = "DP000"
    sqlstate = "XX000"

    def __init__(self, message: str, hint: str | None = None, *, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        text = f"{self.message} [{self.code}]"
        return f"{text}\nHint: {self.hint}" if self.hint else text


class InterfaceError(Error):
    code = "DP900"


class DatabaseError(Error):
    code = "DP901"


class DataError(DatabaseError):
    code = "DP902"
    sqlstate = "22023"


class OperationalError(DatabaseError):
    code = "DP903"
    sqlstate = "08000"


class IntegrityError(DatabaseError):
    code = "DP904"


class InternalError(DatabaseError):
    code = "DP905"


class ProgrammingError(DatabaseError):
    code = "DP906"
    sqlstate = "42000"


class NotSupportedError(DatabaseError):
    code = "DP907"
    sqlstate = "0A000"


# --- dpsql's own errors, each a PEP 249 class -------------------------------------------------------------


class QuerySyntaxError(ProgrammingError):
    """The SQL text does not parse."""

    code = "DP001"
    sqlstate = "42601"


class UnsupportedQuery(NotSupportedError):
    """A construct the analysis does not model; refused before anything runs."""

    code = "DP002"
    sqlstate = "0A000"


class PrivacyRefusal(ProgrammingError):
    """A query that would release something other than noisy aggregates; refused before anything runs."""

    code = "DP003"
    sqlstate = "42501"


class UnknownObject(ProgrammingError):
    """A table that the privacy schema does not declare."""

    code = "DP004"
    sqlstate = "42P01"


class UnknownColumn(UnknownObject):
    """A column that the privacy schema does not declare, or that no table of the query has."""

    sqlstate = "42703"


class InvalidParameter(DataError):
    """A bad privacy parameter (ε, δ, ...) or query parameter."""

    code = "DP005"
    sqlstate = "22023"


class BudgetExhausted(OperationalError):
    """The analyst's remaining budget cannot pay for the query; nothing ran."""

    code = "DP006"
    sqlstate = "53400"


class UnknownAnalyst(OperationalError):
    code = "DP007"
    sqlstate = "28000"


class BackendError(OperationalError):
    """PostgreSQL failed; its own message is withheld because it may depend on the data."""

    code = "DP008"
    sqlstate = "XX000"


class BackendUnavailable(OperationalError):
    """No working connection to PostgreSQL (a restart, a network fault, pools exhausted): nothing ran and nothing
    was charged, so the query can simply be retried."""

    code = "DP013"
    sqlstate = "08006"


class QueryTimeout(OperationalError):
    code = "DP009"
    sqlstate = "57014"


class QueryCancelled(OperationalError):
    """The client cancelled the query while PostgreSQL ran it; a charge made before stands."""

    code = "DP012"
    sqlstate = "57014"


class _PostgreSQLState(Error):
    """An error PostgreSQL itself would raise for the query, whatever the data: it carries PostgreSQL's SQLSTATE."""

    def __init__(self, message: str, hint: str | None = None, *, sqlstate: str | None = None):
        super().__init__(message, hint)
        if sqlstate is not None:
            self.sqlstate = sqlstate


class InvalidConstant(_PostgreSQLState, DataError):
    """A constant of the query that PostgreSQL cannot read as its type ('2024-13-01' as a date, 'abc' as an
    integer): it fails on every database, so it is refused before anything runs or is charged, with PostgreSQL's
    SQLSTATE for it (22008, 22P02, ...)."""

    code = "DP014"


class InvalidQuery(_PostgreSQLState, ProgrammingError):
    """A query PostgreSQL itself rejects whatever the data (an aggregate or a window function in GROUP BY): refused
    before anything runs or is charged, with PostgreSQL's message and SQLSTATE (42803, 42P20, ...)."""

    code = "DP015"


class SchemaError(Error):
    """The privacy schema file is invalid or does not match the database."""

    code = "DP010"
    sqlstate = "F0000"


class ConfigError(InterfaceError):
    """Missing or invalid configuration (database URL, schema path, analyst)."""

    code = "DP011"
    sqlstate = "08000"
