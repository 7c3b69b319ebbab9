"""The lag job's Prometheus metrics: per-window counts add up in counters (each batch
once), ack latency is a cumulative histogram, levels are gauges of the newest window."""

from __future__ import annotations

from prometheus_client import generate_latest

from kmq.core.lag_state import LATENCY_BUCKETS_MS, PartitionLagState
from kmq.spark.sinks import LagJobMetrics


def window_rows(queue: str = "orders") -> list[dict]:
    st = PartitionLagState(0, 10_000)
    st.apply(0, 1_000, "START", [(0, 10)])
    st.apply(1, 1_300, "END", [(0, 4)])      # 4 acks after 300 ms
    st.apply(2, 3_000, "END", [(4, 2)])      # 2 acks after 2000 ms
    st.apply(3, 9_000, "CLOSED", [(6, 1)], outcome=1)
    closed = st.apply(4, 12_000, "END", [(7, 1)])  # next window: 1 ack after 11 s
    closed += st.expire(30_000, 0)
    rows = []
    for w in closed:
        r = w.as_row()
        r["queue"] = queue
        rows.append(r)
    return rows


def sample(m: LagJobMetrics, name: str, **labels) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_counters_add_every_window_and_a_batch_only_once():
    rows = window_rows()
    assert len(rows) == 2
    m = LagJobMetrics()
    assert m.add_batch(rows, 0) is True
    assert sample(m, "kmq_lag_acked_total", queue="orders", partition="0") == 7
    assert sample(m, "kmq_lag_markers_total", queue="orders", partition="0", type="END") == 3
    assert sample(m, "kmq_lag_redeliveries_total", queue="orders", partition="0") == 1
    assert m.add_batch(rows, 0) is False  # a re-run batch id is not counted twice
    assert sample(m, "kmq_lag_acked_total", queue="orders", partition="0") == 7
    assert m.add_batch(rows[:1], 1) is True
    assert sample(m, "kmq_lag_acked_total", queue="orders", partition="0") == 13
    # Levels are the newest window's (rows are applied oldest first).
    assert sample(m, "kmq_lag_in_flight", queue="orders", partition="0") == rows[0]["in_flight"]
    assert sample(m, "kmq_lag_last_batch_id") == 1


def test_ack_latency_is_a_cumulative_histogram_with_exact_sum():
    m = LagJobMetrics()
    m.add_batch(window_rows(), 7)
    labels = {"queue": "orders", "partition": "0"}
    bucket = lambda le: sample(m, "kmq_lag_ack_latency_seconds_bucket", le=le, **labels)  # noqa: E731
    assert bucket("0.2") == 0
    assert bucket("0.5") == 4
    assert bucket("2.0") == 6
    assert bucket("10.0") == 6 and bucket("20.0") == 7
    assert bucket("+Inf") == 7
    assert sample(m, "kmq_lag_ack_latency_seconds_count", **labels) == 7
    assert sample(m, "kmq_lag_ack_latency_seconds_sum", **labels) == 4 * 0.3 + 2 * 2.0 + 11.0
    text = generate_latest(m.registry).decode()
    assert "# TYPE kmq_lag_ack_latency_seconds histogram" in text and "quantile" not in text
    assert "# TYPE kmq_lag_acked_total counter" in text and "# TYPE kmq_lag_in_flight gauge" in text
    assert len(LATENCY_BUCKETS_MS) + 1 == len(window_rows()[0]["ack_latency_buckets"])
