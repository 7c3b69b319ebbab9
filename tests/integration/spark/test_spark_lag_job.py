"""The lag job against a known marker workload: every output figure is checked."""

from __future__ import annotations

import json
import urllib.request

import pytest

from kmq.spark.job import JobOptions, start
from kmq.spark.sinks import BatchSinks, parquet_rows
from tests.helpers.kafka import LATEST_OFFSET_GAP, read_all, wait_until
from tests.integration.spark.conftest import SOURCES
from tests.integration.spark.lag_workload import W, commit_tracker_offset, expected, strip_keys, workload
from tests.integration.spark.markers_workload import write_records

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@SOURCES
def test_job_output_equals_ground_truth(spark, queue_topics, bootstrap, tmp_path, source, kafka_broker):
    cfg, q = queue_topics(partitions=2)
    # On the embedded broker Spark's connector needs each record in its own batch (LATEST_OFFSET_GAP);
    # test_spark_connector_reads_batched_writes_to_the_end covers batched writes on Kafka.
    write_records(cfg, q.markers_topic, workload(), one_per_batch=source == "kafka" and kafka_broker.is_tansu)
    commit_tracker_offset(cfg, q.markers_topic, 0, 5)
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
        assert strip_keys(got[key], exp) == exp, key
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
        assert strip_keys(v, exp) == exp

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
    commit_tracker_offset(cfg, q.markers_topic, 0, 5)
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
    assert {k: strip_keys(got[k], exp) for k, exp in want.items() if k in got} == want
