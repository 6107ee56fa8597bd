"""The data-free shadow database: the declared tables and columns with no rows, for catalog questions.

Public tables (reference data the schema declares public) are the exception: their rows are copied in at
start-up, so that a client can read them as it would in PostgreSQL.

Drivers and BI tools introspect (psql's \\d, JDBC metadata, SQLAlchemy's inspect, Metabase's sync). dpsql sends
those queries to a database that holds only what the privacy schema declares, created empty when the server
starts, so that row counts, sizes and statistics of the real data cannot leak. Where the backend user may, the
shadow is read by an unprivileged role (`dpsql_shadow`), which cannot read server files or other roles' activity.

`ShadowConnection` is one client's connection to it, through libpq's own protocol calls so that column types,
table OIDs and PostgreSQL's error fields reach the client unchanged (they describe no data).
"""

from __future__ import annotations

import hashlib
import logging
import select
import threading
from typing import Any

import psycopg
from psycopg import pq, sql

from dpsql.errors import ConfigError
from dpsql.schema import PrivacySchema
from dpsql.server.codec import Column, Notice
from dpsql.server.values import RawValue, encode_value

log = logging.getLogger("dpsql.server")
SHADOW_ROLE = "dpsql_shadow"
SHADOW_SUFFIX = "_dpsql_shadow"
SHADOW_FORMAT = "dpsql shadow 2"  # part of the version: a change in how shadows are made makes new ones
READY = "dpsql shadow, ready"  # the comment on a shadow database whose setup finished
SETUP_LOCK = 712_002  # advisory lock serialising shadow setups on one database
MAX_RESULT_BYTES = 64 * 2**20  # the most a catalog or public-table result may hold in dpsql's memory
REPORTED_PARAMETERS = ("server_version", "server_encoding", "client_encoding", "DateStyle", "IntervalStyle",
                       "TimeZone", "integer_datetimes", "standard_conforming_strings", "is_superuser",
                       "session_authorization", "application_name", "default_transaction_read_only",
                       "in_hot_standby")


def create_shadow(backend_url: str, schema: PrivacySchema, shadow_url: str | None = None) -> tuple[str, str | None]:
    """Make sure the shadow database exists and is current; return its URL and the role to read it as:
    `dpsql_shadow`, created if the backend user is a superuser, or made by the operator and granted to the backend
    user; None (the backend user itself) otherwise.

    Several `dpsql serve` processes on one database share it safely: the default shadow is named after a
    version (a hash of the tables it declares), created once if absent and never dropped while in use, so a
    rolling restart or two instances behind a load balancer keep working; setups are serialised by an advisory
    lock. A shadow database given by the operator is refilled in one transaction under the same lock."""
    try:
        with psycopg.connect(backend_url, autocommit=True) as conn:
            superuser, member = conn.execute(
                "SELECT rolsuper, EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s) "
                "AND pg_has_role(current_user, %s, 'MEMBER') FROM pg_roles WHERE rolname = current_user",
                (SHADOW_ROLE, SHADOW_ROLE)).fetchone()
            role = SHADOW_ROLE if superuser or member else None
            if superuser:
                conn.execute(sql.SQL("DO $$ BEGIN CREATE ROLE {} NOLOGIN; EXCEPTION WHEN duplicate_object "
                                     "THEN NULL; END $$").format(sql.Identifier(role)))
            conn.execute("SELECT pg_advisory_lock(%s)", (SETUP_LOCK,))
            try:
                if shadow_url is None:
                    shadow_url = _versioned_shadow(conn, backend_url, schema, role)
                else:
                    _fill(shadow_url, backend_url, schema, role)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK,))
    except psycopg.Error as exc:
        raise ConfigError(f"cannot create the shadow catalog database: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0]}",
                          "the backend user needs CREATEDB, or set shadow_database to an existing empty database "
                          "that dpsql may create tables in") from None
    if role is None:
        log.warning("catalog queries run as the backend user in the shadow database; to confine them, "
                    "CREATE ROLE %s NOLOGIN and GRANT it to the backend user", SHADOW_ROLE)
    return shadow_url, role


def _versioned_shadow(conn: psycopg.Connection, backend_url: str, schema: PrivacySchema, role: str | None) -> str:
    """The URL of the shadow database for this schema, created and filled if absent (or left half-made by a setup
    that died), its public rows refreshed otherwise; shadows of other versions that no one uses are dropped."""
    definition = "\n".join([SHADOW_FORMAT, role or "", *(_create_table(t).as_string(conn)
                                                          for t in schema.tables.values())])
    version = hashlib.sha256(definition.encode()).hexdigest()[:10]
    prefix = f"{conn.info.dbname[:63 - len(SHADOW_SUFFIX) - 11]}{SHADOW_SUFFIX}"
    name = f"{prefix}_{version}"
    url = psycopg.conninfo.make_conninfo(backend_url, dbname=name)
    comment = conn.execute("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                           (name,)).fetchone()
    if comment is not None and comment[0] == READY:
        _refresh_public_rows(url, backend_url, schema)
    else:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8'").format(sql.Identifier(name)))
        _fill(url, backend_url, schema, role)
        conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name), sql.Literal(READY)))
    others = conn.execute("SELECT datname FROM pg_database WHERE (left(datname, %s) = %s OR datname = %s) "
                          "AND datname <> %s", (len(prefix), prefix, prefix, name)).fetchall()
    for (other,) in others:  # an older version, or the unversioned name of earlier releases
        try:
            conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(other)))
        except psycopg.errors.ObjectInUse:
            log.info("shadow database %s is still in use; it is dropped at a later start", other)
    return url


def _fill(shadow_url: str, backend_url: str, schema: PrivacySchema, role: str | None) -> None:
    """The declared tables (public ones with their rows) and the role's grants, in one transaction: a client
    reading the shadow meanwhile sees the old tables or the new ones, never none."""
    with psycopg.connect(shadow_url) as conn, psycopg.connect(backend_url) as source, conn.transaction():
        for table in schema.tables.values():
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(table.name)))
            conn.execute(_create_table(table))
            if table.public:
                _copy_rows(source, conn, table)
        if role:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {0}; GRANT SELECT ON ALL TABLES IN SCHEMA "
                                 "public TO {0}").format(sql.Identifier(role)))


def _refresh_public_rows(shadow_url: str, backend_url: str, schema: PrivacySchema) -> None:
    """The public tables' current rows, swapped in one transaction."""
    with psycopg.connect(shadow_url) as conn, psycopg.connect(backend_url) as source, conn.transaction():
        for table in schema.tables.values():
            if table.public:
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table.name)))
                _copy_rows(source, conn, table)


def _copy_rows(source: psycopg.Connection, target: psycopg.Connection, table) -> None:
    """A public table's rows (public by the schema's declaration), declared columns only."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in table.columns)
    name = sql.Identifier(table.name)
    with source.cursor().copy(sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(columns, name)) as rows, \
            target.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(name, columns)) as sink:
        for chunk in rows:
            sink.write(chunk)


def _create_table(table) -> sql.Composed:
    columns = []
    for column in table.columns.values():
        unique = column.unique or (column.name == table.unit_column and table.max_rows_per_unit == 1)
        columns.append(sql.SQL("{} {}{}").format(sql.Identifier(column.name), sql.SQL(column.type),
                                                 sql.SQL(" UNIQUE" if unique else "")))
    return sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table.name), sql.SQL(", ").join(columns))


class ShadowError(Exception):
    def __init__(self, notice: Notice):
        super().__init__(notice.message)
        self.notice = notice


class ShadowLost(Exception):
    """The connection to the shadow database is gone or could not be opened (PostgreSQL restarted, the backend was
    terminated): the statement did not run; the next one opens a new connection."""


class ShadowConnection:
    """One client's session in the shadow database (its SET commands persist in it)."""

    def __init__(self, url: str, role: str | None, application_name: str = "", statement_timeout_ms: int = 30_000,
                 database: str | None = None):
        try:
            self._conn = psycopg.connect(url, autocommit=True, client_encoding="UTF8", connect_timeout=10,
                                         application_name=application_name[:63])
        except psycopg.OperationalError as exc:
            log.warning("cannot connect to the shadow database: %s", exc)
            raise ShadowLost("cannot connect to the catalog database") from None
        # the client sees the shadow under the name it connected to (current_database(), psql's \l), as it would
        # see the database it asked PostgreSQL for
        self._renamed = (self._conn.info.dbname.encode(), (database or self._conn.info.dbname).encode())
        self._notices: list[Notice] = []
        self._conn.add_notice_handler(self._on_notice)
        self._lock = threading.Lock()
        self._timeout = int(statement_timeout_ms)
        if role:  # a superuser becomes the role for good; a member of it takes it on (SET ROLE is refused later)
            superuser = self.parameter("is_superuser") == "on"
            command = "SET SESSION AUTHORIZATION {}" if superuser else "SET ROLE {}"
            self._conn.execute(sql.SQL(command).format(sql.Identifier(role)))
        self._restrict()

    def _restrict(self) -> None:
        self._conn.execute(f"SET default_transaction_read_only = on; SET statement_timeout = {self._timeout}")

    def reset(self) -> None:
        """RESET ALL, keeping the session read-only and its timeout (DISCARD ALL would also drop the role)."""
        with self._lock:
            try:
                self._conn.execute("RESET ALL")
                self._restrict()
            except psycopg.OperationalError:
                raise ShadowLost("the connection to the catalog database was lost") from None

    def _on_notice(self, diagnostic: psycopg.errors.Diagnostic) -> None:
        self._notices.append(Notice(diagnostic.severity_nonlocalized or "NOTICE", diagnostic.sqlstate or "00000",
                                    diagnostic.message_primary or "", diagnostic.message_hint,
                                    diagnostic.message_detail))

    def parameter(self, name: str) -> str | None:
        value = self._conn.pgconn.parameter_status(name.encode())
        return None if value is None else value.decode()

    def describe(self, text: str, param_types: list[int]) -> tuple[list[int], list[Column] | None]:
        """PostgreSQL's own description of a statement: inferred parameter types and result columns."""
        pgconn = self._conn.pgconn
        with self._lock:
            self._checked(pgconn.prepare(b"", text.encode(), param_types or None))
            result = self._checked(pgconn.describe_prepared(b""))
        params = [result.param_type(i) for i in range(result.nparams)]
        return params, _columns(result)

    def execute(self, text: str, params: list[Any], param_types: list[int], binary: bool = False
                ) -> tuple[str, list[Column] | None, list[list[bytes | RawValue | None]], list[Notice]]:
        """(command tag, columns, rows, notices) of one statement: rows in text format (bytes), or with `binary`
        in PostgreSQL's binary format (RawValue, passed to the client as they are). Rows are read one at a time
        and a result past MAX_RESULT_BYTES is cancelled (54000), so no client can make dpsql hold more."""
        values = [v.data if isinstance(v, RawValue) else encode_value(v, t, False)
                  for v, t in zip(params, param_types, strict=True)]
        formats = [1 if isinstance(v, RawValue) else 0 for v in params]
        pgconn = self._conn.pgconn
        with self._lock:
            self._notices = []
            rows: list[list[bytes | None]] = []
            size, too_large, final = 0, False, None
            try:
                pgconn.send_query_params(text.encode(), values, param_types or None, formats or None,
                                         result_format=pq.Format.BINARY if binary else pq.Format.TEXT)
                while pgconn.flush():  # the rest of a long statement, as the socket takes it
                    select.select([pgconn.socket], [pgconn.socket], [])
                    pgconn.consume_input()
                pgconn.set_single_row_mode()
                while (result := _next_result(pgconn)) is not None:
                    if result.status != pq.ExecStatus.SINGLE_TUPLE:
                        final = result
                        continue
                    if too_large:
                        continue
                    row = [self._face(result.get_value(0, c)) for c in range(result.nfields)]
                    size += sum(len(v) for v in row if v is not None) + 16 * len(row)
                    if binary:
                        row = [None if v is None else RawValue(v, result.ftype(c)) for c, v in enumerate(row)]
                    if size > MAX_RESULT_BYTES:
                        too_large, rows = True, []
                        self.cancel()
                    else:
                        rows.append(row)
            except psycopg.OperationalError:
                raise ShadowLost("the connection to the catalog database was lost") from None
            if too_large:
                raise ShadowError(Notice("ERROR", "54000", f"the result is larger than dpsql's limit of "
                                         f"{MAX_RESULT_BYTES // 2**20} MB for catalog and public-table queries",
                                         "select fewer rows or columns, or aggregate"))
            result = self._checked(final)
        columns = _columns(result)
        tag = (result.command_status or b"").decode()
        return tag, columns, rows, self._notices

    def _face(self, value: bytes | None) -> bytes | None:
        """A value as the client sees it: the shadow's own name is the name the client connected to (a name's text
        and binary forms are its bytes)."""
        return self._renamed[1] if value == self._renamed[0] else value

    def read_value(self, text: str, type_name: str) -> bytes:
        """PostgreSQL's binary form of `text` read as `type_name` in this session (its DateStyle, TimeZone)."""
        pgconn = self._conn.pgconn
        with self._lock:
            try:
                result = pgconn.exec_params(f"SELECT CAST($1 AS pg_catalog.{type_name})".encode(), [text.encode()],
                                            None, None, result_format=pq.Format.BINARY)
            except psycopg.OperationalError:
                raise ShadowLost("the connection to the catalog database was lost") from None
        return self._checked(result).get_value(0, 0)

    def _checked(self, result: pq.PGresult) -> pq.PGresult:
        if self._conn.pgconn.status == pq.ConnStatus.BAD:
            raise ShadowLost("the connection to the catalog database was lost")
        return _check(result)

    def cancel(self) -> None:
        try:
            self._conn.cancel_safe(timeout=5)
        except (psycopg.Error, TimeoutError):
            log.warning("could not cancel a catalog query")

    def lost(self) -> bool:
        """Whether the connection is gone (PostgreSQL restarted, the session was terminated): an idle connection
        learns it only by being used, so this asks PostgreSQL."""
        if self._conn.broken or self._conn.closed:
            return True
        try:
            with self._lock:
                self._conn.execute("SELECT 1")
        except psycopg.Error:
            return True
        return False

    def close(self) -> None:
        self._conn.close()


def _next_result(pgconn: pq.abc.PGconn) -> pq.PGresult | None:
    """The next result of the running statement, waiting in select() (which releases the GIL: libpq's own
    blocking wait would hold it, and stall every other thread of the server, cancels included)."""
    while True:
        pgconn.consume_input()
        if not pgconn.is_busy():
            return pgconn.get_result()
        select.select([pgconn.socket], [], [])


def _check(result: pq.PGresult) -> pq.PGresult:
    if result.status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK, pq.ExecStatus.EMPTY_QUERY):
        return result
    field = pq.DiagnosticField

    def text(code: Any) -> str | None:
        value = result.error_field(code)
        return None if value is None else value.decode("utf-8", "replace")

    position = text(field.STATEMENT_POSITION)
    raise ShadowError(Notice("ERROR", text(field.SQLSTATE) or "XX000",
                             text(field.MESSAGE_PRIMARY) or "catalog query failed", text(field.MESSAGE_HINT),
                             text(field.MESSAGE_DETAIL), int(position) if position else None))


def _columns(result: pq.PGresult) -> list[Column] | None:
    if result.nfields == 0 and result.status != pq.ExecStatus.TUPLES_OK:
        return None
    return [Column(result.fname(i).decode(), result.ftype(i), result.ftable(i), result.ftablecol(i),
                   result.fsize(i), result.fmod(i)) for i in range(result.nfields)]
