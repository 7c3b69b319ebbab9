"""The lag job against a known marker workload: every output figure is checked."""

from __future__ import annotations

import json
import urllib.request

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from kmq.client.kafka_python.settings import client_kwargs
from kmq.core import markers as mk
from kmq.spark.job import JobOptions, start
from kmq.spark.sinks import BatchSinks, parquet_rows
from tests.helpers.kafka import LATEST_OFFSET_GAP, read_all, wait_until
from tests.integration.spark.conftest import SOURCES
from tests.integration.spark.markers_workload import rec, write_records
from tests.helpers.kafka import recent_ms

pytestmark = [pytest.mark.spark, pytest.mark.integration]

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


def _commit_tracker_offset(cfg, topic: str, partition: int, offset: int) -> None:
    c = KafkaConsumer(**client_kwargs(cfg.kafka), group_id=cfg.tracker.group_id, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, partition)
        c.assign([tp])
        c.commit({tp: OffsetAndMetadata(offset, "", -1)})
    finally:
        c.close()


def _strip(row: dict, keys) -> dict:
    return {k: row[k] for k in keys}


@SOURCES
def test_job_output_equals_ground_truth(spark, queue_topics, bootstrap, tmp_path, source, kafka_broker):
    cfg, q = queue_topics(partitions=2)
    # On the embedded broker Spark's connector needs each record in its own batch (LATEST_OFFSET_GAP);
    # test_spark_connector_reads_batched_writes_to_the_end covers batched writes on Kafka.
    write_records(cfg, q.markers_topic, workload(), one_per_batch=source == "kafka" and kafka_broker.is_tansu)
    _commit_tracker_offset(cfg, q.markers_topic, 0, 5)
    opts = JobOptions(
        source=source, sinks=("topic", "prometheus", "parquet"), checkpoint=str(tmp_path / "ck"), trigger="500 milliseconds",
        window_s=W / 1000, idle_close_s=1.0, parquet_path=str(tmp_path / "pq"), prometheus_port=0,
        prometheus_host="127.0.0.1", max_offsets_per_trigger=7,  # several batches: state must carry over
    )
    sinks = BatchSinks.from_options(spark, cfg, opts)
    query, _ = start(spark, cfg, opts, sinks)
    try:
        want = expected(q.name)
        wait_until(lambda: sinks.windows_written >= len(want), timeout=90, what="three window rows in every sink")
        rows = parquet_rows(opts.parquet_path)
        body = urllib.request.urlopen(f"http://127.0.0.1:{sinks.http_port}/metrics", timeout=5).read().decode()
    finally:
        query.stop()
        sinks.close()
    assert query.exception() is None
    got = {(r["partition"], int(r["window_start"].timestamp() * 1000)): r for r in rows}
    assert len(rows) == len(got) == len(want), rows
    for key, exp in want.items():
        assert _strip(got[key], exp) == exp, key
        assert int(got[key]["window_end"].timestamp() * 1000) == key[1] + W

    # The metrics topic holds the same figures, keyed by partition and window.
    recs = read_all(bootstrap, q.metrics_topic, expect=len(want))
    by_key = {}
    for r in recs:
        v = json.loads(r.value)
        by_key.setdefault(r.key.decode(), []).append(v)
    assert set(by_key) == {f"{p}:{w}" for p, w in want}
    for (p, w), exp in want.items():
        (v,) = by_key[f"{p}:{w}"]
        assert _strip(v, exp) == exp

    # Prometheus shows the newest window of each partition.
    labels = f'partition="0",queue="{q.name}"'
    assert f"kmq_lag_in_flight{{{labels}}} 63.0" in body
    assert f"kmq_lag_marker_lag{{{labels}}} 8.0" in body
    m = sinks.metrics
    assert m.in_flight.labels(q.name, "0")._value.get() == 63
    assert m.oldest.labels(q.name, "0")._value.get() == (2 * W - 100) / 1000
    assert m.marker_lag.labels(q.name, "0")._value.get() == 8
    assert m.bad_markers.labels(q.name, "1")._value.get() == 4
    # Counters add every window: partition 0's two windows, not just the newest.
    assert f'kmq_lag_acked_total{{{labels}}} 90.0' in body
    assert f'kmq_lag_markers_total{{{labels},type="START"}} 3.0' in body
    assert f'kmq_lag_redeliveries_total{{{labels}}} 5.0' in body
    # Ack latency is a histogram: partition 1's 10 acks took 400 ms each.
    p1 = f'partition="1",queue="{q.name}"'
    assert f'kmq_lag_ack_latency_seconds_bucket{{le="0.2",{p1}}} 0.0' in body
    assert f'kmq_lag_ack_latency_seconds_bucket{{le="0.5",{p1}}} 10.0' in body
    assert f'kmq_lag_ack_latency_seconds_bucket{{le="+Inf",{p1}}} 10.0' in body
    assert f'kmq_lag_ack_latency_seconds_count{{{p1}}} 10.0' in body
    assert f'kmq_lag_ack_latency_seconds_sum{{{p1}}} 4.0' in body
    assert "quantile" not in body


def test_spark_connector_reads_batched_writes_to_the_end(spark, queue_topics, tmp_path, skip_on_tansu):
    """The ground truth again, on Spark's connector, with the markers written as they are in
    production: many records a produce batch."""
    skip_on_tansu(LATEST_OFFSET_GAP)
    cfg, q = queue_topics(partitions=2)
    write_records(cfg, q.markers_topic, workload())
    _commit_tracker_offset(cfg, q.markers_topic, 0, 5)
    opts = JobOptions(source="kafka", sinks=("parquet",), checkpoint=str(tmp_path / "ck"), trigger="500 milliseconds",
                      window_s=W / 1000, idle_close_s=1.0, parquet_path=str(tmp_path / "pq"), prometheus_port=None)
    sinks = BatchSinks.from_options(spark, cfg, opts)
    query, _ = start(spark, cfg, opts, sinks)
    want = expected(q.name)
    try:
        wait_until(lambda: sinks.windows_written >= len(want), timeout=90, what="three window rows")
        rows = parquet_rows(opts.parquet_path)
    finally:
        query.stop()
        sinks.close()
    got = {(r["partition"], int(r["window_start"].timestamp() * 1000)): r for r in rows}
    assert {k: _strip(got[k], exp) for k, exp in want.items() if k in got} == want
