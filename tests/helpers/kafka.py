"""Helpers for integration tests: wait on real conditions, never sleep-and-hope."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from kafka import KafkaConsumer, TopicPartition

T = TypeVar("T")

#: A tansu gap seen after a broker SIGKILL, in its words for a skip.
LATEST_OFFSET_GAP = ("latest-offset look-ups (ListOffsets LATEST, what Spark's Kafka connector plans micro-batches "
                     "with) answer the first offset of the last produced batch plus one, so the connector never "
                     "reads the rest of the last batch")
DUPLICATE_SEQUENCE_GAP = ("after a SIGKILL, an idempotent producer's retry of the batch being written is answered "
                          "DUPLICATE_SEQUENCE_NUMBER (error 46, which Kafka's clients count as delivered) though the "
                          "batch is not in the log; Kafka rebuilds a producer's sequence state from the log itself, "
                          "so there a duplicate is always in the log")


def wait_until(cond: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "condition") -> T:
    """Poll ``cond`` until it returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_for_assignment(consumer: KafkaConsumer, timeout: float = 30.0) -> set[TopicPartition]:
    """Poll until the group assigned partitions. Call it before producing: it does not
    advance positions, but it is meant for empty topics."""

    def assigned():
        if not consumer.assignment():
            consumer.poll(timeout_ms=100, max_records=1, update_offsets=False)
        return consumer.assignment()

    return wait_until(assigned, timeout, what="consumer group assignment")


def read_all(bootstrap: str, topic: str, timeout: float = 10.0, expect: int | None = None) -> list:
    """Every record of ``topic`` from the beginning (no group). Stops when ``expect``
    records were read or when a poll returns nothing after the end of all partitions."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out = []
        deadline = time.monotonic() + timeout
        idle = 0
        while time.monotonic() < deadline:
            batch = c.poll(timeout_ms=200)
            got = [r for recs in batch.values() for r in recs]
            out.extend(got)
            if expect is not None and len(out) >= expect:
                break
            if not got:
                idle += 1
                # End of all partitions: the high-water mark from the last fetch equals the position.
                if expect is None and idle >= 2 and all(
                    c.highwater(tp) is not None and c.position(tp) >= c.highwater(tp) for tp in tps
                ):
                    break
            else:
                idle = 0
        return out
    finally:
        c.close()
