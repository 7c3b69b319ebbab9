"""The task side of the ``kmq-kafka`` Spark source on confluent-kafka (option ``kafka.client=confluent``).

Reads one planned offset range of one partition with librdkafka: records
are parsed in C, which lifts the source above kafka-python's parsing cost
(about 20 us a record). Planning (partitions, high-water marks) stays with
the driver's kafka-python client in :mod:`kmq.spark.source`; only the record
reads, the hot path, change. An offset below the log start is reported, not
silently skipped (``auto.offset.reset: error``), and handled as the
kafka-python path does (``failOnDataLoss``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterator

import pyarrow as pa

from kmq.config import KafkaConfig
from kmq.spark.arrow_rows import ARROW_SCHEMA, ROWS_PER_ARROW_BATCH

__all__ = ["read_partition_confluent", "close_cached_consumer"]

log = logging.getLogger(__name__)

_CONSUMERS: dict[str, Any] = {}
_BATCH = 10_000


def _consumer(client_json: str):
    """One cached librdkafka consumer per Python worker process and client configuration."""
    c = _CONSUMERS.get(client_json)
    if c is None:
        import confluent_kafka as ck

        from kmq.client.confluent.settings import settings

        kafka = KafkaConfig.from_json(client_json)
        c = ck.Consumer({
            **settings(kafka),
            "group.id": f"{kafka.client_id}-source",  # required by librdkafka; never joined, never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 100,
            "max.partition.fetch.bytes": 1024 * 1024,
            "fetch.max.bytes": 8 * 1024 * 1024,
            # librdkafka prefetches up to this much past the task's end offset and drops it at
            # unassign: with a backlog, 64 MB a task was mostly wasted fetching (broker and client).
            "queued.max.messages.kbytes": 4 * 1024,
            # Resume within about a second of a broker's return (librdkafka's default: up to 10 s).
            "reconnect.backoff.max.ms": 1000,
        })
        _CONSUMERS[client_json] = c
    return c


def close_cached_consumer(client_json: str) -> None:
    """Close this process's cached consumer for ``client_json``, if it has one (see
    :func:`kmq.spark.source.close_task_consumers`)."""
    c = _CONSUMERS.pop(client_json, None)
    if c is not None:
        c.close()


def read_partition_confluent(part, arrow, source_error, data_loss_error) -> Iterator[pa.RecordBatch]:
    """Records ``part.start..part.end-1`` as Arrow batches (``arrow(cols, part)`` builds one)."""
    from confluent_kafka import KafkaError, TopicPartition


    c = _consumer(part.client_json)
    tp = TopicPartition(part.topic, part.partition, part.start)
    c.assign([tp])
    names = ARROW_SCHEMA.names
    cols: dict[str, list] = {n: [] for n in names}
    keys, values, offs, stamps, kinds, hdrs = (cols["key"], cols["value"], cols["offset"], cols["timestamp"],
                                               cols["timestampType"], cols["headers"])
    with_headers = getattr(part, "include_headers", True)
    position = part.start
    last_progress = time.monotonic()
    try:
        while position < part.end:
            msgs = c.consume(_BATCH, 0.2)
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        position = _skip_deleted(c, part, position, source_error, data_loss_error)
                        break
                    if err.fatal():
                        raise source_error(f"{part.topic}[{part.partition}]: {err.str()}")
                    continue
                off = m.offset()
                if off >= part.end:
                    position = part.end
                    break
                kind, ts = m.timestamp()
                keys.append(m.key())
                values.append(m.value())
                offs.append(off)
                stamps.append(ts * 1000)
                kinds.append(kind - 1 if kind > 0 else -1)  # librdkafka: 1 create, 2 log-append; Kafka: 0, 1
                if with_headers:
                    h = m.headers()
                    hdrs.append([{"key": k, "value": v} for k, v in h] if h else [])
                position = off + 1
            if msgs:
                last_progress = time.monotonic()
            if len(offs) >= ROWS_PER_ARROW_BATCH:
                yield arrow(cols, part)
                cols = {n: [] for n in names}
                keys, values, offs, stamps, kinds, hdrs = (cols["key"], cols["value"], cols["offset"],
                                                           cols["timestamp"], cols["timestampType"], cols["headers"])
            if position < part.end and time.monotonic() - last_progress > part.poll_timeout_ms / 1000:
                raise source_error(
                    f"{part.topic}[{part.partition}]: no records for {part.poll_timeout_ms} ms at offset {position}, "
                    f"expected up to {part.end - 1}; is the broker reachable?"
                )
    finally:
        c.unassign()
    if offs:
        yield arrow(cols, part)


def _skip_deleted(c, part, position: int, source_error, data_loss_error) -> int:
    from confluent_kafka import TopicPartition

    earliest, _ = c.get_watermark_offsets(TopicPartition(part.topic, part.partition), timeout=10)
    if earliest <= position:
        raise source_error(
            f"{part.topic}[{part.partition}]: offset {position} is out of range although the log starts at "
            f"{earliest}: was the topic deleted and recreated? Restart the job with a new checkpoint"
        )
    if part.fail_on_data_loss:
        raise data_loss_error(
            f"{part.topic}[{part.partition}]: offsets {position}..{earliest - 1} were deleted (retention) "
            "before the job read them; set failOnDataLoss=false to skip them, or restart with a new checkpoint"
        )
    log.warning("%s[%d]: skipping deleted offsets %d..%d", part.topic, part.partition, position, earliest - 1)
    c.assign([TopicPartition(part.topic, part.partition, earliest)])
    return earliest
