"""The task side of the ``kmq-kafka`` Spark source on confluent-kafka (option ``kafka.client=confluent``).

librdkafka parses records in C, which lifts the source above kafka-python's parsing
cost (about 20 us a record). Where a task reads, where its read ends and what happens
to deleted offsets is the client seam's :class:`~kmq.client.api.LogReader`, the same
for both clients (:func:`kmq.spark.source.read_partition`); this module holds only what
is librdkafka's own: its settings for a task and the loop that turns its messages into
the source's columns.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SETTINGS", "BATCH", "append_columns", "append_marker_columns"]

#: Messages per ``consume`` call of a task's reader.
BATCH = 10_000
#: The settings of a task's reader (kmq's names, :data:`kmq.client.overrides.CONSUMER`).
SETTINGS = {
    "fetch_wait": 0.1,
    "max_partition_fetch_bytes": 1024 * 1024,
    "fetch_max_bytes": 8 * 1024 * 1024,
    # librdkafka prefetches up to this much past the task's end offset and drops it at
    # unassign: with a backlog, 64 MB a task was mostly wasted fetching (broker and client).
    "prefetch_max_kbytes": 4 * 1024,
    # Resume within about a second of a broker's return (librdkafka's default: up to 10 s).
    "reconnect_backoff_max": 1.0,
}


def append_columns(cols: dict[str, list], msgs: list, with_headers: bool) -> None:
    """Append ``confluent_kafka.Message``\\ s (no error events) to the source's column lists."""
    keys, values, offs, stamps, kinds, hdrs = (cols["key"], cols["value"], cols["offset"], cols["timestamp"],
                                               cols["timestampType"], cols["headers"])
    for m in msgs:
        kind, ts = m.timestamp()
        keys.append(m.key())
        values.append(m.value())
        offs.append(m.offset())
        stamps.append(ts * 1000)
        kinds.append(kind - 1 if kind > 0 else -1)  # librdkafka: 1 create, 2 log-append; Kafka: 0, 1
        if with_headers:
            h: Any = m.headers()
            hdrs.append([{"key": k, "value": v} for k, v in h] if h else [])


def append_marker_columns(cols: dict[str, list], msgs: list) -> None:
    """Append only what the lag job's marker chunks use (key, value, offset, time): one pass per
    column in C-level iteration instead of a Python loop body per record, the source's hot path."""
    cols["key"].extend([m.key() for m in msgs])
    cols["value"].extend([m.value() for m in msgs])
    cols["offset"].extend([m.offset() for m in msgs])
    cols["ts_ms"].extend([m.timestamp()[1] for m in msgs])
