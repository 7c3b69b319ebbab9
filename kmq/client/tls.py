"""The TLS context kmq's Kafka clients use, built once from :class:`~kmq.config.KafkaConfig`.

kmq builds the :class:`ssl.SSLContext` itself and hands it to kafka-python
(``ssl_context=``) so that a bad client key or key password fails at start
with the key's path, instead of as endless reconnects, and so that the
connection check (:mod:`kmq.client.diagnose`) tests exactly what the clients use.
"""

from __future__ import annotations

import ssl

from kmq.client.secrets import key_password
from kmq.config import KafkaConfig
from kmq.core.errors import ConfigError

__all__ = ["ssl_context"]


def ssl_context(kafka: KafkaConfig) -> ssl.SSLContext:
    """Verify the broker against ``ssl_cafile`` (else the system CAs); present the client certificate if set."""
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=kafka.ssl_cafile)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError("kafka.ssl_cafile", f"cannot load CA certificates from {kafka.ssl_cafile}: {_why(exc)}") from exc
    ctx.check_hostname = kafka.ssl_check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED  # an unverified broker would defeat the point of TLS
    if kafka.ssl_certfile:
        password = key_password(kafka)
        try:
            # A callable, so an encrypted key without a password fails here instead of prompting on a tty.
            ctx.load_cert_chain(kafka.ssl_certfile, kafka.ssl_keyfile, password=lambda: password or "")
        except (ssl.SSLError, OSError) as exc:
            if password is None and kafka.ssl_keyfile:
                key, hint = "kafka.ssl_keyfile", ("not a PEM key that matches the certificate, or encrypted "
                                                  "(set KMQ_KAFKA__SSL_PASSWORD or kafka.ssl_password_file)")
            elif password is not None:
                key = "kafka.ssl_password" if kafka.ssl_password is not None else "kafka.ssl_password_file"
                hint = "wrong key password, or the key does not match the certificate"
            else:
                key, hint = "kafka.ssl_certfile", "not a PEM certificate with its key (set kafka.ssl_keyfile if the key is in another file)"
            raise ConfigError(key, f"cannot load the client certificate {kafka.ssl_certfile}: {hint} ({_why(exc)})") from exc
    return ctx


def _why(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
