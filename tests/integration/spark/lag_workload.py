"""A marker workload with a hand-computed ground truth of the lag job's output, and what a test of it needs."""

from __future__ import annotations

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from kmq.client.kafka_python.settings import client_kwargs
from kmq.core import markers as mk
from tests.helpers.kafka import recent_ms
from tests.integration.spark.markers_workload import rec

T0 = recent_ms()  # a multiple of the 10 s window
W = 10_000


def S(first, count, ts_lease=30_000):
    return mk.Start(ranges=((first, count),), lease_ms=ts_lease, owner="w1")


def workload(p0: int = 0, p1: int = 1):
    """Markers with a hand-computed ground truth (see EXPECTED)."""
    r = [
        # partition 0, window 0
        rec(p0, T0 + 100, S(0, 100)),
        rec(p0, T0 + 200, S(100, 50)),
        rec(p0, T0 + 1100, mk.End(ranges=((0, 40),))),          # 40 acks, 1000 ms
        rec(p0, T0 + 2200, mk.End(ranges=((40, 10),))),         # 10 acks, 2100 ms
        rec(p0, T0 + 3000, mk.Nack(ranges=((50, 5),), delay_ms=0)),
        rec(p0, T0 + 4000, mk.Closed(ranges=((50, 5),), outcome=mk.Outcome.REDELIVERED)),
        rec(p0, T0 + 5000, mk.Reject(ranges=((55, 2),), reason="bad")),
        rec(p0, T0 + 5500, mk.Closed(ranges=((55, 2),), outcome=mk.Outcome.DEAD_LETTERED)),
        rec(p0, T0 + 6000, mk.End(ranges=((0, 3),))),           # 3 late acks
        (p0, T0 + 7000, mk.encode_key(p0), b"\x01\x63"),        # malformed: unknown type
        rec(p0, T0 + 8000, mk.Renew(ranges=((60, 10),), lease_ms=30_000)),
        # partition 0, window 1
        rec(p0, T0 + 12_000, mk.End(ranges=((60, 40),))),       # 40 acks, 11900 ms
        rec(p0, T0 + 15_000, S(150, 10)),
        # partition 1, window 0
        rec(p1, T0 + 500, S(0, 10)),
        rec(p1, T0 + 900, mk.End(ranges=((0, 10),))),           # 10 acks, 400 ms
        (p1, T0 + 950, b"xx", mk.encode(S(20, 1))),             # malformed key
        (p1, T0 + 960, mk.encode_key(p1), mk.encode(S(30, 1))[:-3]),  # truncated
        (p1, T0 + 970, mk.encode_key(p1), None),                # tombstone
        (p1, T0 + 980, mk.encode_key(p1), b"\x02\x01"),         # unknown version
    ]
    return r


def expected(queue: str) -> dict[tuple[int, int], dict]:
    zero = {f"markers_{t}": 0 for t in ("start", "end", "renew", "nack", "reject", "closed")}
    return {
        (0, T0): {**zero, "queue": queue, "markers_start": 2, "markers_end": 3, "markers_renew": 1, "markers_nack": 1,
                  "markers_reject": 1, "markers_closed": 2, "bad_markers": 1, "acked": 50, "late_acks": 3,
                  "redeliveries": 5, "dead_letters": 2, "missing": 0,
                  "in_flight": 93, "oldest_in_flight_ms": W - 100,
                  "ack_p50_ms": 1000, "ack_p95_ms": 5000, "ack_p99_ms": 5000,
                  "markers_high_water": 11, "marker_lag": 11 - 5},
        (0, T0 + W): {**zero, "queue": queue, "markers_start": 1, "markers_end": 1, "bad_markers": 0, "acked": 40,
                      "late_acks": 0, "redeliveries": 0, "dead_letters": 0, "missing": 0,
                      "in_flight": 63, "oldest_in_flight_ms": 2 * W - 100,
                      "ack_p50_ms": 20_000, "ack_p95_ms": 20_000, "ack_p99_ms": 20_000,
                      "markers_high_water": 13, "marker_lag": 13 - 5},
        (1, T0): {**zero, "queue": queue, "markers_start": 1, "markers_end": 1, "bad_markers": 4, "acked": 10,
                  "late_acks": 0, "redeliveries": 0, "dead_letters": 0, "missing": 0,
                  "in_flight": 0, "oldest_in_flight_ms": None,
                  "ack_p50_ms": 500, "ack_p95_ms": 500, "ack_p99_ms": 500,
                  "markers_high_water": 6, "marker_lag": 6},
    }


def commit_tracker_offset(cfg, topic: str, partition: int, offset: int) -> None:
    """Commit ``offset`` of a markers partition for the tracker's group, as a tracker would."""
    c = KafkaConsumer(**client_kwargs(cfg.kafka), group_id=cfg.tracker.group_id, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, partition)
        c.assign([tp])
        c.commit({tp: OffsetAndMetadata(offset, "", -1)})
    finally:
        c.close()


def strip_keys(row: dict, keys) -> dict:
    """``row`` with only ``keys``."""
    return {k: row[k] for k in keys}
