"""kafka-python clients built from :class:`~kmq.config.KafkaConfig`.

Client arguments come from :mod:`kmq.client.kafka_python.settings` (TLS context,
SASL, OAUTHBEARER token provider); this module turns "cannot connect" into one clear
error: :class:`~kmq.core.errors.BrokerUnavailable` when nothing answers, or the
subclass that names what failed (TLS handshake, certificate, authentication,
authorization; see :mod:`kmq.client.diagnose`). Every component (consumer, tracker,
CLI, Spark driver) builds its clients here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import codec
from kafka.errors import (
    AuthorizationError,
    KafkaConnectionError,
    KafkaTimeoutError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)

from kmq.config import KafkaConfig
from kmq.client.diagnose import diagnose, unreachable
from kmq.client.errors import ProduceFailed, denied
from kmq.client.sasl import authentication_failed
from kmq.client.kafka_python.group_join import keep_finished_joins
from kmq.client.kafka_python.grown_partitions import GrowingTopicsProducer
from kmq.client.kafka_python.settings import client_kwargs, passthrough
from kmq.core.errors import AuthorizationFailed, BrokerUnavailable, ClientNotInstalled

__all__ = [
    "admin_client", "producer", "close_producer", "consumer",
    "unreachable", "broker_errors", "classify", "authentication_failed", "authorization_failed", "assignors",
    "require_codecs",
]

#: Cap of the reconnect backoff (ms), as in the Java clients: work resumes within about a
#: second of a broker's return instead of after kafka-python's default of up to 30 s.
RECONNECT_BACKOFF_MAX_MS = 1000


def authorization_failed(kafka: KafkaConfig, exc: AuthorizationError) -> AuthorizationFailed:
    return denied(kafka, type(exc).__name__.replace("AuthorizationFailedError", "").lower() or "operation", str(exc))


def classify(kafka: KafkaConfig, exc: BaseException) -> BrokerUnavailable | None:
    """kmq's error for a refused login or an ACL denial raised by kafka-python mid-run; None for other errors."""
    if isinstance(exc, (SaslAuthenticationFailedError, UnsupportedSaslMechanismError)):
        return authentication_failed(kafka, exc)
    if isinstance(exc, AuthorizationError):
        return authorization_failed(kafka, exc)
    return None


def client_error(kafka: KafkaConfig | None, exc: BaseException, what: str) -> BrokerUnavailable:
    """kmq's error for kafka-python's ``exc`` while doing ``what``: the refused-login or ACL error
    (:func:`classify`, when the client's settings ``kafka`` are known), else
    :class:`~kmq.core.errors.BrokerUnavailable` naming ``what``."""
    found = classify(kafka, exc) if kafka is not None else None
    return found or BrokerUnavailable(f"{what} failed: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def broker_errors(kafka: KafkaConfig, timeout_s: float | None = None) -> Iterator[None]:
    """Map kafka-python's connection, authentication and ACL failures to kmq's errors.

    A timeout or connection failure is diagnosed (:func:`kmq.client.diagnose.diagnose`)
    so the message names the layer that failed.
    """
    try:
        yield
    except (SaslAuthenticationFailedError, UnsupportedSaslMechanismError) as exc:
        raise authentication_failed(kafka, exc) from exc
    except AuthorizationError as exc:
        raise authorization_failed(kafka, exc) from exc
    except (KafkaConnectionError, KafkaTimeoutError) as exc:
        raise diagnose(kafka, timeout_s or kafka.connect_timeout, type(exc).__name__) from exc


#: Each codec kafka-python needs a library for: its check, and the package (a kmq dependency) that brings it.
_CODEC_LIBRARIES = (("snappy", codec.has_snappy, "python-snappy"), ("lz4", codec.has_lz4, "lz4"),
                    ("zstd", codec.has_zstd, "zstandard"))


def require_codecs() -> None:
    """Raise :class:`~kmq.core.errors.ClientNotInstalled` unless kafka-python can read and write every
    codec Kafka has: without its library, kafka-python fails on the first batch of that codec
    (``UnsupportedCodecError`` from a fetch), long after the start."""
    missing = [(name, package) for name, available, package in _CODEC_LIBRARIES if not available()]
    if missing:
        names = ", ".join(name for name, _ in missing)
        packages = [package for _, package in missing]
        raise ClientNotInstalled(
            f"kafka-python cannot read or write records compressed with {names}: the package(s) "
            f"{', '.join(packages)} (dependencies of kmq) are missing; run pip install {' '.join(packages)}, "
            "or set kafka.client: confluent (KMQ_KAFKA__CLIENT)"
        )


def admin_client(kafka: KafkaConfig, timeout_s: float | None = None) -> KafkaAdminClient:
    timeout_s = timeout_s or kafka.connect_timeout
    kw = client_kwargs(kafka)
    with broker_errors(kafka, timeout_s):
        return KafkaAdminClient(**{"bootstrap_timeout_ms": int(timeout_s * 1000), **kw,
                                   "request_timeout_ms": int(timeout_s * 1000), **passthrough(kafka, KafkaAdminClient)})


def producer(kafka: KafkaConfig, timeout_s: float | None = None, **overrides: Any) -> KafkaProducer:
    """Idempotent, acks=all producer (what markers and redeliveries need)."""
    timeout_s = timeout_s or kafka.connect_timeout
    kw: dict[str, Any] = {
        **client_kwargs(kafka),
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 5,
        "request_timeout_ms": int(timeout_s * 1000),
        "max_block_ms": int(timeout_s * 1000),
        "bootstrap_timeout_ms": int(timeout_s * 1000),
        "retries": 5,
        # kafka-python's default lets the reconnect backoff grow to 30 s, so after a broker
        # outage of that length clients idled up to 30 s more (Java clients cap it at 1 s).
        "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
    }
    kw.update(overrides)
    kw.update(passthrough(kafka, KafkaProducer))
    if kw.get("compression_type") == "none":  # queues[].compression's name for kafka-python's None
        kw["compression_type"] = None
    require_codecs()
    with broker_errors(kafka, timeout_s):
        return GrowingTopicsProducer(**kw)


def close_producer(producer: KafkaProducer, timeout: float = 5.0) -> None:
    """Close ``producer`` within about ``timeout`` seconds even when records are still
    pending (broker down). kafka-python's ``close(timeout)`` raises from its flush in
    that case and leaves its I/O thread running; this force-closes it instead (the
    pending records fail, and their callbacks say so) and leaves it closed for good."""
    try:
        producer.close(timeout=timeout)
        return
    except (KafkaTimeoutError, ProduceFailed):  # its flush timed out (ProduceFailed: kmq's producer's flush)
        pass
    sender = getattr(producer, "_sender", None)  # kafka-python internals: only here, behind this seam
    if sender is not None:
        sender.force_close()
        sender.join(timeout)
    with contextlib.suppress(Exception):
        producer.close(timeout=0)
    if getattr(producer, "_closed", True) is False:
        # close(0) raised from its flush before marking the producer closed (the sender was still
        # stopping); left so, kafka-python's __del__ would flush it again for 1 s and print the
        # timeout as an "Exception ignored" traceback. The stopped sender fails what is pending.
        producer._closed = True


def consumer(kafka: KafkaConfig, *topics: str, timeout_s: float | None = None, **overrides: Any) -> KafkaConsumer:
    timeout_s = timeout_s or kafka.connect_timeout
    kw: dict[str, Any] = {
        **client_kwargs(kafka),
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "request_timeout_ms": max(int(timeout_s * 1000), int(kafka.session_timeout * 1000) + 1000),
        "bootstrap_timeout_ms": int(timeout_s * 1000),
        "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
    }
    if overrides.get("group_id"):
        kw["session_timeout_ms"] = int(kafka.session_timeout * 1000)
        kw["heartbeat_interval_ms"] = int(kafka.heartbeat_interval * 1000)
    kw.update(overrides)
    kw.update(passthrough(kafka, KafkaConsumer))
    require_codecs()
    with broker_errors(kafka, timeout_s):
        made = KafkaConsumer(*topics, **kw)
    if kw.get("group_id"):
        keep_finished_joins(made)
    return made


def assignors(name: str) -> tuple:
    """kafka-python assignor classes for ``consumer.assignor`` (``COOPERATIVE-STICKY`` or ``RANGE``)."""
    if name.upper() == "COOPERATIVE-STICKY":
        from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

        return (CooperativeStickyAssignor,)
    # kafka-python's own default pair: a group may mix KmqConsumers with plain kafka-python
    # loops (MarkerWriter) and workers of older kmq versions.
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    return (RangePartitionAssignor, RoundRobinPartitionAssignor)
