"""Why a connection to Kafka failed, found one layer at a time.

kafka-python reports every failed bootstrap the same way ("Unable to
bootstrap"), whether the broker is down, the CA is wrong, our client
certificate was refused or the port speaks another protocol. When a client
cannot connect, :func:`diagnose` repeats the steps itself against each
bootstrap server, with the same TLS context the clients use, and returns the
first error it can name:

1. TCP connect: refused, no answer, unknown host -> :class:`BrokerUnavailable`
2. TLS handshake (SSL, SASL_SSL): broker certificate untrusted, expired or for
   another host -> :class:`CertificateRejected`; no TLS answer (a plaintext
   port) -> :class:`TlsHandshakeFailed`
3. a first Kafka request (ApiVersions v0): a TLS alert (TLS 1.3 sends the
   broker's verdict on our client certificate only now) ->
   :class:`CertificateRejected`; a plaintext request answered with TLS or a
   closed connection -> :class:`TlsHandshakeFailed` (a TLS port)
4. SASL PLAIN and SCRAM (SASL_PLAINTEXT, SASL_SSL): the login itself, SaslHandshake then
   SaslAuthenticate on the same connection (frames and SCRAM in :mod:`kmq.client.sasl`): a
   refused user or password -> :class:`AuthenticationFailed` with the broker's reason; a
   mechanism the listener does not offer, or a listener without SASL -> :class:`AuthenticationFailed`
   naming ``kafka.sasl_mechanism`` or ``kafka.security_protocol``
5. OAUTHBEARER: the token can be obtained -> else :class:`AuthenticationFailed`

kafka-python 3.0.12 does not raise a login refused during bootstrap: it keeps the failure to
itself and times out ("Unable to bootstrap"), which is why step 4 logs in again here. A refusal
it raises mid-run (``SaslAuthenticationFailedError``) is mapped to the same message in
:mod:`kmq.client.kafka_python.clients`; ACL denials come from it as ``*AuthorizationFailedError``.

Every message is one line: what failed, where, and which key to check.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
from datetime import datetime, timezone
from pathlib import Path

from kmq.client.sasl import (
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    PasswordLogin,
    ScramError,
    authenticate_body,
    authentication_failed,
    handshake_body,
    handshake_verdict,
    login_verdict,
    parse_authenticate,
    parse_handshake,
    request_frame,
)
from kmq.client.secrets import sasl_password
from kmq.config import PASSWORD_MECHANISMS, KafkaConfig
from kmq.core.errors import (
    BrokerUnavailable,
    CertificateRejected,
    KmqError,
    TlsHandshakeFailed,
)

__all__ = ["diagnose", "refused_everywhere", "unreachable", "broker_certificate_error", "tls_alert_error", "API_VERSIONS_V0"]

_FIX_BOOTSTRAP = ("Check kafka.bootstrap_servers (or KMQ_KAFKA__BOOTSTRAP_SERVERS); `kmq dev broker` starts a local one")
_CORRELATION_ID = 0x6B6D71  # "kmq"
# ApiVersions v0 request: header v1 (api_key 18, version 0, correlation id, client id "kmq"), empty body.
_REQUEST = struct.pack(">hhih", 18, 0, _CORRELATION_ID, 3) + b"kmq"
API_VERSIONS_V0 = struct.pack(">i", len(_REQUEST)) + _REQUEST
_STEP_TIMEOUT_S = 5.0
#: How long :func:`refused_everywhere` waits for a TCP answer: a refusal comes at once, and anything
#: slower is left to the client and its own timeout.
_REFUSAL_WAIT_S = 0.5
_VERDICT_WAIT_S = 1.0

log = logging.getLogger(__name__)


def unreachable(kafka: KafkaConfig, timeout_s: float | None = None, cause: object = None) -> BrokerUnavailable:
    """The "nothing answers" error, with the cause when known."""
    within = f" within {timeout_s:g}s" if timeout_s else ""
    why = f" ({cause})" if cause else ""
    return BrokerUnavailable(f"cannot reach Kafka at {kafka.bootstrap_servers}{within}{why}: is the broker running? {_FIX_BOOTSTRAP}")


def broker_certificate_error(server: str, exc: ssl.SSLCertVerificationError) -> CertificateRejected:
    """Our side refused the broker's certificate: say why and which key fixes it."""
    why = (exc.verify_message or exc.reason or str(exc)).rstrip(".")
    low = why.lower()
    if "hostname" in low or "ip address mismatch" in low:
        fix = ("connect by a name the certificate carries (kafka.bootstrap_servers and the broker's advertised listeners), "
               "or set kafka.ssl_check_hostname: false")
    elif "expired" in low or "not yet valid" in low:
        fix = "the broker's certificate must be renewed (or the clocks compared)"
    else:
        fix = "set kafka.ssl_cafile to the CA that signed the broker's certificate"
    return CertificateRejected(f"Kafka's TLS certificate at {server} is not accepted: {why}; {fix}")


def tls_alert_error(server: str, exc: ssl.SSLError, certfile: str | None = None) -> KmqError | None:
    """The broker ended TLS with an alert about our client certificate, or None for other TLS errors.
    ``certfile``: the client certificate kmq sent (None: none), which tells apart what a broker's
    alert may not: a Java broker answers a missing, an expired and an untrusted certificate alike
    (bad certificate, certificate unknown)."""
    reason = (exc.reason or "").upper()
    if "ALERT" not in reason:
        return None
    alert = reason.split("ALERT_", 1)[-1].replace("_", " ").lower()
    about_certificate = any(word in alert for word in ("certificate", "unknown ca", "access denied"))
    if "certificate required" in alert or (about_certificate and certfile is None):
        return CertificateRejected(
            f"Kafka at {server} requires a client certificate (TLS alert: {alert}); set kafka.ssl_certfile and "
            "kafka.ssl_keyfile (mutual TLS)"
        )
    if about_certificate:
        dated = _validity_problem(certfile) if certfile else None
        if dated:
            return CertificateRejected(
                f"Kafka at {server} refused kmq's client certificate (TLS alert: {alert}): {dated}; renew "
                f"kafka.ssl_certfile ({certfile}) and kafka.ssl_keyfile, or compare the clocks"
            )
        return CertificateRejected(
            f"Kafka at {server} refused kmq's client certificate (TLS alert: {alert}); check kafka.ssl_certfile and "
            "kafka.ssl_keyfile: a certificate that is valid now and signed by a CA the broker trusts"
        )
    return TlsHandshakeFailed(f"TLS with Kafka at {server} failed (TLS alert: {alert}); check the broker's TLS settings")


def _validity_problem(certfile: str) -> str | None:
    """"certificate expired on ..." (or not valid before ...) for the first certificate of
    ``certfile`` when it is outside its validity now; None when valid or unreadable here (the
    ``cryptography`` package reads it; without it the broker's alert is all there is)."""
    try:
        from cryptography import x509
    except ImportError:
        return None
    try:
        cert = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
    except (OSError, ValueError):
        return None
    now = datetime.now(timezone.utc)
    if cert.not_valid_after_utc < now:
        return f"the certificate expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    if cert.not_valid_before_utc > now:
        return f"the certificate is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    return None


def _tls_to_plaintext(server: str, detail: str, kafka: KafkaConfig | None = None) -> TlsHandshakeFailed:
    # A connection closed mid-handshake is also how a TLS 1.2 broker may refuse a client certificate.
    closed = "EOF" in detail or "closed" in detail
    also = (f", or the broker refused the client certificate {kafka.ssl_certfile} (check kafka.ssl_certfile)"
            if closed and kafka is not None and kafka.ssl_certfile else "")
    return TlsHandshakeFailed(
        f"TLS handshake with Kafka at {server} failed ({detail}): the port does not speak TLS; use the broker's "
        f"TLS listener in kafka.bootstrap_servers, or set kafka.security_protocol to PLAINTEXT (or SASL_PLAINTEXT){also}"
    )


def _plaintext_to_tls(server: str, detail: str) -> TlsHandshakeFailed:
    return TlsHandshakeFailed(
        f"Kafka at {server} did not answer a plaintext Kafka request ({detail}): the port expects TLS; set "
        "kafka.security_protocol to SSL (or SASL_SSL) and kafka.ssl_cafile"
    )


def _closed_after_handshake(kafka: KafkaConfig, server: str) -> CertificateRejected:
    if not kafka.ssl_certfile:
        return CertificateRejected(
            f"Kafka at {server} closed the TLS connection right after the handshake: it probably requires a client "
            "certificate (mutual TLS); set kafka.ssl_certfile and kafka.ssl_keyfile"
        )
    return CertificateRejected(
        f"Kafka at {server} closed the TLS connection right after the handshake: it probably refused kmq's client "
        f"certificate {kafka.ssl_certfile} (expired, or not signed by a CA the broker trusts); check kafka.ssl_certfile "
        "and kafka.ssl_keyfile"
    )


def _client_certificate_verdict(kafka: KafkaConfig, server: str, sock: ssl.SSLSocket, wait: float) -> KmqError | None:
    """With TLS 1.3 the broker judges our client certificate after our handshake is done: listen
    for its alert before writing anything (a write could turn the alert into a bare reset).
    A Kafka broker sends nothing unasked, so silence until ``wait`` means "accepted"."""
    sock.settimeout(wait)
    try:
        if not sock.recv(1):
            return _closed_after_handshake(kafka, server)
    except TimeoutError:
        return None
    except ssl.SSLError as exc:
        if isinstance(exc, ssl.SSLEOFError):
            return _closed_after_handshake(kafka, server)
        return tls_alert_error(server, exc, kafka.ssl_certfile) or TlsHandshakeFailed(
            f"TLS with Kafka at {server} failed after the handshake: {exc.reason or exc}")
    except OSError:
        return _closed_after_handshake(kafka, server)
    return None  # data nobody asked for: let the Kafka request below judge the listener


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def _logs_in_with_password(kafka: KafkaConfig) -> bool:
    return kafka.security_protocol.startswith("SASL_") and kafka.sasl_mechanism in PASSWORD_MECHANISMS


def _exchange(sock: socket.socket, api_key: int, correlation_id: int, body: bytes) -> bytes:
    """Send one v1 request, return its response body (after the correlation id)."""
    sock.sendall(request_frame(api_key, 1, correlation_id, body))
    head = _recv_exactly(sock, 4)
    size = struct.unpack(">i", head)[0] if len(head) == 4 else -1
    data = _recv_exactly(sock, size) if size >= 4 else b""
    if len(data) < max(size, 4):
        raise ConnectionError("the connection closed mid-answer")
    if struct.unpack(">i", data[:4])[0] != correlation_id:
        raise ConnectionError("an answer to another request")
    return data[4:]


def _sasl_login(kafka: KafkaConfig, server: str, sock: socket.socket, unread: int) -> KmqError | None:
    """Log in with the configured user and password as the clients would: the broker's verdict
    as kmq's error, or None when it accepts the login. ``unread``: bytes of the ApiVersions
    answer still to read first."""
    mechanism = kafka.sasl_mechanism or ""
    try:
        if len(_recv_exactly(sock, unread)) < unread:
            raise ConnectionError("the connection closed in the ApiVersions answer")
        answer = parse_handshake(_exchange(sock, SASL_HANDSHAKE, _CORRELATION_ID + 1, handshake_body(mechanism)))
        found = handshake_verdict(kafka, server, answer)
        if found is not None:
            return found
        login = PasswordLogin(mechanism, kafka.sasl_username or "", sasl_password(kafka) or "")
        message: bytes | None = login.start()
        correlation_id = _CORRELATION_ID + 2
        while message is not None:
            reply = parse_authenticate(_exchange(sock, SASL_AUTHENTICATE, correlation_id, authenticate_body(message)))
            found = login_verdict(kafka, reply)
            if found is not None:
                return found
            message = login.step(reply.auth_bytes)
            correlation_id += 1
    except ScramError as exc:
        return authentication_failed(kafka, exc)
    except (OSError, ValueError) as exc:  # ValueError: a malformed answer
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return BrokerUnavailable(f"Kafka at {server} broke off the SASL {mechanism} login ({detail}); check "
                                 "kafka.sasl_mechanism and kafka.security_protocol against the listener's settings")
    log.debug("SASL %s login as %r at %s accepted", mechanism, kafka.sasl_username, server)
    return None


def _probe_server(kafka: KafkaConfig, host: str, port: int, timeout: float) -> KmqError | None:
    """One bootstrap server: the error found, or None when every step worked."""
    server = f"{host}:{port}"
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror as exc:
        return unreachable(kafka, cause=f"cannot resolve {host}: {exc.strerror}")
    except ConnectionRefusedError:
        return unreachable(kafka, cause=f"connection refused by {server}")
    except TimeoutError:
        return unreachable(kafka, cause=f"no answer from {server} within {timeout:g}s")
    except OSError as exc:
        return unreachable(kafka, cause=f"{server}: {exc.strerror or exc}")
    sock: socket.socket = raw
    try:
        sock.settimeout(timeout)
        if kafka.uses_tls:
            from kmq.client.tls import ssl_context

            try:
                sock = ssl_context(kafka).wrap_socket(raw, server_hostname=host)
            except ssl.SSLCertVerificationError as exc:
                return broker_certificate_error(server, exc)
            except ssl.SSLError as exc:
                alert = tls_alert_error(server, exc, kafka.ssl_certfile)
                if alert is not None:
                    return alert
                return _tls_to_plaintext(server, exc.reason or str(exc), kafka)
            except TimeoutError:
                return _tls_to_plaintext(server, f"no TLS answer within {timeout:g}s")
            except OSError as exc:  # EOF or reset: a plaintext Kafka port drops a ClientHello
                return _tls_to_plaintext(server, f"connection closed: {exc.strerror or type(exc).__name__}", kafka)
            verdict = _client_certificate_verdict(kafka, server, sock, min(timeout, _VERDICT_WAIT_S))
            if verdict is not None:
                return verdict
            sock.settimeout(timeout)
        try:
            sock.sendall(API_VERSIONS_V0)
            head = _recv_exactly(sock, 8)
        except ssl.SSLError as exc:
            found = tls_alert_error(server, exc, kafka.ssl_certfile)
            if found is None and isinstance(exc, ssl.SSLEOFError):
                # TLS 1.3 clients learn the broker's verdict on their certificate only now; a TLS
                # terminator that drops the connection instead of sending an alert means the same.
                found = _closed_after_handshake(kafka, server)
            return found or TlsHandshakeFailed(f"TLS with Kafka at {server} failed after the handshake: {exc.reason or exc}")
        except TimeoutError:
            if kafka.uses_tls:
                return unreachable(kafka, cause=f"{server} accepted TLS but did not answer a Kafka request within {timeout:g}s")
            return _plaintext_to_tls(server, f"no answer within {timeout:g}s")
        except OSError as exc:
            head, closed = b"", exc.strerror or type(exc).__name__
        else:
            closed = "connection closed"
        if len(head) < 8 or struct.unpack(">i", head[4:8])[0] != _CORRELATION_ID:
            if head[:1] == b"\x15" or not kafka.uses_tls:  # 0x15: a TLS alert record
                return _plaintext_to_tls(server, "answered with TLS" if head[:1] == b"\x15" else closed)
            return unreachable(kafka, cause=f"{server} closed the connection after the TLS handshake; is it a Kafka listener?")
        if _logs_in_with_password(kafka):
            return _sasl_login(kafka, server, sock, struct.unpack(">i", head[:4])[0] - 4)
    finally:
        sock.close()
    if kafka.sasl_mechanism == "OAUTHBEARER":
        from kmq.client.oauth import token_provider

        token_provider(kafka).token()  # raises AuthenticationFailed naming the token source
    return None


def probe(kafka: KafkaConfig, timeout_s: float) -> list[tuple[str, KmqError | None]]:
    """Each bootstrap server with the error found connecting to it (None: it answers and, for a
    password login, accepts it), each step waiting at most ``timeout_s``."""
    found: list[tuple[str, KmqError | None]] = []
    for entry in kafka.servers:
        host, _, port = entry.rpartition(":")
        if not port.isdigit():
            found.append((entry, BrokerUnavailable(f"kafka.bootstrap_servers entry {entry!r} is not host:port")))
            continue
        try:
            found.append((entry, _probe_server(kafka, host.strip("[]"), int(port), timeout_s)))
        except KmqError as exc:  # a ConfigError from the TLS context, AuthenticationFailed from the token source
            found.append((entry, exc))
    return found


def refused_everywhere(kafka: KafkaConfig, timeout_s: float = _REFUSAL_WAIT_S) -> BrokerUnavailable | None:
    """The "nothing answers" error when every bootstrap server refuses the TCP connection or has a
    name that does not resolve, found in milliseconds; None when any server accepts a connection,
    or is slow to answer (then the client's own timeout and :func:`diagnose` decide). For one-shot
    commands: the clients retry a refused connection until ``kafka.connect_timeout``."""
    causes: list[str] = []
    for entry in kafka.servers:
        host, _, port = entry.rpartition(":")
        if not port.isdigit():
            return None  # reported by the client's own checks
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        except socket.gaierror as exc:
            causes.append(f"cannot resolve {host}: {exc.strerror}")
        except ConnectionRefusedError:
            causes.append(f"connection refused by {entry}")
        except OSError:
            return None
        else:
            sock.close()
            return None
    return unreachable(kafka, cause="; ".join(causes)) if causes else None


def diagnose(kafka: KafkaConfig, timeout_s: float, cause: object = None) -> KmqError:
    """The most specific error for a client that could not connect within ``timeout_s``."""
    step = min(_STEP_TIMEOUT_S, max(timeout_s, 0.5))
    first_unreachable: KmqError | None = None
    for _, found in probe(kafka, step):
        if found is None:
            continue
        if type(found) is not BrokerUnavailable:
            return found
        first_unreachable = first_unreachable or found
    if first_unreachable is not None:
        return first_unreachable
    # Every bootstrap server answers at the TCP, TLS and Kafka level: what failed came later.
    # A PLAIN or SCRAM login was tried above and accepted; other mechanisms were not tried.
    sasl = (f" the SASL {kafka.sasl_mechanism} login did not complete (check its credentials), or"
            if kafka.sasl_mechanism and not _logs_in_with_password(kafka) else "")
    return BrokerUnavailable(
        f"Kafka at {kafka.bootstrap_servers} answers, but the client could not connect within {timeout_s:g}s"
        f"{f' ({cause})' if cause else ''}:{sasl} the brokers' advertised listeners are not reachable from here; "
        "run with -v to see the Kafka client's log"
    )
