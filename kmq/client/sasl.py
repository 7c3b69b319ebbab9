"""A SASL password login (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) as Kafka frames, and what its answers mean.

kafka-python 3.0.12 does not raise a refused login during bootstrap: it records it per
connection and the caller sees only "Unable to bootstrap". So :mod:`kmq.client.diagnose`
logs in itself over its probe socket and names the refusal. This module is the pure part:
the SaslHandshake (api key 17, v1) and SaslAuthenticate (api key 36, v1) frames, the client
side of SCRAM (RFC 5802, RFC 7677), and :func:`login_verdict`, which turns a broker's answer
into kmq's error. The socket stays in ``diagnose``.

A refused login is :class:`~kmq.core.errors.AuthenticationFailed` from
:func:`authentication_failed`, whoever found it (kafka-python mid-run, or the diagnosis).
The password is used for the proof only and never appears in a message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass

from kmq.config import PASSWORD_MECHANISMS, KafkaConfig
from kmq.core.errors import AuthenticationFailed, KmqError

__all__ = [
    "SASL_HANDSHAKE", "SASL_AUTHENTICATE", "SASL_AUTHENTICATION_FAILED", "UNSUPPORTED_SASL_MECHANISM",
    "ILLEGAL_SASL_STATE", "ScramClient", "ScramError", "PasswordLogin", "HandshakeResponse",
    "AuthenticateResponse", "request_frame", "handshake_body", "authenticate_body", "parse_handshake",
    "parse_authenticate", "authentication_failed", "handshake_verdict", "login_verdict",
]

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
_CLIENT_ID = b"kmq"
_MAX_ITERATIONS = 1_000_000  # a server asking for more is not one to spend seconds of CPU on
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class ScramError(ValueError):
    """The server ended or broke the SCRAM exchange (``e=...``, a foreign nonce, a wrong signature)."""


# --- frames -------------------------------------------------------------------------------

def request_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    """A size-prefixed request with header v1 (client id "kmq"), as both SASL requests at v1 use."""
    header = struct.pack(">hhih", api_key, version, correlation_id, len(_CLIENT_ID)) + _CLIENT_ID
    return struct.pack(">i", len(header) + len(body)) + header + body


def handshake_body(mechanism: str) -> bytes:
    name = mechanism.encode()
    return struct.pack(">h", len(name)) + name


def authenticate_body(auth_bytes: bytes) -> bytes:
    return struct.pack(">i", len(auth_bytes)) + auth_bytes


@dataclass(frozen=True)
class HandshakeResponse:
    error_code: int
    mechanisms: tuple[str, ...]


@dataclass(frozen=True)
class AuthenticateResponse:
    error_code: int
    error_message: str | None
    auth_bytes: bytes


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"truncated Kafka response ({len(self.data)} bytes)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return struct.unpack(">h", self.take(2))[0]

    def int32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else self.take(n).decode("utf-8", "replace")

    def bytes_(self) -> bytes:
        n = self.int32()
        return b"" if n < 0 else self.take(n)


def parse_handshake(body: bytes) -> HandshakeResponse:
    """A SaslHandshake v1 response body (after the correlation id). Raises ValueError when malformed."""
    r = _Reader(body)
    code = r.int16()
    return HandshakeResponse(code, tuple(r.string() or "" for _ in range(max(r.int32(), 0))))


def parse_authenticate(body: bytes) -> AuthenticateResponse:
    """A SaslAuthenticate v1 response body (after the correlation id). Raises ValueError when malformed."""
    r = _Reader(body)
    return AuthenticateResponse(r.int16(), r.string(), r.bytes_())  # then session_lifetime_ms, unused


# --- the mechanisms -----------------------------------------------------------------------

def _saslname(user: str) -> str:
    return user.replace("=", "=3D").replace(",", "=2C")


def _attributes(message: bytes) -> dict[str, str]:
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScramError("the server's SCRAM message is not UTF-8") from exc
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


class ScramClient:
    """The client side of one SCRAM exchange (no channel binding, as Kafka):
    :meth:`first` -> the server's first message -> :meth:`final` -> the server's final
    message -> :meth:`verify`. ``nonce`` is random unless given (tests pass RFC vectors)."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: str | None = None) -> None:
        if mechanism not in _HASHES:
            raise ValueError(f"not a SCRAM mechanism: {mechanism}")
        self._hash = _HASHES[mechanism]
        self._password = password.encode("utf-8")
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._first_bare = f"n={_saslname(user)},r={self._nonce}"
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        attrs = _attributes(server_first)
        if "e" in attrs:
            raise ScramError(f"the server ended the SCRAM exchange: {attrs['e']}")
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or salt is None or not iterations.isdigit():
            raise ScramError("the server's first SCRAM message is malformed")
        if not 0 < int(iterations) <= _MAX_ITERATIONS:
            raise ScramError(f"the server asks for {iterations} SCRAM iterations")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, base64.b64decode(salt), int(iterations))
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{server_first.decode()},{without_proof}".encode()
        client_key = self._hmac(salted, b"Client Key")
        signature = self._hmac(hashlib.new(self._hash, client_key).digest(), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = _attributes(server_final)
        if "e" in attrs:
            raise ScramError(f"the server refused the SCRAM proof: {attrs['e']}")
        if self._server_signature is None or base64.b64decode(attrs.get("v", "")) != self._server_signature:
            raise ScramError("the server's SCRAM signature does not match (not the server that holds this user)")

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self._hash).digest()


class PasswordLogin:
    """The client messages of a PLAIN or SCRAM login, one per SaslAuthenticate round:
    :meth:`start` gives the first; :meth:`step` takes the server's answer and gives the
    next message, or None when the login is complete (raises :class:`ScramError`)."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: str | None = None) -> None:
        if mechanism not in PASSWORD_MECHANISMS:
            raise ValueError(f"not a password mechanism: {mechanism}")
        self._plain = f"\0{user}\0{password}".encode()  # RFC 4616: no authorization identity
        self._scram = None if mechanism == "PLAIN" else ScramClient(mechanism, user, password, nonce)
        self._round = 0

    def start(self) -> bytes:
        return self._plain if self._scram is None else self._scram.first()

    def step(self, server: bytes) -> bytes | None:
        self._round += 1
        if self._scram is None:
            return None
        if self._round == 1:
            return self._scram.final(server)
        self._scram.verify(server)
        return None


# --- what the answers mean ----------------------------------------------------------------

def authentication_failed(kafka: KafkaConfig, detail: object) -> AuthenticationFailed:
    """The refused-login error: the mechanism, the user, the broker's reason and the keys to check."""
    who = f" as {kafka.sasl_username!r}" if kafka.sasl_username else ""
    if kafka.sasl_mechanism in PASSWORD_MECHANISMS:
        fix = "check kafka.sasl_username and the password (KMQ_KAFKA__SASL_PASSWORD or kafka.sasl_password_file)"
    elif kafka.sasl_mechanism == "OAUTHBEARER":
        fix = "check the token from kafka.sasl_oauth_token_file / kafka.sasl_oauth_token_command (issuer, audience, expiry)"
    elif kafka.sasl_mechanism == "AWS_MSK_IAM":
        fix = "check the AWS credentials of this process (role, region) and the cluster's IAM policy"
    else:
        fix = "the broker requires SASL: set kafka.security_protocol SASL_SSL and kafka.sasl_mechanism"
    why = str(detail).strip() or (type(detail).__name__ if isinstance(detail, BaseException) else "")
    return AuthenticationFailed(
        f"Kafka at {kafka.bootstrap_servers} refused SASL {kafka.sasl_mechanism or ''} authentication{who} "
        f"({why or 'no reason given'}); {fix}"
    )


def handshake_verdict(kafka: KafkaConfig, server: str, response: HandshakeResponse) -> KmqError | None:
    """kmq's error for a SaslHandshake answer, or None when the mechanism is offered."""
    if response.error_code == 0:
        return None
    if response.error_code == UNSUPPORTED_SASL_MECHANISM:
        offered = ", ".join(response.mechanisms) or "none"
        return AuthenticationFailed(
            f"Kafka at {server} does not offer SASL {kafka.sasl_mechanism} (it offers: {offered}); set "
            "kafka.sasl_mechanism to one the listener offers"
        )
    if response.error_code == ILLEGAL_SASL_STATE:
        return AuthenticationFailed(
            f"Kafka at {server} does not expect a SASL login on this port (ILLEGAL_SASL_STATE): it is not a SASL "
            "listener; use the broker's SASL listener in kafka.bootstrap_servers, or set kafka.security_protocol "
            "to PLAINTEXT (or SSL)"
        )
    return AuthenticationFailed(f"Kafka at {server} answered the SASL handshake with error code {response.error_code}")


def login_verdict(kafka: KafkaConfig, response: AuthenticateResponse) -> KmqError | None:
    """kmq's error for a SaslAuthenticate answer, or None when the round succeeded."""
    if response.error_code == 0:
        return None
    if response.error_code == SASL_AUTHENTICATION_FAILED:
        return authentication_failed(kafka, response.error_message or "SASL_AUTHENTICATION_FAILED")
    return authentication_failed(kafka, f"error code {response.error_code}: {response.error_message or 'no message'}")
