"""The pure SASL login of the connection diagnosis: SCRAM against RFC 7677's vector and
kafka-python's own client, the Kafka frames, and how the broker's answers are named."""

from __future__ import annotations

import base64
import struct

import pytest
from kafka.net.sasl.scram import ScramClient as KafkaPythonScram

from kmq.client.sasl import (
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    AuthenticateResponse,
    HandshakeResponse,
    PasswordLogin,
    ScramClient,
    ScramError,
    authenticate_body,
    handshake_body,
    handshake_verdict,
    login_verdict,
    parse_authenticate,
    parse_handshake,
    request_frame,
)
from kmq.config import Config
from kmq.core.errors import AuthenticationFailed

# RFC 7677, section 3: user "user", password "pencil".
RFC_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_sha_256_matches_the_rfc_7677_vector():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_NONCE)
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)  # raises when the server's signature is not the expected one


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_proof_and_server_signature_match_kafka_pythons_client(mechanism):
    nonce = "fyko+d2lbbFgONRv9qkxdawL"
    ours = ScramClient(mechanism, "kmq", "s3cret", nonce=nonce)
    theirs = KafkaPythonScram("kmq", "s3cret", mechanism)
    theirs.nonce = nonce.encode()
    assert ours.first() == theirs.first_message()
    server_first = f"r={nonce}srv,s={base64.b64encode(b'salt-salt').decode()},i=4096".encode()
    theirs.process_server_first_message(server_first)
    assert ours.final(server_first) == theirs.final_message()
    ours.verify(b"v=" + base64.b64encode(theirs.server_signature))


def test_scram_escapes_comma_and_equals_in_the_user_name():
    assert ScramClient("SCRAM-SHA-512", "a=b,c", "pw", nonce="n").first() == b"n,,n=a=3Db=2Cc,r=n"


@pytest.mark.parametrize("server_first, why", [
    (b"e=unknown-user", "unknown-user"),
    (b"r=someone-elses-nonce,s=c2FsdA==,i=4096", "malformed"),
    (b"r=" + RFC_NONCE.encode() + b"x,s=c2FsdA==,i=99999999", "iterations"),
])
def test_scram_refuses_a_server_first_message_it_cannot_answer(server_first, why):
    with pytest.raises(ScramError, match=why):
        ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_NONCE).final(server_first)


@pytest.mark.parametrize("server_final, why", [
    (b"e=invalid-proof", "invalid-proof"),
    (b"v=" + base64.b64encode(b"\0" * 32), "signature does not match"),
])
def test_scram_refuses_a_wrong_server_final_message(server_final, why):
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_NONCE)
    client.final(RFC_SERVER_FIRST)
    with pytest.raises(ScramError, match=why):
        client.verify(server_final)


def test_plain_login_is_one_message_and_scram_three_rounds():
    plain = PasswordLogin("PLAIN", "kmq", "pw")
    assert plain.start() == b"\0kmq\0pw"
    assert plain.step(b"") is None
    scram = PasswordLogin("SCRAM-SHA-256", "user", "pencil", nonce=RFC_NONCE)
    assert scram.start() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert scram.step(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    assert scram.step(RFC_SERVER_FINAL) is None


def test_request_frames_carry_the_header_and_body():
    frame = request_frame(17, 1, 7, handshake_body("SCRAM-SHA-512"))
    size, api_key, version, correlation_id, client_id_len = struct.unpack(">ihhih", frame[:14])
    assert (size, api_key, version, correlation_id) == (len(frame) - 4, 17, 1, 7)
    assert frame[14:14 + client_id_len] == b"kmq"
    assert frame[14 + client_id_len:] == b"\x00\x0dSCRAM-SHA-512"
    assert authenticate_body(b"abc") == b"\x00\x00\x00\x03abc"


def _string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def test_handshake_and_authenticate_answers_are_parsed():
    body = struct.pack(">hi", UNSUPPORTED_SASL_MECHANISM, 2) + _string("PLAIN") + _string("SCRAM-SHA-256")
    assert parse_handshake(body) == HandshakeResponse(33, ("PLAIN", "SCRAM-SHA-256"))
    body = struct.pack(">h", 58) + _string("invalid credentials") + struct.pack(">i", -1) + struct.pack(">q", 0)
    assert parse_authenticate(body) == AuthenticateResponse(58, "invalid credentials", b"")
    body = struct.pack(">hhi", 0, -1, 3) + b"v=x" + struct.pack(">q", 0)
    assert parse_authenticate(body) == AuthenticateResponse(0, None, b"v=x")
    with pytest.raises(ValueError, match="truncated"):
        parse_authenticate(struct.pack(">h", 0) + _string("cut")[:3])


def _kafka(mechanism: str = "SCRAM-SHA-512"):
    return Config.from_dict({"kafka": {"bootstrap_servers": "10.0.0.7:9092", "security_protocol": "SASL_SSL",
                                       "sasl_mechanism": mechanism, "sasl_username": "orders-app"}}).kafka


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_refused_login_names_mechanism_user_reason_and_the_password_keys(mechanism):
    reason = f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
    err = login_verdict(_kafka(mechanism), AuthenticateResponse(SASL_AUTHENTICATION_FAILED, reason, b""))
    assert isinstance(err, AuthenticationFailed) and not err.retriable
    text = str(err)
    assert f"Kafka at 10.0.0.7:9092 refused SASL {mechanism} authentication as 'orders-app' ({reason})" in text
    assert "KMQ_KAFKA__SASL_PASSWORD" in text and "kafka.sasl_password_file" in text


def test_an_accepted_round_is_no_error():
    assert login_verdict(_kafka(), AuthenticateResponse(0, None, b"r=...")) is None
    assert handshake_verdict(_kafka(), "h:1", HandshakeResponse(0, ("SCRAM-SHA-512",))) is None


def test_a_mechanism_the_listener_does_not_offer_is_named_with_what_it_offers():
    err = handshake_verdict(_kafka(), "h:1", HandshakeResponse(UNSUPPORTED_SASL_MECHANISM, ("PLAIN", "SCRAM-SHA-256")))
    assert isinstance(err, AuthenticationFailed)
    assert "does not offer SASL SCRAM-SHA-512 (it offers: PLAIN, SCRAM-SHA-256)" in str(err)
    assert "kafka.sasl_mechanism" in str(err)


def test_a_listener_without_sasl_is_named():
    err = handshake_verdict(_kafka(), "h:1", HandshakeResponse(ILLEGAL_SASL_STATE, ()))
    assert "not a SASL listener" in str(err) and "kafka.security_protocol" in str(err)
