"""librdkafka's errors as kmq's (:mod:`kmq.client.errors`, :mod:`kmq.core.errors`).

A ``confluent_kafka.KafkaError`` carries Kafka's error code (the same numbers as every client,
translated by :func:`kmq.client.errors.produce_error`); negative codes are librdkafka's own.
"""

from __future__ import annotations

from typing import Any

from kmq.client.api import CONFLUENT, require_client
from kmq.client.errors import (
    ACL_CODES,
    ProduceFailed,
    RecordRefused,
    TopicUnknown,
    denied,
    produce_error,
)
from kmq.client.sasl import authentication_failed
from kmq.config import KafkaConfig
from kmq.core.errors import BrokerUnavailable

require_client(CONFLUENT)  # the one clear error when the extra is missing

from confluent_kafka import KafkaError  # noqa: E402

__all__ = ["as_kmq_error", "classify", "client_error"]

_LOCAL: dict[int, type[ProduceFailed]] = {KafkaError._UNKNOWN_TOPIC: TopicUnknown,
                                          KafkaError._UNKNOWN_PARTITION: TopicUnknown,
                                          KafkaError._INVALID_ARG: RecordRefused}
_LOGIN_REFUSED = {KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError.UNSUPPORTED_SASL_MECHANISM,
                  KafkaError._AUTHENTICATION}


def as_kmq_error(err: Any, what: str = "") -> ProduceFailed:
    """kmq's error for a send librdkafka failed with ``err`` (a ``KafkaError``)."""
    code = err.code()
    text = f"{what}{err.str()} ({err.name()})"
    if code < 0:
        return _LOCAL.get(code, ProduceFailed)(text)
    return produce_error(code, text)


def classify(kafka: KafkaConfig, err: Any) -> BrokerUnavailable | None:
    """kmq's error for a refused login or an ACL denial librdkafka reported; None for other errors."""
    code = err.code() if hasattr(err, "code") else None
    if code in _LOGIN_REFUSED:
        return authentication_failed(kafka, err.str())
    if code in ACL_CODES:
        return denied(kafka, ACL_CODES[code], err.str())
    return None


def client_error(kafka: KafkaConfig | None, exc: BaseException, what: str) -> BrokerUnavailable:
    """kmq's error for confluent-kafka's ``exc`` (a ``KafkaException``) while doing ``what``: the
    refused-login or ACL error (:func:`classify`, when the client's settings ``kafka`` are known),
    else :class:`~kmq.core.errors.BrokerUnavailable` naming ``what`` and librdkafka's error."""
    err: Any = exc.args[0] if exc.args else None
    if not (hasattr(err, "code") and hasattr(err, "str")):
        return BrokerUnavailable(f"{what} failed: {type(exc).__name__}: {exc}")
    found = classify(kafka, err) if kafka is not None else None
    return found or BrokerUnavailable(f"{what} failed: {err.str()} ({err.name()})")
