"""Fuzzing the wire protocol: the codec and the conversation fed what hypothesis generates, with the real gateway
behind them (a real engine, ledger and shadow database).

Properties: the decoder raises nothing but ProtocolViolation; a conversation never answers with an internal error
(XX000), everything it sends parses as backend messages, and a logged-in session that survives a random sequence
still answers `SELECT 1`. CI runs a few hundred examples; `python benchmarks/fuzz_protocol.py` runs many more.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dpsql.config import Settings  # noqa: E402
from dpsql.server import build_server, codec  # noqa: E402
from dpsql.server.auth import scram_verifier  # noqa: E402
from dpsql.server.protocol import Conversation  # noqa: E402
from tests.conftest import DEMO_SCHEMA, copy_database  # noqa: E402
from tests.test_codec import backend_messages, bind, cstr, describe, execute, frontend, parse, startup  # noqa: E402
from tests.test_server import PASSWORD, _login  # noqa: E402

EXAMPLES = int(os.environ.get("DPSQL_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="DPSQL_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SQL = st.sampled_from([
    "SELECT 1", "SELECT COUNT(*) FROM people", "SELECT sex, COUNT(*) FROM people GROUP BY sex", "BEGIN", "COMMIT",
    "ROLLBACK", "SAVEPOINT a", "ROLLBACK TO SAVEPOINT a", "SET dpsql.epsilon = 0.1", "SHOW dpsql.budget",
    "SELECT * FROM people", "SELECT $1::int", "SELECT $1::date", "DEALLOCATE ALL", "DISCARD ALL", "", ";",
    "SELECT 'unterminated", "SELECT 1; SELECT 2", "SET TimeZone = 'UTC'", "SELECT COUNT(*) FROM nowhere",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM people", "COPY people TO STDOUT",
]) | st.text(max_size=40)
NAMES = st.sampled_from(["", "s1", "s2", "p1"])
PARAM = st.none() | st.binary(max_size=12)
MESSAGE = st.one_of(
    SQL.map(lambda sql: frontend(b"Q", cstr(sql))),
    st.tuples(NAMES, SQL, st.lists(st.sampled_from([0, 23, 25, 1082, 1114, 701]), max_size=2)).map(
        lambda t: parse(t[0], t[1], tuple(t[2]))),
    st.tuples(NAMES, NAMES, st.lists(PARAM, max_size=2), st.lists(st.sampled_from([0, 1]), max_size=2)).map(
        lambda t: bind(t[0], t[1], t[2], tuple(t[3]))),
    st.tuples(st.sampled_from(["S", "P"]), NAMES).map(lambda t: describe(t[0], t[1])),
    st.tuples(NAMES, st.integers(-1, 3)).map(lambda t: execute(t[0], t[1])),
    st.just(frontend(b"S")), st.just(frontend(b"H")),
    st.tuples(st.sampled_from([b"C", b"F", b"d", b"c", b"f", b"X", b"?"]), st.binary(max_size=16)).map(
        lambda t: frontend(t[0], t[1])),
)


@pytest.fixture(scope="module")
def gateway(server, template) -> Iterator:
    url = copy_database(server, template, "dpsql_protocol_fuzz")
    engine, dp_server = build_server(Settings(database=url, schema=str(DEMO_SCHEMA), listen="127.0.0.1:0"))
    engine.ledger.add_analyst("ana", 1e6, 1e-3)
    engine.ledger.set_verifier("ana", scram_verifier(PASSWORD))
    yield dp_server.gateway
    dp_server.gateway.close()
    engine.close()


def _no_internal_errors(data: bytes) -> list[tuple[str, bytes]]:
    messages = backend_messages(data)
    for kind, body in messages:
        if kind == "E":
            fields = dict((f[:1], f[1:]) for f in body.split(b"\0") if f)
            assert fields.get(b"C") != b"XX000", fields
    return messages


@FUZZ
@given(data=st.binary(max_size=300))
def test_decoder_raises_only_protocol_violations(data: bytes):
    decoder = codec.FrontendDecoder()
    decoder.feed(data)
    try:
        while decoder.next_message() is not None:
            pass
    except codec.ProtocolViolation:
        pass


@FUZZ
@given(data=st.binary(max_size=200), prefix=st.booleans())
def test_bytes_before_login_never_cause_an_internal_error(gateway, data: bytes, prefix: bool):
    conversation = Conversation(gateway, process_id=1, secret=b"abcd")
    payload = (startup(user="ana", database="demo") if prefix else b"") + data
    _no_internal_errors(conversation.receive(payload).data)
    conversation.close()


@FUZZ
@given(messages=st.lists(MESSAGE, max_size=8))
def test_a_logged_in_session_survives_any_message_sequence(gateway, messages: list[bytes]):
    conversation = Conversation(gateway, process_id=2, secret=b"abcd")
    _login(conversation)
    closed = False
    for message in messages:
        output = conversation.receive(message)
        _no_internal_errors(output.data)
        if output.close:
            closed = True
            break
    if not closed:  # end any block and any failed extended-protocol sequence, then ask something simple
        output = conversation.receive(frontend(b"S") + frontend(b"Q", cstr("ROLLBACK")) +
                                      frontend(b"Q", cstr("SELECT 1")))
        replies = _no_internal_errors(output.data)
        assert ("D", struct.pack("!hi", 1, 1) + b"1") in replies
    conversation.close()
