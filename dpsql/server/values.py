"""PostgreSQL's types as the wire carries them: the OIDs dpsql encodes itself, and values in PostgreSQL's text and
binary formats (everything else travels as PostgreSQL's own text)."""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from dataclasses import dataclass
from typing import Any

BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 19, 20, 21, 23, 25, 26
FLOAT4, FLOAT8, UNKNOWN, VARCHAR, BPCHAR, DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC = (700, 701, 705, 1043, 1042, 1082,
                                                                                   1114, 1184, 1700)
TYPE_OIDS = {"bool": BOOL, "int2": INT2, "int4": INT4, "int8": INT8, "text": TEXT, "float4": FLOAT4,
             "float8": FLOAT8, "date": DATE, "timestamp": TIMESTAMP, "timestamptz": TIMESTAMPTZ, "numeric": NUMERIC}
ARRAY_OF = {1016: INT8, 1022: FLOAT8, 1182: DATE, 1115: TIMESTAMP, 1185: TIMESTAMPTZ}  # array type -> element
TYPE_OIDS.update({"int8[]": 1016, "float8[]": 1022, "date[]": 1182, "timestamp[]": 1115, "timestamptz[]": 1185})
TYPE_SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, OID: 4, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIMESTAMP: 8,
              TIMESTAMPTZ: 8, NAME: 64}
POSTGRES_EPOCH = datetime.date(2000, 1, 1)
POSTGRES_EPOCH_TIME = datetime.datetime(2000, 1, 1)


def encode_value(value: Any, type_oid: int, binary: bool) -> bytes | None:
    """A result value in PostgreSQL's text or binary format. `bytes` values are PostgreSQL's own text output
    (from the catalog database) and pass through in text format."""
    if value is None:
        return None
    if not binary:
        return value if isinstance(value, bytes) else _text(value, type_oid).encode("utf-8")
    if isinstance(value, RawValue):  # PostgreSQL's own binary form
        return value.data
    if isinstance(value, bytes):
        value = decode_value(value, type_oid, binary=False)
    return _binary(value, type_oid)


def _text(value: Any, type_oid: int) -> str:
    if isinstance(value, list):  # a one-dimensional array of numbers or times: no element needs quoting
        element = ARRAY_OF.get(type_oid, TEXT)
        return "{" + ",".join("NULL" if v is None else _text(v, element) for v in value) + "}"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if type_oid in (INT2, INT4, INT8) and math.isfinite(value):
            return str(int(round(value)))
        return _float_text(value)
    if isinstance(value, decimal.Decimal):
        return "NaN" if value.is_nan() else format(value, "f")
    if isinstance(value, datetime.datetime):  # PostgreSQL drops trailing zeros of the fraction
        text = value.replace(microsecond=0, tzinfo=None).isoformat(sep=" ")
        if value.microsecond:
            text += f".{value.microsecond:06d}".rstrip("0")
        offset = value.utcoffset()
        if offset is not None:
            minutes = int(offset.total_seconds()) // 60
            text += f"{'+' if minutes >= 0 else '-'}{abs(minutes) // 60:02d}" + (
                f":{abs(minutes) % 60:02d}" if minutes % 60 else "")
        return text
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


INFINITE = {DATE: ("!i", 2**31 - 1), TIMESTAMP: ("!q", 2**63 - 1), TIMESTAMPTZ: ("!q", 2**63 - 1)}


def _binary(value: Any, type_oid: int) -> bytes:
    if type_oid in ARRAY_OF:  # one dimension, from 1: its size, then each element's length and binary form
        element = ARRAY_OF[type_oid]
        items = [None if v is None else _binary(v, element) for v in value]
        header = struct.pack("!iiiii", 1, any(i is None for i in items), element, len(items), 1)
        return header + b"".join(struct.pack("!i", -1) if i is None else struct.pack("!i", len(i)) + i
                                 for i in items)
    try:
        if type_oid == BOOL:
            return b"\x01" if value else b"\x00"
        if type_oid in (INT2, INT4, INT8, OID):
            number = int(round(value)) if isinstance(value, float) else int(value)
            return struct.pack({INT2: "!h", INT4: "!i", INT8: "!q", OID: "!I"}[type_oid], number)
        if type_oid in (FLOAT4, FLOAT8):
            return struct.pack("!f" if type_oid == FLOAT4 else "!d", float(value))
        if type_oid == NUMERIC:
            return _numeric_binary(value)
        if isinstance(value, str) and type_oid in INFINITE and value in ("infinity", "-infinity"):
            # a date Python cannot hold arrives as PostgreSQL's text; its binary infinities are the extremes
            form, top = INFINITE[type_oid]
            return struct.pack(form, top if value == "infinity" else -top - 1)
        if type_oid == DATE:
            return struct.pack("!i", (value - POSTGRES_EPOCH).days)
        if type_oid in (TIMESTAMP, TIMESTAMPTZ):
            if value.tzinfo is not None:
                value = value.astimezone(datetime.UTC).replace(tzinfo=None)
            delta = value - POSTGRES_EPOCH_TIME
            return struct.pack("!q", (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)
        if type_oid in (TEXT, VARCHAR, BPCHAR, NAME, UNKNOWN):
            return str(value).encode("utf-8")
        if type_oid == BYTEA:
            return bytes(value)
    except (struct.error, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise ValueError(f"cannot encode {value!r} as type {type_oid}: {exc}") from None
    raise ValueError(f"binary format for type {type_oid} is not supported")


def _numeric_binary(value: Any) -> bytes:
    """NUMERIC's binary form: base-10000 digits with weight, sign and display scale."""
    number = value if isinstance(value, decimal.Decimal) else decimal.Decimal(repr(float(value)))
    if number.is_nan():
        return struct.pack("!hhHH", 0, 0, 0xC000, 0)
    if number.is_infinite():
        return struct.pack("!hhHH", 0, 0, 0xD000 if number > 0 else 0xF000, 0)
    sign, digits, exponent = number.as_tuple()
    scale = max(0, -exponent)
    text = "".join(map(str, digits))
    if exponent > 0:
        text += "0" * exponent
    integer = text[:len(text) - scale] if scale < len(text) else ""
    fraction = text[len(text) - scale:] if scale else ""
    fraction = fraction.rjust(scale, "0")
    integer = integer.lstrip("0")
    integer = integer.rjust((len(integer) + 3) // 4 * 4, "0")
    fraction = fraction.ljust((len(fraction) + 3) // 4 * 4, "0")
    groups = [int(integer[i:i + 4]) for i in range(0, len(integer), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i:i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:  # leading zero groups lower the weight
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    return struct.pack(f"!hhHH{len(groups)}H", len(groups), weight, 0x4000 if sign else 0, scale, *groups)


@dataclass(frozen=True)
class RawValue:
    """A binary parameter of a type dpsql does not decode (an array, say): passed on to the catalog database
    as it came; the engine refuses it."""

    data: bytes
    type_oid: int


# date and time types by name: their text forms are many (zones, eras, DateStyle), so PostgreSQL reads them
DATETIME_TYPES = {DATE: "date", TIMESTAMP: "timestamp", TIMESTAMPTZ: "timestamptz"}


def decode_value(data: bytes, type_oid: int, binary: bool) -> Any:
    """A parameter (or catalog value) as a Python value: numbers as int/float/Decimal, dates, booleans, text."""
    try:
        if binary:
            return _decode_binary(data, type_oid)
        text = data.decode("utf-8")
        if type_oid in (INT2, INT4, INT8, OID):
            return int(text)
        if type_oid in (FLOAT4, FLOAT8):
            return float(text)
        if type_oid == NUMERIC:
            return decimal.Decimal(text)
        if type_oid == BOOL:
            return text.strip().lower() in ("t", "true", "1", "y", "yes", "on")
        if type_oid == DATE:
            return datetime.date.fromisoformat(text)
        if type_oid == TIMESTAMP:
            return datetime.datetime.fromisoformat(text)
        if type_oid == TIMESTAMPTZ:
            return datetime.datetime.fromisoformat(text + ("00" if text[-3:-2] in "+-" else ""))
        return text
    except (UnicodeDecodeError, ValueError, decimal.InvalidOperation, struct.error) as exc:
        raise ValueError(f"invalid value for type {type_oid}: {exc}") from None


def _decode_binary(data: bytes, type_oid: int) -> Any:
    if type_oid == BOOL:
        return data != b"\x00"
    if type_oid in (INT2, INT4, INT8, OID):
        return struct.unpack({INT2: "!h", INT4: "!i", INT8: "!q", OID: "!I"}[type_oid], data)[0]
    if type_oid in (FLOAT4, FLOAT8):
        return struct.unpack("!f" if type_oid == FLOAT4 else "!d", data)[0]
    if type_oid == NUMERIC:
        return _decode_numeric(data)
    if type_oid == DATE:
        return POSTGRES_EPOCH + datetime.timedelta(days=struct.unpack("!i", data)[0])
    if type_oid in (TIMESTAMP, TIMESTAMPTZ):
        value = POSTGRES_EPOCH_TIME + datetime.timedelta(microseconds=struct.unpack("!q", data)[0])
        return value.replace(tzinfo=datetime.UTC) if type_oid == TIMESTAMPTZ else value
    if type_oid == BYTEA:
        return data
    if type_oid in (TEXT, VARCHAR, BPCHAR, NAME, UNKNOWN):
        return data.decode("utf-8")
    return RawValue(data, type_oid)


def _decode_numeric(data: bytes) -> decimal.Decimal:
    count, weight, sign, scale = struct.unpack_from("!hhHH", data)
    if sign == 0xC000:
        return decimal.Decimal("NaN")
    if sign in (0xD000, 0xF000):
        return decimal.Decimal("Infinity" if sign == 0xD000 else "-Infinity")
    groups = struct.unpack_from(f"!{count}H", data, 8)
    if len(data) != 8 + 2 * count:
        raise ValueError("numeric has trailing bytes")
    digits = "".join(f"{group:04d}" for group in groups)
    value = decimal.Decimal(f"{'-' if sign == 0x4000 else ''}0{digits or '0'}E{4 * (weight - count + 1)}")
    with decimal.localcontext(prec=2 * len(digits) + scale + 10):
        return value.quantize(decimal.Decimal(1).scaleb(-scale))
