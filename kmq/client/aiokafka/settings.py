"""aiokafka's keyword arguments from kmq's ``kafka`` settings and kmq's client setting names."""

from __future__ import annotations

from typing import Any, Mapping

from kmq.client.overrides import CONSUMER, PRODUCER, native
from kmq.client.secrets import key_password, sasl_password
from kmq.config import KafkaConfig
from kmq.core.errors import ConfigError

__all__ = ["common", "producer_settings", "consumer_settings"]

#: kafka-python keywords (what :func:`kmq.client.overrides.native` gives) -> aiokafka's; the rest has
#: no aiokafka counterpart (aiokafka's producer has no delivery timeout: a send is answered within
#: its request timeout and retries).
_PRODUCER_KEYS = {"linger_ms": "linger_ms", "request_timeout_ms": "request_timeout_ms",
                  "retry_backoff_ms": "retry_backoff_ms", "batch_size": "max_batch_size",
                  "compression_type": "compression_type", "max_request_size": "max_request_size"}
_CONSUMER_KEYS = {"group_instance_id", "fetch_max_wait_ms", "metadata_max_age_ms", "max_poll_interval_ms",
                  "max_partition_fetch_bytes", "fetch_max_bytes", "max_poll_records"}


def common(kafka: KafkaConfig) -> dict[str, Any]:
    """Connection settings every aiokafka client of ``kafka`` takes."""
    kw: dict[str, Any] = {"bootstrap_servers": kafka.bootstrap_servers.split(","), "client_id": kafka.client_id,
                          "security_protocol": kafka.security_protocol,
                          "metadata_max_age_ms": int(kafka.metadata_max_age * 1000)}
    if kafka.security_protocol.startswith("SASL"):
        mech = kafka.sasl_mechanism or "PLAIN"
        if mech not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ConfigError("kafka.sasl_mechanism", f"{mech} is not supported with kafka.client: aiokafka; use "
                              "PLAIN or SCRAM-SHA-256/512, or kafka.client: confluent")
        kw.update(sasl_mechanism=mech, sasl_plain_username=kafka.sasl_username,
                  sasl_plain_password=sasl_password(kafka))
    if kafka.security_protocol.endswith("SSL"):
        from aiokafka.helpers import create_ssl_context

        ctx = create_ssl_context(cafile=kafka.ssl_cafile, certfile=kafka.ssl_certfile, keyfile=kafka.ssl_keyfile,
                                 password=key_password(kafka))
        ctx.check_hostname = kafka.ssl_check_hostname
        kw["ssl_context"] = ctx
    return kw


def producer_settings(kafka: KafkaConfig, timeout_s: float | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """An acks=all producer's settings (``overrides``: kmq's names, :data:`~kmq.client.overrides.PRODUCER`).

    Not idempotent: aiokafka asks for a producer id with InitProducerId v0, which Apache Kafka 4
    and tansu refuse. Its sender keeps one request in flight per partition, so markers still reach
    each partition in the order they were sent; a send retried after a lost answer can write its
    marker twice, as a marker sent again from the retry store can."""
    kw = common(kafka)
    kw.update(acks="all", enable_idempotence=False,
              request_timeout_ms=int((timeout_s or kafka.connect_timeout) * 1000))
    for key, value in native(overrides, PRODUCER, "kafka-python").items():
        if key in _PRODUCER_KEYS:
            kw[_PRODUCER_KEYS[key]] = value
    if kw.get("compression_type") == "none":
        kw["compression_type"] = None
    return kw


def consumer_settings(kafka: KafkaConfig, group_id: str, max_records: int,
                      overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A group member's settings: auto-commit off, earliest, kmq's session timing (``overrides``:
    kmq's names, :data:`~kmq.client.overrides.CONSUMER`)."""
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    kw = common(kafka)
    # kmq's RANGE pair (kafka-python's, confluent's range,roundrobin): a group may mix clients.
    kw["partition_assignment_strategy"] = (RangePartitionAssignor, RoundRobinPartitionAssignor)
    kw.update(group_id=group_id, enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=max_records,
              session_timeout_ms=int(kafka.session_timeout * 1000),
              heartbeat_interval_ms=int(kafka.heartbeat_interval * 1000),
              request_timeout_ms=max(int(kafka.connect_timeout * 1000), int(kafka.session_timeout * 1000) + 1000))
    for key, value in native(overrides, CONSUMER, "kafka-python").items():
        if key in _CONSUMER_KEYS:
            kw[key] = value
    return kw
