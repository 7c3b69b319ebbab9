"""Helpers to write marker workloads with explicit record timestamps."""

from __future__ import annotations

from kmq.core import markers as mk
from kmq.client.kafka_python.clients import producer


def write_records(cfg, topic: str, records: list[tuple[int, int, bytes | None, bytes | None]],
                  one_per_batch: bool = False) -> None:
    """``records``: (partition, timestamp_ms, key, value) in the order they must land.

    ``one_per_batch``: each record in its own produce request, so the embedded broker's
    latest-offset look-ups (tests.helpers.kafka.LATEST_OFFSET_GAP) are right, which Spark's
    Kafka connector plans with; valid on every Kafka."""
    p = producer(cfg.kafka)
    try:
        futures = []
        for part, ts, k, v in records:
            futures.append(p.send(topic, key=k, value=v, partition=part, timestamp_ms=ts))
            if one_per_batch:
                p.flush()
        p.flush()
        for f in futures:
            f.get(timeout=30)
    finally:
        p.close()


def rec(partition: int, ts: int, marker) -> tuple[int, int, bytes, bytes]:
    return (partition, ts, mk.encode_key(partition), mk.encode(marker))
