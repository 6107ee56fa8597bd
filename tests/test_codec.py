"""The wire protocol's codec as pure functions over bytes: every frontend message, malformed and truncated
input, the backend messages' exact bytes, and values against PostgreSQL's own text and binary output."""

from __future__ import annotations

import datetime
import decimal
import struct

import psycopg
import pytest

from dpsql.server import codec, values
from dpsql.server.codec import Column, FrontendDecoder, Notice, ProtocolViolation

# --- what a client sends (built here independently of the codec) ----------------------------------------------


def startup(**parameters: str) -> bytes:
    body = struct.pack("!i", codec.PROTOCOL_3_0) + b"".join(
        k.encode() + b"\0" + v.encode() + b"\0" for k, v in parameters.items()) + b"\0"
    return struct.pack("!i", len(body) + 4) + body


def frontend(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def parse(name: str, sql: str, types: tuple[int, ...] = ()) -> bytes:
    return frontend(b"P", cstr(name) + cstr(sql) + struct.pack(f"!h{len(types)}I", len(types), *types))


def bind(portal: str, statement: str, params: list[bytes | None], formats: tuple[int, ...] = (),
         result_formats: tuple[int, ...] = ()) -> bytes:
    body = cstr(portal) + cstr(statement) + struct.pack(f"!h{len(formats)}h", len(formats), *formats)
    body += struct.pack("!h", len(params))
    for p in params:
        body += struct.pack("!i", -1) if p is None else struct.pack("!i", len(p)) + p
    return frontend(b"B", body + struct.pack(f"!h{len(result_formats)}h", len(result_formats), *result_formats))


def execute(portal: str = "", max_rows: int = 0) -> bytes:
    return frontend(b"E", cstr(portal) + struct.pack("!i", max_rows))


def describe(kind: str, name: str = "") -> bytes:
    return frontend(b"D", kind.encode() + cstr(name))


SYNC, FLUSH, TERMINATE = frontend(b"S"), frontend(b"H"), frontend(b"X")


def decode_all(data: bytes, after_startup: bool = True) -> list:
    decoder = FrontendDecoder()
    decoder.expect_startup = not after_startup
    decoder.feed(data)
    messages = []
    while (message := decoder.next_message()) is not None:
        messages.append(message)
    return messages


def backend_messages(data: bytes) -> list[tuple[str, bytes]]:
    """(type, body) of each message in what a server sent."""
    messages, pos = [], 0
    while pos < len(data):
        if data[pos:pos + 1] in (b"S", b"N") and pos == 0 and len(data) == 1:
            return [(data.decode(), b"")]
        kind = chr(data[pos])
        (length,) = struct.unpack_from("!i", data, pos + 1)
        messages.append((kind, data[pos + 5:pos + 1 + length]))
        pos += 1 + length
    return messages


# --- decoding ---------------------------------------------------------------------------------------------------


def test_every_frontend_message_decodes():
    stream = b"".join([
        frontend(b"Q", cstr("SELECT 1")), parse("s1", "SELECT $1", (23,)),
        bind("p", "s1", [b"7", None], (0,), (1,)), describe("S", "s1"), describe("P", "p"), execute("p", 5),
        frontend(b"C", b"S" + cstr("s1")), SYNC, FLUSH, frontend(b"p", cstr("secret")), frontend(b"F", b"x"),
        TERMINATE])
    assert decode_all(stream) == [
        codec.Query("SELECT 1"), codec.Parse("s1", "SELECT $1", (23,)),
        codec.Bind("p", "s1", (0,), (b"7", None), (1,)), codec.Describe("S", "s1"), codec.Describe("P", "p"),
        codec.Execute("p", 5), codec.Close("S", "s1"), codec.Sync(), codec.Flush(),
        codec.PasswordData(b"secret\0"), codec.Unsupported("F"), codec.Terminate()]


def test_startup_phase_messages_decode():
    ssl = struct.pack("!ii", 8, codec.SSL_REQUEST)
    gss = struct.pack("!ii", 8, codec.GSSENC_REQUEST)
    cancel = struct.pack("!iii", 16, codec.CANCEL_REQUEST, 4242) + b"\x01\x02\x03\x04"
    for data, expected in [(ssl, codec.SSLRequest()), (gss, codec.GSSENCRequest()),
                           (cancel, codec.CancelRequest(4242, b"\x01\x02\x03\x04"))]:
        assert decode_all(data, after_startup=False) == [expected]
    decoder = FrontendDecoder()
    decoder.feed(startup(user="ana", database="demo") + frontend(b"Q", cstr("SELECT 1")))
    assert decoder.next_message() == codec.Startup(codec.PROTOCOL_3_0, {"user": "ana", "database": "demo"})
    assert decoder.next_message() == codec.Query("SELECT 1")  # typed messages follow the startup packet


def test_messages_split_anywhere_decode_the_same():
    stream = startup(user="ana") + parse("", "SELECT 1") + bind("", "", []) + execute() + SYNC
    decoder, messages = FrontendDecoder(), []
    for byte in stream:
        decoder.feed(bytes([byte]))
        while (message := decoder.next_message()) is not None:
            messages.append(message)
    assert len(messages) == 5 and isinstance(messages[-1], codec.Sync)


def test_truncated_input_waits_for_more():
    whole = parse("s", "SELECT 1")
    for cut in range(len(whole)):
        assert decode_all(whole[:cut]) == []


@pytest.mark.parametrize("data", [
    frontend(b"Z"),  # a backend message type
    b"Q" + struct.pack("!i", 3),  # length below 4
    b"Q" + struct.pack("!i", codec.MAX_MESSAGE + 1),
    frontend(b"Q", b"no terminator"),
    frontend(b"Q", cstr("SELECT 1") + b"extra"),
    frontend(b"P", cstr("s") + cstr("SELECT 1") + struct.pack("!h", 2) + b"\0\0\0\x17"),  # 2 types, 1 given
    bind("", "", [b"1"], (2,)),  # format code 2
    bind("", "", [], (), (7,)),
    frontend(b"B", cstr("") + cstr("") + struct.pack("!hh", 0, 1) + struct.pack("!i", 50) + b"short"),
    frontend(b"D", b"X" + cstr("s")),  # neither S nor P
    frontend(b"E", cstr("p")),  # no row count
    frontend(b"Q", b"\xff\xfe\0"),  # not UTF-8
])
def test_malformed_messages_are_protocol_violations(data: bytes):
    with pytest.raises(ProtocolViolation):
        decode_all(data)


@pytest.mark.parametrize("data", [
    struct.pack("!ii", 8, 2 << 16),  # protocol 2.0
    struct.pack("!ii", 12, codec.PROTOCOL_3_0) + b"user",  # parameters without NULs
    struct.pack("!iii", 12, codec.CANCEL_REQUEST, 1),  # a cancel key too short
])
def test_malformed_startup_packets_are_protocol_violations(data: bytes):
    with pytest.raises(ProtocolViolation):
        decode_all(data, after_startup=False)


# --- encoding ---------------------------------------------------------------------------------------------------


def test_backend_messages_have_postgresql_bytes():
    assert codec.ready_message("I") == b"Z\0\0\0\x05I"
    assert codec.command_complete_message("SELECT 1") == b"C\0\0\0\x0dSELECT 1\0"
    assert codec.authentication_message(0) == b"R\0\0\0\x08\0\0\0\0"
    assert codec.authentication_message(10, codec.sasl_mechanisms("SCRAM-SHA-256")) == (
        b"R\0\0\0\x17\0\0\0\x0aSCRAM-SHA-256\0\0")
    assert codec.parameter_status_message("DateStyle", "ISO, MDY") == b"S\0\0\0\x17DateStyle\0ISO, MDY\0"
    assert codec.data_row_message([b"1", None]) == b"D\0\0\0\x0f\0\x02\0\0\0\x011\xff\xff\xff\xff"
    assert codec.empty_query_message() == b"I\0\0\0\x04"
    assert codec.portal_suspended_message() == b"s\0\0\0\x04"
    row = codec.row_description_message([Column("count", values.INT8)], [1])
    assert row == b"T\0\0\0\x1e\0\x01count\0" + struct.pack("!ihihih", 0, 0, 20, 8, -1, 1)
    error = codec.error_message(Notice("ERROR", "42501", "refused", hint="ask for aggregates"))
    assert error == (b"E\0\0\0\x37SERROR\0VERROR\0C42501\0Mrefused\0Hask for aggregates\0\0")
    assert codec.negotiate_version_message(0, ["_pq_.x"]) == b"v\0\0\0\x13\0\0\0\0\0\0\0\x01_pq_.x\0"


VALUES = [
    (values.INT8, 42), (values.INT8, -(2**63)), (values.INT4, 7), (values.INT2, -3), (values.FLOAT8, 0.1),
    (values.FLOAT8, -1.5e300), (values.FLOAT8, float("inf")), (values.FLOAT8, 123456789.125), (values.BOOL, True),
    (values.TEXT, "héllo"), (values.DATE, datetime.date(2024, 2, 29)), (values.DATE, datetime.date(1999, 12, 31)),
    (values.TIMESTAMP, datetime.datetime(2024, 5, 1, 12, 30, 15, 250)),
    *[(values.NUMERIC, decimal.Decimal(t)) for t in ["0", "1", "-1", "12345.678", "0.0001", "100000000",
                                                    "-0.000012", "99999999999999999999.99", "1e-20", "NaN",
                                                    "3.14159265358979323846264338327950288"]],
]
TYPE_NAMES = {values.INT8: "int8", values.INT4: "int4", values.INT2: "int2", values.FLOAT8: "float8",
              values.BOOL: "bool", values.TEXT: "text", values.DATE: "date", values.TIMESTAMP: "timestamp",
              values.NUMERIC: "numeric"}


@pytest.mark.parametrize(("type_oid", "value"), VALUES, ids=[f"{TYPE_NAMES[t]}:{v}" for t, v in VALUES])
def test_values_encode_as_postgresql_does(server, type_oid: int, value):
    """Text and binary forms against PostgreSQL's own output for the same value, and back."""
    with psycopg.connect(server.url) as conn:
        pgconn = conn.pgconn
        text = values.encode_value(value, type_oid, binary=False)
        expected = {}
        for fmt in (0, 1):
            result = pgconn.exec_params(f"SELECT $1::{TYPE_NAMES[type_oid]}".encode(), [text], [type_oid],
                                        result_format=fmt)
            assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
            expected[fmt] = result.get_value(0, 0)
    assert text == expected[0]
    assert values.encode_value(value, type_oid, binary=True) == expected[1]
    assert values.encode_value(expected[0], type_oid, binary=True) == expected[1]  # catalog text to binary
    for fmt, data in expected.items():
        decoded = values.decode_value(data, type_oid, binary=fmt == 1)
        assert decoded == value or (isinstance(value, decimal.Decimal) and value.is_nan() and decoded.is_nan())


def test_noisy_floats_in_integer_columns_are_rounded():
    assert values.encode_value(41.6, values.INT8, binary=False) == b"42"
    assert values.encode_value(41.6, values.INT8, binary=True) == struct.pack("!q", 42)
    assert values.encode_value(2.5, values.NUMERIC, binary=False) == b"2.5"


def test_unknown_binary_parameters_pass_through_raw():
    raw = values.decode_value(b"\0\0\0\x01", 1028, binary=True)  # an oid[] array
    assert raw == values.RawValue(b"\0\0\0\x01", 1028)
    with pytest.raises(ValueError):
        values.decode_value(b"12x", values.INT4, binary=False)
    with pytest.raises(ValueError):
        values.encode_value(object(), 600, binary=True)  # a point: binary not supported


def test_infinite_dates_encode_as_postgresql_does():
    """A key at ±infinity reaches the codec as PostgreSQL's text (Python has no such date): text passes through,
    binary is PostgreSQL's own extreme value."""
    from dpsql.server.values import DATE, TIMESTAMPTZ, encode_value

    assert encode_value("infinity", DATE, binary=False) == b"infinity"
    assert encode_value("infinity", DATE, binary=True) == struct.pack("!i", 2**31 - 1)
    assert encode_value("-infinity", DATE, binary=True) == struct.pack("!i", -(2**31))
    assert encode_value("-infinity", TIMESTAMPTZ, binary=True) == struct.pack("!q", -(2**63))
