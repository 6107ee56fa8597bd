"""`dpsql serve`: PostgreSQL's wire protocol on a TCP port, so psql, drivers and BI tools connect unchanged.

The protocol is a sans-IO state machine (`protocol.Conversation` over `codec`); this module is the thin
asyncio layer around it: it reads bytes, hands them to the conversation on a worker thread (the engine and
the shadow database are blocking), writes the reply, upgrades to TLS and forwards CancelRequests.

Every resource a client can make the server hold is bounded: at most `max_clients` connections (past it a
login gets PostgreSQL's 53300), the whole login within LOGIN_TIMEOUT, messages before login within
PostgreSQL's sizes, idle sessions within the configured timeouts. Statements run on a pool of one worker per
allowed client, and logins, cancels and closes on a pool of their own, so slow statements never hold up
another client's login or CancelRequest.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hmac
import itertools
import logging
import secrets
import signal
import ssl
from dataclasses import dataclass
from typing import Any

from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.errors import ConfigError
from dpsql.server.auth import METHODS
from dpsql.server.gateway import Gateway
from dpsql.server.protocol import Conversation
from dpsql.server.shadow import create_shadow
from dpsql.server.workers import IdleEndingExecutor

log = logging.getLogger("dpsql.server")
READ_SIZE = 256 * 1024
LOGIN_WORKERS = 16  # logins, cancels and closes: short, and never behind a statement
LOGIN_TIMEOUT = 60.0  # seconds a connection may take to log in, in all (PostgreSQL's authentication_timeout)
TRIM_DELAY = 0.5  # seconds after a disconnection before freed memory is given back (one trim for a wave of them)


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int


def parse_listen(text: str) -> ListenAddress:
    host, _, port = text.rpartition(":")
    try:
        return ListenAddress(host.strip("[]") or "127.0.0.1", int(port))
    except ValueError:
        raise ConfigError(f'invalid listen address "{text}"', "give HOST:PORT, e.g. 127.0.0.1:6432") from None


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    if not settings.tls_cert and not settings.tls_key:
        return None
    if not (settings.tls_cert and settings.tls_key):
        raise ConfigError("TLS needs both tls_cert and tls_key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificate or key: {exc}") from None
    return context


def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None (another C library), from the symbols the process already has loaded
    (ctypes.util.find_library would run ldconfig at every start: 20 ms)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


MALLOC_TRIM = _malloc_trim()


def _health_text(reasons: dict[str, str | None]) -> tuple[str, str]:
    """The /health answer: each part's state on its own line, 503 when any part cannot answer."""
    lines = [f"{part}: {reason or 'ok'}" for part, reason in reasons.items()]
    return ("503 Service Unavailable" if any(reasons.values()) else "200 OK"), "\n".join(lines) + "\n"


class Server:
    """One listening socket; `await start()`, then `await serve_forever()` or `await close()`."""

    def __init__(self, gateway: Gateway, listen: ListenAddress, *, auth_method: str = "scram-sha-256",
                 tls: ssl.SSLContext | None = None, max_clients: int = 64, idle_timeout: float = 0.0,
                 idle_in_transaction_timeout: float = 0.0, login_timeout: float = LOGIN_TIMEOUT,
                 metrics_listen: ListenAddress | None = None, max_prepared_statements: int = 0):
        if auth_method not in METHODS:
            raise ConfigError(f'unknown auth method "{auth_method}"', f"use one of {', '.join(METHODS)}")
        if auth_method == "password" and tls is None:
            raise ConfigError("cleartext passwords need TLS", "set tls_cert and tls_key, or use scram-sha-256")
        self.gateway, self.listen, self.auth_method, self.tls = gateway, listen, auth_method, tls
        self._ids = itertools.count(1000)
        self._conversations: dict[int, Conversation] = {}
        self._handlers: set[asyncio.Task] = set()  # one per open client connection
        self.max_clients, self.login_timeout = max_clients, login_timeout
        self.max_prepared_statements = max_prepared_statements
        self.idle_timeout, self.idle_in_transaction_timeout = idle_timeout, idle_in_transaction_timeout
        # a client runs one statement at a time, so one worker per allowed client means no statement ever waits
        self._executor = IdleEndingExecutor(max_clients, "dpsql-statement")
        self._login_executor = IdleEndingExecutor(LOGIN_WORKERS, "dpsql-login")
        self._trim_pending = False
        self._server: asyncio.base_events.Server | None = None
        self.port = listen.port
        self.metrics_listen = metrics_listen
        self._metrics_server: asyncio.base_events.Server | None = None
        self.metrics_port: int | None = None

    async def start(self) -> None:
        self._server = await _listen(self._client, self.listen, limit=READ_SIZE)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.metrics_listen is not None:
            self._metrics_server = await _listen(self._scrape, self.metrics_listen)
            self.metrics_port = self._metrics_server.sockets[0].getsockname()[1]

    async def _scrape(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """GET /health: 200 when the data's backend and the ledger answer now, else 503 naming which cannot and
        why. Any other path: the counters, in Prometheus' text format."""
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            path = (request.split(None, 2)[1:2] or [b"/"])[0]
            loop = asyncio.get_running_loop()
            if path.startswith(b"/health"):
                reasons = await loop.run_in_executor(self._login_executor, self.gateway.engine.health)
                status, text = _health_text(reasons)
            else:
                status, text = "200 OK", await loop.run_in_executor(
                    self._login_executor, self.gateway.metrics.render, self.gateway.engine.ledger.analysts)
            body = text.encode()
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def serve_forever(self) -> None:
        await self._server.serve_forever()

    async def close(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self._server is not None:
            self._server.close()
            for handler in list(self._handlers):  # connections still open end with the server
                handler.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._login_executor.shutdown(wait=False, cancel_futures=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        handler = asyncio.current_task()
        self._handlers.add(handler)
        process_id = next(self._ids)
        conversation = Conversation(self.gateway, process_id=process_id, secret=secrets.token_bytes(4),
                                    auth_method=self.auth_method, tls_available=self.tls is not None,
                                    admitted=len(self._conversations) < self.max_clients,
                                    max_statements=self.max_prepared_statements)
        metrics = self.gateway.metrics
        opened = loop.time()
        if conversation.admitted:
            self._conversations[process_id] = conversation
            metrics.count("connections_total", result="accepted")
            metrics.connection(opened=True)
            log.info("connection client=%d from %s", process_id, _peer(writer))
        else:
            metrics.count("connections_total", result="refused")
            log.warning("connection refused: %d clients already (max_client_connections)", self.max_clients)
        login_deadline = loop.time() + self.login_timeout
        try:
            while True:
                logging_in = conversation.session is None
                timeout = max(login_deadline - loop.time(), 0.0) if logging_in else self._idle_timeout(conversation)
                try:
                    data = await asyncio.wait_for(reader.read(READ_SIZE), timeout)
                except TimeoutError:
                    if not logging_in:  # PostgreSQL's idle timeouts end the session with a FATAL
                        writer.write(conversation.idle_timeout())
                        await writer.drain()
                    raise
                if not data:
                    break
                executor = self._login_executor if logging_in else self._executor
                output = await loop.run_in_executor(executor, conversation.receive, data)
                if output.data:
                    writer.write(output.data)
                    await writer.drain()
                if output.cancel is not None:
                    await loop.run_in_executor(self._login_executor, self._cancel, *output.cancel)
                if output.start_tls:
                    await writer.start_tls(self.tls)
                    conversation.tls_started()
                if output.close:
                    break
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.info("connection lost client=%d: %s", process_id, exc or type(exc).__name__)
        except asyncio.CancelledError:  # the server is closing: end quietly (a cancelled handler is reported as
            pass  # an unhandled error by asyncio's streams on Python 3.11)
        finally:
            if self._conversations.pop(process_id, None) is not None:
                metrics.connection(opened=False)
                log.info("disconnection client=%d after %.1f s", process_id, loop.time() - opened)
            # a cancel here comes from the server closing: the cleanup still runs (in its thread), quietly
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await loop.run_in_executor(self._login_executor, conversation.close)
            self._trim_soon(loop)
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.CancelledError):
                await writer.wait_closed()
            self._handlers.discard(handler)

    def _trim_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Give the memory a closed connection freed back to the system shortly: its prepared statements were
        malloc blocks (`prepared.PreparedStatements`), which glibc otherwise keeps for reuse (one analyst's
        16,000 statements left 13 MB resident, 5 MB with this). In a pool thread; one trim for a wave of closes."""
        if MALLOC_TRIM is None or self._trim_pending:
            return
        self._trim_pending = True

        def trim() -> None:
            self._trim_pending = False
            MALLOC_TRIM(0)

        def start() -> None:
            with contextlib.suppress(RuntimeError):  # the server closed meanwhile
                loop.run_in_executor(self._login_executor, trim)

        loop.call_later(TRIM_DELAY, start)

    def _idle_timeout(self, conversation: Conversation) -> float | None:
        """How long a logged-in client may stay silent (None: for ever), by its transaction status."""
        seconds = self.idle_in_transaction_timeout if conversation.status != "I" else self.idle_timeout
        return seconds or None

    def _cancel(self, process_id: int, secret: bytes) -> None:
        """A CancelRequest: stop that connection's running query if the key matches; never reply."""
        conversation = self._conversations.get(process_id)
        if conversation is None or not hmac.compare_digest(conversation.secret, secret):
            return
        session = conversation.session
        if session is not None:
            session.cancel()


def build_server(settings: Settings, listen: str | None = None) -> tuple[Engine, Server]:
    """The engine, the shadow database and a server ready to `start()`, from settings."""
    engine = Engine(settings)
    try:
        # the shadow catalog lives in PostgreSQL: beside the data, or beside the ledger when the data is on Spark
        shadow_url, role = create_shadow(settings.ledger or settings.database, engine.schema, settings.shadow_database)
        gateway = Gateway(engine, shadow_url, role, settings.max_analyst_connections)
    except BaseException:
        engine.close()
        raise
    try:
        server = Server(gateway, parse_listen(listen or settings.listen), auth_method=settings.auth,
                        tls=tls_context(settings), max_clients=settings.max_client_connections,
                        max_prepared_statements=settings.max_prepared_statements,
                        idle_timeout=settings.idle_session_timeout_s,
                        idle_in_transaction_timeout=settings.idle_in_transaction_session_timeout_s,
                        metrics_listen=parse_listen(settings.metrics_listen) if settings.metrics_listen else None)
    except BaseException:
        gateway.close()
        engine.close()
        raise
    return engine, server


async def _run(server: Server, ready) -> None:
    await server.start()
    stop = asyncio.Event()
    received: list[str] = []

    def on_signal(number: int) -> None:
        received.append(signal.Signals(number).name)
        stop.set()

    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):  # stop cleanly, so the caller's cleanup runs
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal_number, on_signal, signal_number)
    ready(server)
    await stop.wait()
    log.info("stopping on %s: closing %d client connections", received[0], len(server._conversations))
    await server.close()


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer or "unknown")


async def _listen(handler, address: ListenAddress, **options: Any) -> asyncio.base_events.Server:
    """A listening socket, or a ConfigError saying why not (a busy port, an address not on this machine)."""
    try:
        return await asyncio.start_server(handler, address.host, address.port, **options)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {address.host}:{address.port}: {exc.strerror or exc}",
                          "another process may hold the port (another dpsql serve?); choose a free one with "
                          "--listen HOST:PORT, or the listen setting") from None


def serve(settings: Settings, listen: str | None = None, ready=lambda server: None) -> None:
    """Run `dpsql serve` until SIGINT or SIGTERM; `ready(server)` is called once the port listens."""
    engine, server = build_server(settings, listen)
    try:
        asyncio.run(_run(server, ready))
    finally:
        server.gateway.close()
        engine.close()
        log.info("stopped")
