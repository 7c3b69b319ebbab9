"""kafka-python clients built from :class:`~kmq.config.KafkaConfig`.

The one place that turns config into client arguments and turns "cannot
connect" into :class:`~kmq.errors.BrokerUnavailable` with a fix in the
message. Every component (consumer, tracker, CLI) builds its clients here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaConnectionError, KafkaTimeoutError

from kmq.config import KafkaConfig
from kmq.errors import BrokerUnavailable

__all__ = ["admin_client", "producer", "consumer", "unreachable", "broker_errors", "assignors"]

#: Cap of the reconnect backoff (ms), as in the Java clients: work resumes within about a
#: second of a broker's return instead of after kafka-python's default of up to 30 s.
RECONNECT_BACKOFF_MAX_MS = 1000


def unreachable(kafka: KafkaConfig, timeout_s: float | None = None, cause: object = None) -> BrokerUnavailable:
    within = f" within {timeout_s:g}s" if timeout_s else ""
    why = f" ({cause})" if cause else ""
    return BrokerUnavailable(
        f"cannot reach Kafka at {kafka.bootstrap_servers}{within}{why}: is the broker running? "
        "Check kafka.bootstrap_servers (or KMQ_KAFKA__BOOTSTRAP_SERVERS); "
        "`kmq dev broker` starts a local one"
    )


@contextlib.contextmanager
def broker_errors(kafka: KafkaConfig, timeout_s: float | None = None) -> Iterator[None]:
    """Map kafka-python's connection failures to :class:`BrokerUnavailable`."""
    try:
        yield
    except (KafkaConnectionError, KafkaTimeoutError) as exc:
        raise unreachable(kafka, timeout_s, type(exc).__name__) from exc


def admin_client(kafka: KafkaConfig, timeout_s: float | None = None) -> KafkaAdminClient:
    timeout_s = timeout_s or kafka.connect_timeout
    with broker_errors(kafka, timeout_s):
        return KafkaAdminClient(bootstrap_timeout_ms=int(timeout_s * 1000), **kafka.client_kwargs(), request_timeout_ms=int(timeout_s * 1000))


def producer(kafka: KafkaConfig, timeout_s: float | None = None, **overrides: Any) -> KafkaProducer:
    """Idempotent, acks=all producer (what markers and redeliveries need)."""
    timeout_s = timeout_s or kafka.connect_timeout
    kw: dict[str, Any] = {
        **kafka.client_kwargs(),
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
    with broker_errors(kafka, timeout_s):
        return KafkaProducer(**kw)


def consumer(kafka: KafkaConfig, *topics: str, timeout_s: float | None = None, **overrides: Any) -> KafkaConsumer:
    timeout_s = timeout_s or kafka.connect_timeout
    kw: dict[str, Any] = {
        **kafka.client_kwargs(),
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
    with broker_errors(kafka, timeout_s):
        return KafkaConsumer(*topics, **kw)


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
