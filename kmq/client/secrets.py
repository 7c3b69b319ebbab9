"""The files a client is built with, read where it is built: passwords, the key password, and the
checks of the TLS, password and token files.

:class:`~kmq.config.KafkaConfig` only names the files (and holds a secret from the environment);
the client builders (:mod:`kmq.client.kafka_python.settings`, :mod:`kmq.client.confluent.settings`,
:mod:`kmq.client.tls`, connection diagnosis, the Spark job) call these. A file that is missing or
cannot be read is a :class:`~kmq.core.errors.ConfigError` naming the key and the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from kmq.config import KafkaConfig
from kmq.core.errors import ConfigError

__all__ = ["check_files", "check", "sasl_password", "key_password"]

#: The keys of ``kafka:`` that name a file a client reads.
FILE_KEYS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password_file", "sasl_password_file",
             "sasl_oauth_token_file")


def _check_readable(key: str, name: str | None) -> None:
    if name is None:
        return
    p = Path(name)
    if not p.exists():
        raise ConfigError(key, f"file {name} does not exist")
    if not p.is_file():
        raise ConfigError(key, f"{name} is not a file")
    if not os.access(p, os.R_OK):
        raise ConfigError(key, f"file {name} is not readable by this process (uid {os.getuid()}): check its mode and owner")


def check_files(kafka: KafkaConfig) -> None:
    """Raise :class:`~kmq.core.errors.ConfigError` (the key, the file) unless every file ``kafka``
    names exists and this process may read it."""
    for key in FILE_KEYS:
        _check_readable(f"kafka.{key}", getattr(kafka, key))


def check(kafka: KafkaConfig) -> None:
    """What a client needs before it is built: credentials present
    (:meth:`~kmq.config.KafkaConfig.check_security`) and its files readable (:func:`check_files`)."""
    kafka.check_security()
    check_files(kafka)


def _read(key: str, name: str, what: str) -> str:
    try:
        return Path(name).read_text().strip()
    except OSError as exc:
        raise ConfigError(key, f"cannot read the {what} file {name}: {exc.strerror}") from exc


def sasl_password(kafka: KafkaConfig) -> str | None:
    """The SASL password: ``KMQ_KAFKA__SASL_PASSWORD``, else the content of ``kafka.sasl_password_file``."""
    if kafka.sasl_password is not None:
        return kafka.sasl_password
    if kafka.sasl_password_file:
        return _read("kafka.sasl_password_file", kafka.sasl_password_file, "password")
    return None


def key_password(kafka: KafkaConfig) -> str | None:
    """The client key's password: ``KMQ_KAFKA__SSL_PASSWORD``, else the content of ``kafka.ssl_password_file``."""
    if kafka.ssl_password is not None:
        return kafka.ssl_password
    if kafka.ssl_password_file:
        return _read("kafka.ssl_password_file", kafka.ssl_password_file, "key password")
    return None
