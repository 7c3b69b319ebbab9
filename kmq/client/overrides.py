"""The client settings kmq's own code passes at the seam, in kmq's names, and each client's name for them.

:func:`kmq.client.factory.producer`, :func:`~kmq.client.factory.group_consumer` and
:func:`~kmq.client.factory.open_log_reader` take ``overrides`` named here (durations in seconds,
as in kmq.yaml); :func:`native` turns them into the chosen client's own settings, kafka-python's
keyword arguments or librdkafka's properties. A setting one client has no counterpart for is left
out on that client. The users' own pass-through (``kafka.kafka_python``, ``kafka.confluent``) is
not this: it takes each client's names as they are. Pure.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from kmq.client.api import CONFLUENT

__all__ = ["Setting", "PRODUCER", "CONSUMER", "native"]


class Setting(NamedTuple):
    """One client setting: its kafka-python keyword, its librdkafka property (None: that client has
    none), and whether kmq gives it in seconds (the clients take milliseconds)."""

    kafka_python: str | None
    librdkafka: str | None
    seconds: bool = False


#: Producer settings (besides kmq's fixed acks=all and idempotence).
PRODUCER: dict[str, Setting] = {
    "linger": Setting("linger_ms", "linger.ms", True),
    "delivery_timeout": Setting("delivery_timeout_ms", "delivery.timeout.ms", True),
    "request_timeout": Setting("request_timeout_ms", "request.timeout.ms", True),
    "retry_backoff": Setting("retry_backoff_ms", "retry.backoff.ms", True),
    "reconnect_backoff_max": Setting("reconnect_backoff_max_ms", "reconnect.backoff.max.ms", True),
    "batch_size": Setting("batch_size", "batch.size"),
    "compression": Setting("compression_type", "compression.type"),  # a queues[].compression value
    "max_request_size": Setting("max_request_size", "message.max.bytes"),
}

#: Consumer settings: group members and log readers.
CONSUMER: dict[str, Setting] = {
    "group_instance_id": Setting("group_instance_id", "group.instance.id"),
    "fetch_wait": Setting("fetch_max_wait_ms", "fetch.wait.max.ms", True),
    # kafka-python's metadata refresh period; librdkafka's metadata.max.age.ms only ages its cache
    "metadata_max_age": Setting("metadata_max_age_ms", "topic.metadata.refresh.interval.ms", True),
    "max_poll_interval": Setting("max_poll_interval_ms", "max.poll.interval.ms", True),
    "max_partition_fetch_bytes": Setting("max_partition_fetch_bytes", "max.partition.fetch.bytes"),
    "fetch_max_bytes": Setting("fetch_max_bytes", "fetch.max.bytes"),
    "reconnect_backoff_max": Setting("reconnect_backoff_max_ms", "reconnect.backoff.max.ms", True),
    "max_poll_records": Setting("max_poll_records", None),  # librdkafka: per call (consume(num_messages))
    "prefetch_max_kbytes": Setting(None, "queued.max.messages.kbytes"),  # kafka-python prefetches one fetch
}


def native(overrides: Mapping[str, Any], table: Mapping[str, Setting], client: str) -> dict[str, Any]:
    """``overrides`` (kmq's names from ``table``) as the settings of ``client``; a name not in ``table``
    raises ``TypeError`` (a bug in kmq's code, not a user's input)."""
    out: dict[str, Any] = {}
    for name, value in overrides.items():
        setting = table.get(name)
        if setting is None:
            raise TypeError(f"{name!r} is no client setting kmq passes; one of {', '.join(sorted(table))}")
        key = setting.librdkafka if client == CONFLUENT else setting.kafka_python
        if key is None or value is None:
            continue
        out[key] = round(value * 1000) if setting.seconds else value
    return out
