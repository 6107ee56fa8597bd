"""The server side of one client connection as a state machine over bytes (sans-IO).

`Conversation.receive(bytes)` consumes what the client sent and returns what to send back, plus what the I/O
layer must do (start TLS, close, cancel another connection's query). Everything a statement means is asked
of a `Host` (authentication data) and the `HostSession` it opens after login; the conversation itself knows
the protocol only: startup and authentication, simple and extended queries, portals and row limits, the
transaction status that ReadyForQuery reports, and error recovery.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpsql.server import auth, codec, commands, values
from dpsql.server.codec import Column, Notice, ProtocolViolation
from dpsql.server.host import FATAL, Host, HostSession, Outcome, StatementError, error
from dpsql.server.prepared import Portal, Prepared, PreparedStatements
from dpsql.server.statements import Statement, StatementSyntaxError, single_statement, split_statements

log = logging.getLogger("dpsql.server")

TRANSACTION_KINDS = frozenset({"begin", "commit", "rollback", "rollback_to", "savepoint", "release"})
LOCAL_KINDS = TRANSACTION_KINDS | {"deallocate", "discard", "fetch", "close"}  # answered by the conversation
WRAPPING_KINDS = {"declare", "copy"}  # answered by the conversation around a query of their own


@dataclass
class Output:
    data: bytes = b""
    start_tls: bool = False
    close: bool = False
    cancel: tuple[int, bytes] | None = None  # (process id, secret) of the connection whose query to cancel


class Conversation:
    def __init__(self, host: Host, *, process_id: int, secret: bytes, auth_method: str = "scram-sha-256",
                 tls_available: bool = False, admitted: bool = True, max_statements: int = 0):
        self.host, self.process_id, self.secret = host, process_id, secret
        self.max_statements = max_statements  # named prepared statements this connection may hold (0: no cap)
        self.admitted = admitted  # False past the server's connection limit: the login is refused (53300)
        self.auth_method, self.tls_available, self.tls_active = auth_method, tls_available, False
        self.session: HostSession | None = None
        self.user = ""
        self.status = "I"  # I idle, T in a transaction block, E in a failed one
        self._decoder = codec.FrontendDecoder()
        self._phase = "startup"  # startup -> auth -> ready -> closed
        self._auth_step: str | None = None
        self._auth_state: Any = None
        self._startup: codec.Startup | None = None
        self._statements = PreparedStatements()
        self._portals: dict[str, Portal] = {}
        self._savepoints: list[str] = []
        self._skipping = False  # after an extended-protocol error: discard messages until Sync
        self._out: list[bytes] = []

    # --- the I/O layer's entry points --------------------------------------------------------------------

    def receive(self, data: bytes) -> Output:
        """Consume `data`; return the reply and what the I/O layer must do next."""
        self._decoder.feed(data)
        output = Output()
        try:
            while self._phase != "closed" and not output.start_tls:
                message = self._decoder.next_message()
                if message is None:
                    break
                self._dispatch(message, output)
        except ProtocolViolation as exc:
            self._fatal("08P01", f"protocol violation: {exc}")
        except Exception:  # never let one client's surprise take the server down
            log.exception("internal error while serving a client")
            self._fatal("XX000", "internal error in dpsql; the connection is closed")
        output.data = b"".join(self._out)
        self._out.clear()
        output.close = output.close or self._phase == "closed"
        return output

    def idle_timeout(self) -> bytes:
        """The FATAL that PostgreSQL sends when a session stayed idle too long; the conversation ends."""
        in_transaction = self.status != "I"
        notice = Notice(FATAL, "25P03" if in_transaction else "57P05",
                        "terminating connection due to idle-in-transaction timeout" if in_transaction
                        else "terminating connection due to idle-session timeout")
        return codec.error_message(notice)

    def tls_started(self) -> None:
        self.tls_active = True

    def close(self) -> None:
        self._phase = "closed"
        if self.session is not None:
            self.session.close()
            self.session = None

    # --- dispatch --------------------------------------------------------------------------------------------

    def _dispatch(self, message: codec.FrontendMessage, output: Output) -> None:
        if self._phase == "startup":
            self._on_startup_phase(message, output)
        elif self._phase == "auth":
            if not isinstance(message, codec.PasswordData):
                raise ProtocolViolation(f"expected a password message, got {type(message).__name__}")
            self._on_password(message.payload)
        elif isinstance(message, codec.Terminate):
            self._phase = "closed"
        elif self._skipping and not isinstance(message, codec.Sync):
            return
        elif isinstance(message, codec.Query):
            self._simple_query(message.sql)
        elif isinstance(message, codec.Sync):
            self._sync()
        elif isinstance(message, codec.Flush):
            return  # the I/O layer writes everything after each read anyway
        else:
            self._extended(message)

    def _send(self, data: bytes) -> None:
        self._out.append(data)

    def _fatal(self, sqlstate: str, message: str, hint: str | None = None) -> None:
        self._send(codec.error_message(Notice(FATAL, sqlstate, message, hint)))
        self.close()

    # --- startup and authentication --------------------------------------------------------------------

    def _on_startup_phase(self, message: codec.FrontendMessage, output: Output) -> None:
        if isinstance(message, codec.SSLRequest):
            if self.tls_available and not self.tls_active:
                if self._decoder.pending:  # bytes sent before the handshake could be injected (CVE-2021-23222)
                    raise ProtocolViolation("received unencrypted data after SSL request")
                self._send(b"S")
                output.start_tls = True
            else:
                self._send(b"N")
        elif isinstance(message, codec.GSSENCRequest):
            self._send(b"N")
        elif isinstance(message, codec.CancelRequest):
            output.cancel = (message.process_id, message.secret)
            self._phase = "closed"
        elif isinstance(message, codec.Startup):
            self._on_startup(message)
        else:
            raise ProtocolViolation(f"unexpected {type(message).__name__} before startup")

    def _on_startup(self, startup: codec.Startup) -> None:
        protocol_options = sorted(k for k in startup.parameters if k.startswith("_pq_."))
        if startup.version != codec.PROTOCOL_3_0 or protocol_options:
            self._send(codec.negotiate_version_message(0, protocol_options))
        self.user = startup.parameters.get("user", "")
        if not self.admitted:
            return self._fatal("53300", "sorry, too many clients already")
        if not self.user:
            return self._fatal("28000", "no PostgreSQL user name specified in startup packet")
        self._startup = startup
        self._phase = "auth"
        try:
            verifier = self.host.verifier(self.user)
        except StatementError as exc:  # e.g. the ledger is out of reach
            return self._fatal(exc.notice.sqlstate, exc.notice.message, exc.notice.hint)
        if self.auth_method == "password":
            if not self.tls_active:
                return self._fatal("28000", "dpsql accepts cleartext passwords only over TLS",
                                   "connect with sslmode=require")
            self._auth_step, self._auth_state = "password", verifier
            self._send(codec.authentication_message(3))
        elif self.auth_method == "md5" and verifier is not None and verifier.startswith("md5"):
            salt = secrets.token_bytes(4)
            self._auth_step, self._auth_state = "md5", (verifier, salt)
            self._send(codec.authentication_message(5, salt))
        else:  # SCRAM, also for md5 when the stored verifier is SCRAM (as PostgreSQL does)
            keys = auth.parse_scram(verifier) or auth.random_scram_keys()
            self._auth_step, self._auth_state = "sasl_initial", auth.ScramExchange(keys)
            self._send(codec.authentication_message(10, codec.sasl_mechanisms(auth.SCRAM)))

    def _on_password(self, payload: bytes) -> None:
        try:
            if self._auth_step == "sasl_initial":
                mechanism, client_first = codec.read_sasl_initial(payload)
                if mechanism != auth.SCRAM:
                    return self._fatal("28000", f"unsupported SASL mechanism {mechanism}")
                self._send(codec.authentication_message(11, self._auth_state.first(client_first)))
                self._auth_step = "sasl_final"
                return
            if self._auth_step == "sasl_final":
                self._send(codec.authentication_message(12, self._auth_state.final(payload)))
            elif self._auth_step == "md5":
                verifier, salt = self._auth_state
                if not auth.check_md5(verifier, salt, codec.read_password(payload)):
                    raise auth.AuthenticationFailed("wrong md5 response")
            elif not auth.check_password(self._auth_state, self.user, codec.read_password(payload)):
                raise auth.AuthenticationFailed("wrong password")
        except auth.AuthenticationFailed:
            self.host.login_failed(self.user, "28P01")
            return self._fatal("28P01", f'password authentication failed for user "{self.user}"')
        except (ValueError, UnicodeError):  # what PostgreSQL says of a SCRAM message it cannot read
            return self._fatal("08P01", "malformed SCRAM message")
        self._logged_in()

    def _logged_in(self) -> None:
        startup = self._startup
        try:
            self.session = self.host.open_session(self.user, startup.parameters.get("database", self.user),
                                                  startup.parameters)
        except StatementError as exc:
            return self._fatal(exc.notice.sqlstate, exc.notice.message, exc.notice.hint)
        self._auth_state = None
        self._send(codec.authentication_message(0))
        for name, value in self.session.status_parameters().items():
            self._send(codec.parameter_status_message(name, value))
        self._send(codec.backend_key_message(self.process_id, self.secret))
        self._send(codec.ready_message("I"))
        self._phase = "ready"
        self._decoder.max_message = codec.MAX_MESSAGE

    # --- simple query ------------------------------------------------------------------------------------

    def _simple_query(self, sql: str) -> None:
        try:
            statements = split_statements(sql)
        except StatementSyntaxError as exc:
            statements = None
            self._error(error("42601", f"syntax error: {exc}").notice)
        if statements == ():
            self._send(codec.empty_query_message())
        if statements and len(statements) > 1 and not self._all_allowed(statements):
            statements = None  # PostgreSQL runs a string of statements all or nothing; so does dpsql
        for statement in statements or []:
            try:
                outcome = self._run(statement, [], [])
            except StatementError as exc:
                self._error(exc.notice)
                break
            if outcome.copy is not None:
                self._send_copy(outcome)
            elif outcome.columns is not None:
                self._send(codec.row_description_message(outcome.columns, [0] * len(outcome.columns)))
                self._send_rows(outcome.rows, outcome.columns, [0] * len(outcome.columns))
            self._complete(outcome)
        self._send(codec.ready_message(self.status))

    def _all_allowed(self, statements: tuple[Statement, ...]) -> bool:
        """Whether every statement of a string may run; if one may not, its error is sent and none runs."""
        for statement in statements:
            if statement.kind in LOCAL_KINDS:
                continue
            try:
                self.session.check(self._wrapped(statement) if statement.kind in WRAPPING_KINDS else statement)
            except StatementError as exc:
                self._error(exc.notice)
                return False
        return True

    def _send_rows(self, rows: Sequence[Sequence[Any]], columns: list[Column], formats: list[int]) -> None:
        if rows and len(rows[0]) != len(columns):
            raise error("XX000", f"the answer has {len(rows[0])} columns but {len(columns)} were described",
                        "run the query without preparing it (the simple protocol)")
        try:
            encoded = [codec.data_row_message([values.encode_value(v, c.type_oid, f == 1)
                                               for v, c, f in zip(row, columns, formats, strict=True)])
                       for row in rows]
        except ValueError as exc:
            raise error("0A000", str(exc), "ask for this column in text format") from None
        self._out.extend(encoded)

    def _send_copy(self, outcome: Outcome) -> None:
        self._send(codec.copy_out_response_message(len(outcome.columns or [])))
        self._out.extend(codec.copy_data_message(line) for line in outcome.copy)
        self._send(codec.copy_done_message())

    def _complete(self, outcome: Outcome) -> None:
        for notice in outcome.notices:
            self._send(codec.notice_message(notice))
        self._send(codec.command_complete_message(outcome.tag))
        for name, value in outcome.parameter_changes.items():
            self._send(codec.parameter_status_message(name, value))

    def _error(self, notice: Notice) -> None:
        self._send(codec.error_message(notice))
        if self.status == "T":
            self.status = "E"

    # --- statements, transaction control ---------------------------------------------------------------

    def _run(self, statement: Statement, params: list[Any], param_types: list[int], binary: bool = False) -> Outcome:
        kind = statement.kind
        if self.status == "E" and kind not in ("commit", "rollback", "rollback_to"):
            raise error("25P02", "current transaction is aborted, commands ignored until end of transaction block",
                        "send ROLLBACK")
        if kind in TRANSACTION_KINDS:
            return self._transaction(statement, kind)
        if kind == "deallocate":
            return self._deallocate(statement)
        if kind in ("declare", "fetch", "close", "copy"):
            try:
                return {"declare": self._declare, "fetch": self._fetch, "close": self._close_cursor,
                        "copy": self._copy}[kind](statement)
            except commands.CommandError as exc:
                raise error(exc.sqlstate, exc.message, exc.hint) from None
        if kind == "discard":
            changes = self.session.discard()
            if statement.word(1) == "ALL":
                self._statements.clear()
                self._portals.clear()
            return Outcome(f"DISCARD {statement.word(1)}".strip(), parameter_changes=changes)
        return self.session.execute(statement, params, param_types, binary)

    def _transaction(self, statement: Statement, kind: str) -> Outcome:
        """Transaction blocks as PostgreSQL reports them; dpsql only reads, so nothing is undone or kept."""
        notices = []
        if kind == "begin":
            if self.status != "I":
                notices.append(Notice("WARNING", "25001", "there is already a transaction in progress"))
            self.status = "T" if self.status == "I" else self.status
            return Outcome("BEGIN" if statement.first_word == "BEGIN" else "START TRANSACTION", notices=notices)
        if kind in ("commit", "rollback"):
            if self.status == "I":
                notices.append(Notice("WARNING", "25P01", "there is no transaction in progress"))
            tag = "ROLLBACK" if kind == "rollback" or self.status == "E" else "COMMIT"
            self.status = "I"
            self._savepoints.clear()
            self._portals = {k: v for k, v in self._portals.items() if k == "" or v.hold}
            return Outcome(tag, notices=notices)
        if self.status == "I":
            word = {"savepoint": "SAVEPOINT", "release": "RELEASE SAVEPOINT", "rollback_to": "ROLLBACK TO SAVEPOINT"}
            raise error("25P01", f"{word[kind]} can only be used in transaction blocks")
        name = statement.tokens[-1].text.lower()
        if kind == "savepoint":
            self._savepoints.append(name)
            return Outcome("SAVEPOINT")
        if name not in self._savepoints:
            self.status = "E" if kind == "release" else self.status
            raise error("3B001", f'savepoint "{name}" does not exist')
        del self._savepoints[self._savepoints.index(name) + (1 if kind == "rollback_to" else 0):]
        if kind == "rollback_to":
            self.status = "T"
            return Outcome("ROLLBACK")
        return Outcome("RELEASE")

    # --- cursors and COPY: the query inside runs as any other; its rows are held or sent here --------------

    def _wrapped(self, statement: Statement) -> Statement:
        """The query inside a DECLARE or COPY."""
        try:
            return (commands.read_declare(statement) if statement.kind == "declare"
                    else commands.read_copy(statement)).query
        except commands.CommandError as exc:
            raise error(exc.sqlstate, exc.message, exc.hint) from None

    def _declare(self, statement: Statement) -> Outcome:
        declare = commands.read_declare(statement)
        if declare.name in self._portals:
            raise error("42P03", f'cursor "{declare.name}" already exists')
        if self.status == "I" and not declare.hold:
            raise error("25P01", "DECLARE CURSOR can only be used in transaction blocks")
        outcome = self.session.execute(declare.query, [], [])
        if outcome.columns is None:
            raise error("42P11", "cannot open a cursor on a statement that returns no rows")
        prepared = Prepared(declare.query.sql, [], outcome.columns)
        self._portals[declare.name] = Portal(prepared, [], [0] * len(outcome.columns), outcome, hold=declare.hold)
        notices, outcome.notices = outcome.notices, []
        return Outcome("DECLARE CURSOR", notices=notices)

    def _fetch(self, statement: Statement) -> Outcome:
        fetch = commands.read_fetch(statement)
        cursor = self._portals.get(fetch.name) if fetch.name else None
        if cursor is None or cursor.outcome is None:
            raise error("34000", f'cursor "{fetch.name}" does not exist')
        rows = cursor.outcome.rows
        end = len(rows) if fetch.count is None else min(len(rows), cursor.position + fetch.count)
        taken, cursor.position = rows[cursor.position:end], end
        if fetch.move:
            return Outcome(f"MOVE {len(taken)}")
        return Outcome(f"FETCH {len(taken)}", cursor.prepared.columns, taken)

    def _close_cursor(self, statement: Statement) -> Outcome:
        if statement.word(1) == "ALL":
            self._portals = {k: v for k, v in self._portals.items() if k == ""}
            return Outcome("CLOSE CURSOR ALL")
        name = commands.cursor_name(statement.tokens[1]) if len(statement.tokens) == 2 else ""
        if not name or self._portals.pop(name, None) is None:
            raise error("34000", f'cursor "{name}" does not exist')
        return Outcome("CLOSE CURSOR")

    def _copy(self, statement: Statement) -> Outcome:
        copy = commands.read_copy(statement)
        outcome = self.session.execute(copy.query, [], [])
        columns = outcome.columns or []
        texts = [[None if v is None else values.encode_value(v, c.type_oid, False).decode()
                  for v, c in zip(row, columns, strict=True)] for row in outcome.rows]
        lines = commands.copy_lines(copy, [c.name for c in columns], texts)
        return Outcome(f"COPY {len(outcome.rows)}", columns, (), outcome.notices, copy=lines)

    def _deallocate(self, statement: Statement) -> Outcome:
        words = [t.text for t in statement.tokens[1:]]
        if words and words[0].upper() == "PREPARE":
            words = words[1:]
        if len(words) != 1:
            raise error("42601", "syntax error in DEALLOCATE", "DEALLOCATE name or DEALLOCATE ALL")
        if words[0].upper() == "ALL":
            for name in [k for k in self._statements if k != ""]:
                del self._statements[name]
            return Outcome("DEALLOCATE ALL")
        name = words[0].strip('"') if words[0].startswith('"') else words[0].lower()
        if self._statements.pop(name, None) is None:
            raise error("26000", f'prepared statement "{name}" does not exist')
        return Outcome("DEALLOCATE")

    # --- extended query ----------------------------------------------------------------------------------

    def _extended(self, message: codec.FrontendMessage) -> None:
        try:
            if isinstance(message, codec.Parse):
                self._parse(message)
            elif isinstance(message, codec.Bind):
                self._bind(message)
            elif isinstance(message, codec.Describe):
                self._describe(message)
            elif isinstance(message, codec.Execute):
                self._execute(message)
            elif isinstance(message, codec.Close):
                (self._statements if message.kind == "S" else self._portals).pop(message.name, None)
                self._send(codec.close_complete_message())
            elif isinstance(message, codec.Unsupported):
                kind = "function calls" if message.type == "F" else "COPY"
                raise error("0A000", f"dpsql does not support {kind}", "send the query as SQL")
            else:
                raise ProtocolViolation(f"unexpected {type(message).__name__} after startup")
        except StatementError as exc:
            self._error(exc.notice)
            self._skipping = True

    def _sync(self) -> None:
        self._skipping = False
        if self.status == "I":  # the implicit transaction ends: its portals go
            self._portals.clear()
        else:
            self._portals.pop("", None)
        self._send(codec.ready_message(self.status))

    def _parse(self, message: codec.Parse) -> None:
        if message.name and message.name in self._statements:
            raise error("42P05", f'prepared statement "{message.name}" already exists')
        if message.name and self.max_statements and len(self._statements) - ("" in self._statements) \
                >= self.max_statements:
            raise error("53400", f"too many prepared statements on this connection (max_prepared_statements = "
                                 f"{self.max_statements})", "DEALLOCATE the ones no longer needed, or use the "
                                                            "unnamed statement")
        try:
            statement = single_statement(message.sql)
        except StatementSyntaxError as exc:
            raise error("42601", str(exc)) from None
        param_types = list(message.param_types)
        if self.status == "E" and statement.kind not in ("commit", "rollback", "rollback_to"):
            raise error("25P02", "current transaction is aborted, commands ignored until end of transaction block")
        if statement.kind == "fetch":  # described by the cursor it reads, if it is open
            try:
                name = commands.read_fetch(statement).name
            except commands.CommandError as exc:
                raise error(exc.sqlstate, exc.message, exc.hint) from None
            cursor = self._portals.get(name) if name else None
            prepared = Prepared(statement.sql, param_types, None if cursor is None else cursor.prepared.columns)
        elif statement.empty or statement.kind != "other":
            prepared = Prepared(statement.sql, param_types, None)
        else:
            description = self.session.describe(statement, param_types)
            prepared = Prepared(statement.sql, description.param_types, description.columns)
        self._statements[message.name] = prepared
        self._send(codec.parse_complete_message())

    def _bind(self, message: codec.Bind) -> None:
        prepared = self._statements.get(message.statement)
        if prepared is None:
            raise error("26000", f'prepared statement "{message.statement}" does not exist')
        if message.portal and message.portal in self._portals:
            raise error("42P03", f'cursor "{message.portal}" already exists')
        if len(message.params) != len(prepared.param_types):
            raise error("08P01", f"bind message supplies {len(message.params)} parameters, but prepared statement "
                                 f'"{message.statement}" requires {len(prepared.param_types)}')
        formats = _formats(message.param_formats, len(message.params), "parameter")
        params = []
        for data, fmt, type_oid in zip(message.params, formats, prepared.param_types, strict=True):
            try:
                if data is not None and fmt == 0 and type_oid in values.DATETIME_TYPES:
                    params.append(self.session.read_value(data.decode("utf-8", "replace"), type_oid))
                    continue
                params.append(None if data is None else values.decode_value(data, type_oid, fmt == 1))
            except OverflowError:  # a binary date or timestamp beyond what dpsql can represent
                raise error("22008", "date/timestamp parameter out of range") from None
            except ValueError as exc:
                raise error("22P02", f"invalid parameter value: {exc}") from None
        columns = prepared.columns or []
        result_formats = _formats(message.result_formats, len(columns), "result")
        self._portals[message.portal] = Portal(prepared, params, result_formats)
        self._send(codec.bind_complete_message())

    def _describe(self, message: codec.Describe) -> None:
        if message.kind == "S":
            prepared = self._statements.get(message.name)
            if prepared is None:
                raise error("26000", f'prepared statement "{message.name}" does not exist')
            self._send(codec.parameter_description_message(prepared.param_types))
            formats = [0] * len(prepared.columns or [])
        else:
            portal = self._portals.get(message.name)
            if portal is None:
                raise error("34000", f'portal "{message.name}" does not exist')
            prepared, formats = portal.prepared, portal.formats
        if prepared.columns is None:
            self._send(codec.no_data_message())
        else:
            self._send(codec.row_description_message(prepared.columns, formats))

    def _execute(self, message: codec.Execute) -> None:
        portal = self._portals.get(message.portal)
        if portal is None:
            raise error("34000", f'portal "{message.portal}" does not exist')
        prepared = portal.prepared
        statement = prepared.statement
        if statement.empty:
            return self._send(codec.empty_query_message())
        if portal.outcome is None:
            binary = bool(portal.formats) and all(f == 1 for f in portal.formats)
            portal.outcome = self._run(statement, portal.params, prepared.param_types, binary)
        outcome = portal.outcome
        columns = prepared.columns if prepared.columns is not None else outcome.columns
        if outcome.copy is not None:
            self._send_copy(outcome)
        elif columns is not None and outcome.columns is not None:
            end = len(outcome.rows) if message.max_rows <= 0 else portal.position + message.max_rows
            self._send_rows(outcome.rows[portal.position:end], columns, portal.formats or [0] * len(columns))
            portal.position = min(end, len(outcome.rows))
            if portal.position < len(outcome.rows):
                return self._send(codec.portal_suspended_message())
        self._complete(outcome)
        outcome.notices, outcome.parameter_changes = [], {}  # said once, even if the portal runs again


def _formats(codes: tuple[int, ...], count: int, what: str) -> list[int]:
    if len(codes) == 0:
        return [0] * count
    if len(codes) == 1:
        return [codes[0]] * count
    if len(codes) != count:
        raise error("08P01", f"bind message has {len(codes)} {what} formats but {count} {what}s")
    return list(codes)
