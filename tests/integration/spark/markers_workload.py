"""Helpers to write marker workloads with explicit record timestamps."""

from __future__ import annotations

from kmq.core import markers as mk
from kmq.client.kafka_python.clients import producer


def write_records(cfg, topic: str, records: list[tuple[int, int, bytes | None, bytes | None]]) -> None:
    """``records``: (partition, timestamp_ms, key, value) in the order they must land."""
    p = producer(cfg.kafka)
    try:
        futures = [p.send(topic, key=k, value=v, partition=part, timestamp_ms=ts) for part, ts, k, v in records]
        p.flush()
        for f in futures:
            f.get(timeout=30)
    finally:
        p.close()


def rec(partition: int, ts: int, marker) -> tuple[int, int, bytes, bytes]:
    return (partition, ts, mk.encode_key(partition), mk.encode(marker))
