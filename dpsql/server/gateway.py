"""What the wire protocol's statements mean in dpsql: the bridge between `protocol.Conversation` and the engine.

Each logged-in client gets a `ClientSession` holding its DP options (SET dpsql.*), its own connection to the
data-free shadow database (opened on first use) and the analyst whose budget its queries spend. Statements
are routed by `routing.route`; dpsql errors become ErrorResponses with their SQLSTATE, message and hint.
Backend error text, NOTICEs and NOTIFYs from the real database never reach the client: only the engine talks
to it, and it withholds them.
"""

from __future__ import annotations

import datetime
import decimal
import logging
import threading
from collections import Counter
from typing import Any

from dpsql.accounting import describe_budget
from dpsql.answer import Answer
from dpsql.backends import Cancellation
from dpsql.combining import columns_of
from dpsql.engine import Engine
from dpsql.errors import Error
from dpsql.postprocess import describe_accuracy, describe_bounds_effect
from dpsql.recent import Recent
from dpsql.server import values
from dpsql.server.codec import Column, Notice
from dpsql.server.host import Description, Outcome, StatementError
from dpsql.server.metrics import Metrics
from dpsql.server.routing import Route, catalog_text, route
from dpsql.server.shadow import REPORTED_PARAMETERS, ShadowConnection, ShadowError, ShadowLost, create_shadow
from dpsql.server.statements import CACHED_TEXT, Statement
from dpsql.session import Options, SessionCommand, show_value

log = logging.getLogger("dpsql.server")
DESCRIBED_CACHE_SIZE = 256
ROUTES_CACHE_SIZE = 1024
NOTICE_ROWS = 10  # rows whose confidence intervals the NOTICE after an answer lists
_PLACEHOLDERS = {values.INT2: 0, values.INT4: 0, values.INT8: 0, values.OID: 0, values.FLOAT4: 0.0, values.FLOAT8: 0.0,
                 values.NUMERIC: decimal.Decimal(0), values.BOOL: False, values.DATE: datetime.date(2000, 1, 1),
                 values.TIMESTAMP: datetime.datetime(2000, 1, 1),
                 values.TIMESTAMPTZ: datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)}


class Gateway:
    """The `host.Host` of `dpsql serve`: analysts' verifiers and one session per login."""

    def __init__(self, engine: Engine, shadow_url: str, shadow_role: str | None, max_analyst_connections: int = 0):
        self.engine, self.shadow_url, self.shadow_role = engine, shadow_url, shadow_role
        self.max_analyst_connections = max_analyst_connections  # 0: no cap
        self._logged_in: Counter[str] = Counter()  # open sessions per analyst
        self._logged_in_lock = threading.Lock()
        # the tables the engine answers for: private ones, and public ones holding locally randomized reports (their
        # counts are estimated from the reports, not counted as they are)
        self.private = frozenset(name for name, table in engine.schema.tables.items()
                                 if not table.public or any(c.local is not None for c in table.columns.values()))
        self.metrics = Metrics()
        self._routes: Recent[str, Route] = Recent(ROUTES_CACHE_SIZE, second_sighting=True)
        # held open while the gateway lives: another `dpsql serve` starting on this database with another schema
        # drops the shadows no one is connected to, and DROP DATABASE refuses one with a connection
        self._lease = ShadowConnection(shadow_url, shadow_role)
        self._renewing = threading.Lock()
        self.server_parameters = {name: value for name in REPORTED_PARAMETERS
                                  if (value := self._lease.parameter(name)) is not None}

    def close(self) -> None:
        """Let the shadow go (another instance may drop it once no client uses it)."""
        self._lease.close()

    def shadow_connection(self, application_name: str, statement_timeout_ms: int, database: str) -> ShadowConnection:
        """A client's session in the shadow, where the shadow goes by the name of the `database` the client asked
        for. The lease is renewed first if a restart cut it; a shadow that another instance dropped meanwhile (the
        lease was down) is made again, once, as at start-up."""
        self._renew()
        try:
            return ShadowConnection(self.shadow_url, self.shadow_role, application_name, statement_timeout_ms, database)
        except ShadowLost:  # the shadow itself may be gone
            self._renew()
            return ShadowConnection(self.shadow_url, self.shadow_role, application_name, statement_timeout_ms, database)

    def _renew(self) -> None:
        """A new lease if the old one is lost (one round trip to find out), and the shadow made again if gone."""
        settings = self.engine.settings
        with self._renewing:
            if not self._lease.lost():
                return
            self._lease.close()
            try:
                self._lease = ShadowConnection(self.shadow_url, self.shadow_role)
            except ShadowLost:
                try:
                    self.shadow_url, self.shadow_role = create_shadow(settings.ledger or settings.database,
                                                                      self.engine.schema, settings.shadow_database)
                except Error as exc:
                    log.warning("could not make the shadow catalog database again: %s", exc)
                    raise ShadowLost("cannot connect to the catalog database") from None
                self._lease = ShadowConnection(self.shadow_url, self.shadow_role)
                log.warning("the shadow catalog database was gone and has been made again")

    def verifier(self, user: str) -> str | None:
        try:
            return self.engine.ledger.verifier(user)
        except Error as exc:  # the ledger is out of reach: the login fails with PostgreSQL's SQLSTATE for it
            raise StatementError(Notice("FATAL", exc.sqlstate, exc.message, exc.hint)) from None

    def open_session(self, user: str, database: str, parameters: dict[str, str]) -> ClientSession:
        with self._logged_in_lock:  # as PostgreSQL's per-role CONNECTION LIMIT, checked once the login is proved
            if self.max_analyst_connections and self._logged_in[user] >= self.max_analyst_connections:
                self.metrics.count("logins_total", result="refused")
                log.warning("login refused analyst=%s: %d connections already (max_analyst_connections)", user,
                            self.max_analyst_connections)
                raise StatementError(Notice("FATAL", "53300", f'too many connections for role "{user}"',
                                            "close some of this analyst's connections (the max_analyst_connections "
                                            "setting bounds them)"))
            self._logged_in[user] += 1
        self.metrics.count("logins_total", result="ok")
        log.info("login analyst=%s application=%r", user, parameters.get("application_name", ""))
        return ClientSession(self, user, parameters.get("application_name", ""), database)

    def session_closed(self, user: str) -> None:
        with self._logged_in_lock:
            self._logged_in[user] -= 1
            if self._logged_in[user] <= 0:
                del self._logged_in[user]

    def login_failed(self, user: str, sqlstate: str) -> None:
        self.metrics.count("logins_total", result="failed")
        log.info("login failed analyst=%s sqlstate=%s", user, sqlstate)

    def route(self, statement: Statement) -> Route:
        """`routing.route`, remembered for recently seen statements (it depends on the text alone)."""
        where = self._routes.get(statement.sql)
        if where is None:
            where = route(statement, self.private)  # a refusal raises and is not remembered
            if len(statement.sql) <= CACHED_TEXT:
                self._routes.put(statement.sql, where)
        return where


class ClientSession:
    def __init__(self, gateway: Gateway, analyst: str, application_name: str, database: str):
        self.gateway, self.analyst, self.application_name = gateway, analyst, application_name
        self.database = database  # the name the client connected to: the shadow goes by it
        self.options = Options()
        self._shadow: ShadowConnection | None = None
        self._running: Cancellation | ShadowConnection | None = None
        self._described: Recent[tuple, Description] = Recent(DESCRIBED_CACHE_SIZE, second_sighting=True)
        self._reported = {**gateway.server_parameters, "client_encoding": "UTF8", "DateStyle": "ISO, MDY",
                          "is_superuser": "off", "session_authorization": analyst,
                          "application_name": application_name, "default_transaction_read_only": "on"}

    # --- host.HostSession -------------------------------------------------------------------------------

    def status_parameters(self) -> dict[str, str]:
        return dict(self._reported)

    def describe(self, statement: Statement, param_types: list[int]) -> Description:
        key = (statement.sql, tuple(param_types), self.options.intervals)
        described = self._described.get(key)
        if described is None:
            described = self._guarded(self._describe, statement, param_types)
            self._described.put(key, described)
        return described

    def execute(self, statement: Statement, params: list[Any], param_types: list[int],
                binary: bool = False) -> Outcome:
        outcome = self._guarded(self._execute, statement, params, param_types, binary)
        log.debug("statement done analyst=%s tag=%s", self.analyst, outcome.tag)  # the command and row count
        return outcome

    def check(self, statement: Statement) -> None:
        self._guarded(self._check, statement)

    def read_value(self, text: str, type_oid: int) -> Any:
        data = self._guarded(self.shadow.read_value, text, values.DATETIME_TYPES[type_oid])
        return values.decode_value(data, type_oid, True)

    def discard(self) -> dict[str, str]:
        self.options = Options()
        self._described.clear()
        return self._reset_shadow() if self._shadow is not None else {}

    def cancel(self) -> None:
        running = self._running
        if running is not None:
            running.cancel()

    def close(self) -> None:
        if self._shadow is not None:
            self._shadow.close()
            self._shadow = None
        self._described.clear()
        self.gateway.session_closed(self.analyst)

    # --- describing --------------------------------------------------------------------------------------

    def _describe(self, statement: Statement, param_types: list[int]) -> Description:
        where = self.gateway.route(statement)
        if where.kind == "option":
            columns = [Column(f"dpsql.{where.command.name}", values.TEXT)] if where.command.action == "show" else None
            return Description(param_types, columns)
        if where.kind == "noop":
            return Description(param_types, None)
        text = catalog_text(statement, self.analyst) if where.kind == "catalog" else statement.sql
        params, columns = self.shadow.describe(text, param_types)
        if where.kind == "private":
            columns = self._private_columns(statement, params, columns)
        return Description(params, columns)

    def _private_columns(self, statement: Statement, param_types: list[int],
                         shadow_columns: list[Column] | None) -> list[Column] | None:
        """The columns the engine's answer will have. They depend on the query, not on its parameters, so
        placeholders stand in for them; if the engine refuses those, PostgreSQL's own types are used."""
        params = [_PLACEHOLDERS.get(t, "") for t in param_types] or None
        try:
            composition, parts = self.gateway.engine.prepare_parts(statement.sql, params, options=self.options)
        except Error:
            return [Column(c.name, c.type_oid) for c in shadow_columns or []]
        names, types, noisy = columns_of(parts, composition)
        answer = Answer(names, types, [], [], 0.0, 0.0, noisy=noisy)
        return _columns(self._presented(answer))

    # --- executing ---------------------------------------------------------------------------------------

    def _check(self, statement: Statement) -> None:
        """Refuse what executing `statement` would refuse, without running or charging anything."""
        if self.gateway.route(statement).kind == "private":
            self.gateway.engine.prepare_parts(statement.sql, options=self.options)

    def _execute(self, statement: Statement, params: list[Any], param_types: list[int], binary: bool) -> Outcome:
        where = self.gateway.route(statement)
        self.gateway.metrics.count("statements_total", route=where.kind)
        if where.kind == "option":
            return self._option(where.command)
        if where.kind == "noop":
            return Outcome(where.tag)
        if where.kind == "private":
            return self._private(statement, params)
        shadow = self.shadow
        self._running = shadow
        try:
            text = catalog_text(statement, self.analyst) if where.kind == "catalog" else statement.sql
            tag, columns, rows, notices = shadow.execute(text, params, param_types, binary)
        finally:
            self._running = None
        changes = {}
        if where.kind == "setting" or where.sets:
            if statement.first_word == "RESET" and statement.word(1) == "ALL":
                changes = self._reset_shadow()
            changes.update(self._parameter_changes())
        return Outcome(tag, columns, rows, notices, changes)

    def _private(self, statement: Statement, params: list[Any]) -> Outcome:
        cancellation = Cancellation()
        self._running = cancellation
        try:
            answer = self.gateway.engine.query(statement.sql, params or None, analyst=self.analyst,
                                               options=self.options, cancel=cancellation)
        finally:
            self._running = None
        self.gateway.metrics.count("answers_total", cached="true" if answer.cached else "false")
        log.info("answer analyst=%s epsilon=%.6g delta=%.3g cached=%s", self.analyst, answer.epsilon, answer.delta,
                 answer.cached)
        notices = [_answer_notice(answer), *(Notice("NOTICE", "00000", f"dpsql: {note}") for note in answer.notes)]
        if answer.bounds_effect is not None:
            heading, *lines = describe_bounds_effect(answer.bounds_effect)
            notices.append(Notice("NOTICE", "00000", f"dpsql: {heading.rstrip(':')}", detail="\n".join(lines)))
        answer = self._presented(answer)
        return Outcome(f"SELECT {len(answer.rows)}", _columns(answer), answer.rows, notices)

    def _presented(self, answer: Answer) -> Answer:
        return answer.with_intervals() if self.gateway.engine.options(self.options).intervals else answer

    def _option(self, command: SessionCommand) -> Outcome:
        engine = self.gateway.engine
        if command.action == "show":
            options = engine.options(self.options)
            value = (describe_budget(engine.budget(self.analyst), options.epsilon, engine.schema.group_size)
                     if command.name == "budget"
                     else show_value(getattr(options, command.name)))
            return Outcome("SHOW", [Column(f"dpsql.{command.name}", values.TEXT)], [(value,)])
        self.options = self.options.with_option(command.name, command.value)
        engine.options(self.options)  # refuse now, not at the next query, an ε above the cap
        self._described.clear()  # dpsql.intervals changes the columns of private queries
        return Outcome("SET" if command.action == "set" else "RESET")

    # --- the shadow connection ---------------------------------------------------------------------------

    @property
    def shadow(self) -> ShadowConnection:
        if self._shadow is None:
            self._shadow = self.gateway.shadow_connection(self.application_name,
                                                          self.gateway.engine.settings.statement_timeout_ms,
                                                          self.database)
        return self._shadow

    def _reset_shadow(self) -> dict[str, str]:
        self._shadow.reset()
        return self._parameter_changes()

    def _parameter_changes(self) -> dict[str, str]:
        changes = {}
        for name in ("DateStyle", "IntervalStyle", "TimeZone", "application_name", "standard_conforming_strings"):
            value = self._shadow.parameter(name)
            if value is not None and value != self._reported.get(name):
                self._reported[name] = changes[name] = value
        return changes

    def _guarded(self, function, *args: Any) -> Any:
        """`function(*args)`, with dpsql's and the shadow's errors as the client's ErrorResponse."""
        try:
            return function(*args)
        except Error as exc:
            self.gateway.metrics.count("errors_total", sqlstate=exc.sqlstate)
            log.info("statement failed analyst=%s code=%s sqlstate=%s", self.analyst, exc.code, exc.sqlstate)
            raise StatementError(Notice("ERROR", exc.sqlstate, exc.message, exc.hint)) from None
        except ShadowError as exc:
            self.gateway.metrics.count("errors_total", sqlstate=exc.notice.sqlstate)
            raise StatementError(exc.notice) from None
        except ShadowLost as exc:  # the next statement opens a new connection; this one did not run
            self.gateway.metrics.count("errors_total", sqlstate="08006")
            self.close()
            raise StatementError(Notice("ERROR", "08006", f"dpsql: {exc}; the statement did not run",
                                        "retry; settings changed with SET in this session were reset")) from None
        except Exception:  # a dpsql bug: this statement fails, the client's session goes on
            self.gateway.metrics.count("errors_total", sqlstate="XX000")
            log.exception("internal error in a statement")
            raise StatementError(Notice("ERROR", "XX000", "internal error in dpsql; the statement did not complete",
                                        "the server log has the details")) from None


def _columns(answer: Answer) -> list[Column]:
    return [Column(name, values.TYPE_OIDS.get(type_name, values.TEXT))
            for name, type_name in zip(answer.names, answer.types, strict=True)]


def _answer_notice(answer: Answer) -> Notice:
    """The NOTICE after a private answer: what it cost, what is left, and the 95% intervals of its values."""
    message = ("dpsql: cached answer, no budget spent" if answer.cached
               else f"dpsql: spent ε = {answer.epsilon:.4g}, δ = {answer.delta:.3g}")
    if answer.budget is not None:
        message += f"; left ε = {answer.budget.epsilon_left:.4g}, δ = {answer.budget.delta_left:.3g}"
    lines = []
    for number, accuracy in enumerate(answer.accuracy[:NOTICE_ROWS], start=1):
        described = [f"{name} {describe_accuracy(acc)}" for name, acc in zip(answer.names, accuracy, strict=True)
                     if acc is not None]
        if described:
            lines.append(f"row {number}: " + "; ".join(described))
    if len(answer.accuracy) > NOTICE_ROWS:
        lines.append(f"({len(answer.accuracy) - NOTICE_ROWS} more rows)")
    detail = f"95% confidence intervals ({answer.intervals_cover}):\n" + "\n".join(lines) if lines else None
    return Notice("NOTICE", "00000", message, detail=detail)


__all__ = ["ClientSession", "Gateway"]
