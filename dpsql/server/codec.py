"""The PostgreSQL frontend/backend protocol (3.0) as pure functions over bytes: no sockets, no state but a buffer.

`FrontendDecoder` turns the bytes a client sends into message objects; the `*_message` functions build the
bytes a server sends. Values travel in PostgreSQL's text format or, for the types `values` encodes, its binary
format.
Malformed or truncated input raises `ProtocolViolation`, after which the connection must be closed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from dpsql.server.values import TYPE_SIZES

PROTOCOL_3_0 = 196608
PROTOCOL_3_2 = 196610
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_MESSAGE = 64 * 1024 * 1024  # a client message longer than this is refused as a protocol violation
MAX_STARTUP_PACKET = 10_000  # PostgreSQL's MAX_STARTUP_PACKET_LENGTH: the most a client sends before its login
MAX_AUTH_MESSAGE = 65_535  # PostgreSQL's PG_MAX_AUTH_TOKEN_LENGTH: a password or SASL message



class ProtocolViolation(Exception):
    """The client broke the protocol; the server answers with SQLSTATE 08P01 and closes the connection."""


# --- frontend messages -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SSLRequest:
    pass


@dataclass(frozen=True)
class GSSENCRequest:
    pass


@dataclass(frozen=True)
class CancelRequest:
    process_id: int
    secret: bytes


@dataclass(frozen=True)
class Startup:
    version: int
    parameters: dict[str, str]


@dataclass(frozen=True)
class Query:
    sql: str


@dataclass(frozen=True)
class Parse:
    name: str
    sql: str
    param_types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]


@dataclass(frozen=True)
class Describe:
    kind: str  # "S" statement or "P" portal
    name: str


@dataclass(frozen=True)
class Execute:
    portal: str
    max_rows: int  # 0: all


@dataclass(frozen=True)
class Close:
    kind: str
    name: str


@dataclass(frozen=True)
class Sync:
    pass


@dataclass(frozen=True)
class Flush:
    pass


@dataclass(frozen=True)
class Terminate:
    pass


@dataclass(frozen=True)
class PasswordData:
    """A 'p' message: a password, SASLInitialResponse or SASLResponse, told apart by the authentication step."""

    payload: bytes


@dataclass(frozen=True)
class Unsupported:
    """A valid message the server does not implement (FunctionCall, COPY data)."""

    type: str


FrontendMessage = (SSLRequest | GSSENCRequest | CancelRequest | Startup | Query | Parse | Bind | Describe | Execute
                   | Close | Sync | Flush | Terminate | PasswordData | Unsupported)


class FrontendDecoder:
    """Buffers bytes from a client and yields whole messages. The first message of a connection (and the one
    after an SSL/GSS refusal) has no type byte; `expect_startup` says whether that phase is on."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.expect_startup = True
        self.max_message = MAX_AUTH_MESSAGE  # until login; then MAX_MESSAGE (the conversation raises it)

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def next_message(self) -> FrontendMessage | None:
        """The next whole message, or None until more bytes arrive."""
        header = 4 if self.expect_startup else 5
        if len(self._buffer) < header:
            return None
        start = header - 4
        (length,) = struct.unpack_from("!i", self._buffer, start)
        limit = MAX_STARTUP_PACKET if self.expect_startup else self.max_message
        if length < 4 or length > limit:  # refused on the header, before the body is buffered
            raise ProtocolViolation(f"invalid message length {length}")
        end = start + length
        if len(self._buffer) < end:
            return None
        kind = None if self.expect_startup else chr(self._buffer[0])
        body = bytes(self._buffer[start + 4:end])
        del self._buffer[:end]
        if kind is None:
            message = _startup_message(body)
            if isinstance(message, Startup):
                self.expect_startup = False
            return message
        return _typed_message(kind, body)


def _startup_message(body: bytes) -> FrontendMessage:
    reader = _Reader(body)
    code = reader.int32()
    if code == SSL_REQUEST:
        return SSLRequest()
    if code == GSSENC_REQUEST:
        return GSSENCRequest()
    if code == CANCEL_REQUEST:
        process_id = reader.int32()
        secret = reader.rest()
        if not 4 <= len(secret) <= 256:
            raise ProtocolViolation("invalid cancel request key")
        return CancelRequest(process_id, secret)
    if code >> 16 != 3:
        raise ProtocolViolation(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}")
    parameters = {}
    while True:
        name = reader.cstring()
        if not name:
            break
        parameters[name] = reader.cstring()
    reader.end()
    return Startup(code, parameters)


def _typed_message(kind: str, body: bytes) -> FrontendMessage:
    reader = _Reader(body)
    if kind == "Q":
        message: FrontendMessage = Query(reader.cstring())
    elif kind == "P":
        name, sql = reader.cstring(), reader.cstring()
        message = Parse(name, sql, tuple(reader.uint32() for _ in range(reader.int16())))
    elif kind == "B":
        portal, statement = reader.cstring(), reader.cstring()
        param_formats = tuple(reader.int16() for _ in range(reader.int16()))
        params = tuple(reader.value() for _ in range(reader.int16()))
        result_formats = tuple(reader.int16() for _ in range(reader.int16()))
        if any(f not in (0, 1) for f in param_formats + result_formats):
            raise ProtocolViolation("format codes must be 0 (text) or 1 (binary)")
        message = Bind(portal, statement, param_formats, params, result_formats)
    elif kind in "DC":
        target = reader.bytes(1).decode("ascii", "replace")
        if target not in ("S", "P"):
            raise ProtocolViolation(f"invalid {'Describe' if kind == 'D' else 'Close'} target {target!r}")
        message = (Describe if kind == "D" else Close)(target, reader.cstring())
    elif kind == "E":
        message = Execute(reader.cstring(), reader.int32())
    elif kind in "SHX":
        message = {"S": Sync, "H": Flush, "X": Terminate}[kind]()
    elif kind == "p":
        return PasswordData(body)
    elif kind in "Fdcf":
        return Unsupported(kind)
    else:
        raise ProtocolViolation(f"invalid frontend message type {kind!r}")
    reader.end()
    return message


class _Reader:
    def __init__(self, data: bytes):
        self._data, self._pos = data, 0

    def bytes(self, n: int) -> bytes:
        if n < 0 or self._pos + n > len(self._data):
            raise ProtocolViolation("message is shorter than its contents say")
        chunk = self._data[self._pos:self._pos + n]
        self._pos += n
        return chunk

    def int16(self) -> int:
        return struct.unpack("!h", self.bytes(2))[0]

    def int32(self) -> int:
        return struct.unpack("!i", self.bytes(4))[0]

    def uint32(self) -> int:
        return struct.unpack("!I", self.bytes(4))[0]

    def cstring(self) -> str:
        end = self._data.find(b"\x00", self._pos)
        if end < 0:
            raise ProtocolViolation("string without its terminating NUL")
        text = self._data[self._pos:end]
        self._pos = end + 1
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation("invalid UTF-8 in a message") from None

    def value(self) -> bytes | None:
        length = self.int32()
        if length == -1:
            return None
        return self.bytes(length)

    def rest(self) -> bytes:
        return self.bytes(len(self._data) - self._pos)

    def end(self) -> None:
        if self._pos != len(self._data):
            raise ProtocolViolation("message has trailing bytes")


def read_sasl_initial(payload: bytes) -> tuple[str, bytes]:
    """(mechanism, client-first message) of a SASLInitialResponse."""
    reader = _Reader(payload)
    mechanism = reader.cstring()
    data = reader.value()
    reader.end()
    return mechanism, data or b""


def read_password(payload: bytes) -> str:
    reader = _Reader(payload)
    password = reader.cstring()
    reader.end()
    return password


# --- backend messages ------------------------------------------------------------------------------------


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _cstring(text: str) -> bytes:
    return text.encode("utf-8") + b"\x00"


def authentication_message(code: int, data: bytes = b"") -> bytes:
    """0 ok, 3 cleartext, 5 MD5 (data: salt), 10 SASL (data: mechanisms), 11 SASL continue, 12 SASL final."""
    return _message(b"R", struct.pack("!i", code) + data)


def sasl_mechanisms(*names: str) -> bytes:
    return b"".join(_cstring(n) for n in names) + b"\x00"


def parameter_status_message(name: str, value: str) -> bytes:
    return _message(b"S", _cstring(name) + _cstring(value))


def backend_key_message(process_id: int, secret: bytes) -> bytes:
    return _message(b"K", struct.pack("!i", process_id) + secret)


def negotiate_version_message(newest_minor: int, unrecognised: list[str]) -> bytes:
    body = struct.pack("!ii", newest_minor, len(unrecognised)) + b"".join(_cstring(o) for o in unrecognised)
    return _message(b"v", body)


def ready_message(status: str) -> bytes:
    return _message(b"Z", status.encode("ascii"))


@dataclass(frozen=True)
class Column:
    """A result column as RowDescription describes it."""

    name: str
    type_oid: int
    table_oid: int = 0
    column_number: int = 0
    type_size: int = -1
    type_modifier: int = -1


def row_description_message(columns: list[Column], formats: list[int]) -> bytes:
    parts = [struct.pack("!h", len(columns))]
    for column, fmt in zip(columns, formats, strict=True):
        size = column.type_size if column.type_size != -1 else TYPE_SIZES.get(column.type_oid, -1)
        parts.append(_cstring(column.name) + struct.pack("!ihihih", column.table_oid, column.column_number,
                                                         column.type_oid, size, column.type_modifier, fmt))
    return _message(b"T", b"".join(parts))


def parameter_description_message(type_oids: list[int]) -> bytes:
    return _message(b"t", struct.pack(f"!h{len(type_oids)}I", len(type_oids), *type_oids))


def data_row_message(values: list[bytes | None]) -> bytes:
    parts = [struct.pack("!h", len(values))]
    for value in values:
        parts.append(b"\xff\xff\xff\xff" if value is None else struct.pack("!i", len(value)) + value)
    return _message(b"D", b"".join(parts))


def copy_out_response_message(columns: int) -> bytes:
    """CopyOutResponse: text format, every column text."""
    return _message(b"H", struct.pack(f"!bh{columns}h", 0, columns, *([0] * columns)))


def copy_data_message(data: bytes) -> bytes:
    return _message(b"d", data)


def copy_done_message() -> bytes:
    return _message(b"c")


def command_complete_message(tag: str) -> bytes:
    return _message(b"C", _cstring(tag))


def empty_query_message() -> bytes:
    return _message(b"I")


def parse_complete_message() -> bytes:
    return _message(b"1")


def bind_complete_message() -> bytes:
    return _message(b"2")


def close_complete_message() -> bytes:
    return _message(b"3")


def no_data_message() -> bytes:
    return _message(b"n")


def portal_suspended_message() -> bytes:
    return _message(b"s")


@dataclass(frozen=True)
class Notice:
    """The fields of an ErrorResponse or NoticeResponse."""

    severity: str
    sqlstate: str
    message: str
    hint: str | None = None
    detail: str | None = None
    position: int | None = None
    extra: dict[str, str] = field(default_factory=dict)  # other fields by their one-letter code


def error_message(notice: Notice) -> bytes:
    return _message(b"E", _notice_body(notice))


def notice_message(notice: Notice) -> bytes:
    return _message(b"N", _notice_body(notice))


def _notice_body(notice: Notice) -> bytes:
    fields = [("S", notice.severity), ("V", notice.severity), ("C", notice.sqlstate), ("M", notice.message)]
    fields += [(code, value) for code, value in (("D", notice.detail), ("H", notice.hint)) if value]
    if notice.position is not None:
        fields.append(("P", str(notice.position)))
    fields += list(notice.extra.items())
    return b"".join(code.encode("ascii") + _cstring(value) for code, value in fields) + b"\x00"


# --- values ------------------------------------------------------------------------------------------------
