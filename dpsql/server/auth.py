"""Password verifiers in PostgreSQL's own formats, and the server side of SCRAM-SHA-256, MD5 and cleartext.

    SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>   (the default; base64 parts)
    md5<md5(password || user)>                                  (only for the md5 method)

Passwords are never stored. An unknown analyst goes through the same exchange against a random verifier, so
a login failure does not say whether the name exists.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

import scramp

SCRAM = "SCRAM-SHA-256"
METHODS = ("scram-sha-256", "md5", "password")
ITERATIONS = 4096
_mechanism = scramp.ScramMechanism(SCRAM)


class AuthenticationFailed(Exception):
    pass


def scram_verifier(password: str, iterations: int = ITERATIONS) -> str:
    salt, stored_key, server_key, count = _mechanism.make_auth_info(password, iteration_count=iterations)
    return f"{SCRAM}${count}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


def md5_verifier(user: str, password: str) -> str:
    return "md5" + hashlib.md5((password + user).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ScramKeys:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def parse_scram(verifier: str | None) -> ScramKeys | None:
    """The keys of a SCRAM verifier, or None if `verifier` is not one."""
    if not verifier or not verifier.startswith(SCRAM + "$"):
        return None
    try:
        _, params, keys = verifier.split("$")
        iterations, salt = params.split(":")
        stored_key, server_key = keys.split(":")
        return ScramKeys(base64.b64decode(salt), base64.b64decode(stored_key), base64.b64decode(server_key),
                         int(iterations))
    except ValueError:
        return None


def random_scram_keys() -> ScramKeys:
    """Keys no password matches: the exchange of an unknown analyst fails only at its end."""
    return ScramKeys(secrets.token_bytes(16), secrets.token_bytes(32), secrets.token_bytes(32), ITERATIONS)


class ScramExchange:
    """The server side of one SCRAM-SHA-256 exchange (RFC 5802/7677) without channel binding.

    Written out here rather than taken from scramp's server, which refuses the empty SASL user name that
    libpq sends (PostgreSQL takes the user from the startup packet, and so does dpsql)."""

    def __init__(self, keys: ScramKeys):
        self._keys = keys
        self._client_first_bare = self._server_first = self._nonce = self._gs2_header = ""

    def first(self, client_first: bytes) -> bytes:
        text = _decode(client_first)
        if not text.startswith(("n,", "y,")):  # "p=": channel binding, which dpsql does not offer
            raise AuthenticationFailed("channel binding is not supported")
        cut = text.index(",", 2) + 1
        self._gs2_header, self._client_first_bare = text[:cut], text[cut:]
        client_nonce = _attributes(self._client_first_bare).get("r")
        if not client_nonce:
            raise AuthenticationFailed("client-first message without a nonce")
        self._nonce = client_nonce + _b64(secrets.token_bytes(18))
        self._server_first = f"r={self._nonce},s={_b64(self._keys.salt)},i={self._keys.iterations}"
        return self._server_first.encode("ascii")

    def final(self, client_final: bytes) -> bytes:
        text = _decode(client_final)
        without_proof, _, proof_text = text.rpartition(",p=")
        values = _attributes(without_proof)
        if values.get("r") != self._nonce or values.get("c") != _b64(self._gs2_header.encode("utf-8")):
            raise AuthenticationFailed("client-final message does not match the exchange")
        try:
            proof = base64.b64decode(proof_text, validate=True)
        except ValueError:
            raise AuthenticationFailed("invalid client proof") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.new(self._keys.stored_key, auth_message, hashlib.sha256).digest()
        if len(proof) != len(signature):
            raise AuthenticationFailed("invalid client proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self._keys.stored_key):
            raise AuthenticationFailed("wrong password")
        server_signature = hmac.new(self._keys.server_key, auth_message, hashlib.sha256).digest()
        return f"v={_b64(server_signature)}".encode("ascii")


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed("SCRAM message is not UTF-8") from None


def _attributes(message: str) -> dict[str, str]:
    return {part[0]: part[2:] for part in message.split(",") if len(part) >= 2 and part[1] == "="}


def check_md5(verifier: str | None, salt: bytes, response: str) -> bool:
    """The client's md5(md5(password || user) || salt) against an md5 verifier."""
    if not verifier or not verifier.startswith("md5") or len(verifier) != 35:
        return False
    expected = "md5" + hashlib.md5(verifier[3:].encode("ascii") + salt).hexdigest()
    return hmac.compare_digest(expected, response)


def check_password(verifier: str | None, user: str, password: str) -> bool:
    """A cleartext password (accepted only over TLS) against either kind of verifier."""
    keys = parse_scram(verifier)
    if keys is not None:
        salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), keys.salt, keys.iterations)
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        return hmac.compare_digest(hashlib.sha256(client_key).digest(), keys.stored_key)
    return verifier is not None and hmac.compare_digest(md5_verifier(user, password), verifier)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
