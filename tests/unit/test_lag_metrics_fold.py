"""The Prometheus sink folds a batch's windows per partition: the same metrics as adding
the windows one by one."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from kmq.core.lag_state import LATENCY_BUCKETS_MS, MARKER_TYPES, WindowStats
from kmq.spark.sinks import LagJobMetrics


def _rows(rng: random.Random, n: int) -> list[dict]:
    out = []
    for i in range(n):
        w = WindowStats(rng.randrange(3), i * 1000, i * 1000 + 1000)
        for t in MARKER_TYPES:
            w.markers[t] = rng.randrange(5)
        w.bad_markers, w.acked, w.late_acks = rng.randrange(2), rng.randrange(50), rng.randrange(3)
        w.redeliveries, w.dead_letters, w.missing = rng.randrange(3), rng.randrange(2), rng.randrange(2)
        w.ack_latency_buckets = [rng.randrange(4) for _ in range(len(LATENCY_BUCKETS_MS) + 1)]
        w.ack_latency_sum_ms = rng.randrange(10_000)
        w.in_flight, w.oldest_in_flight_ms = rng.randrange(100), rng.choice([None, rng.randrange(5000)])
        row = w.as_row()
        row.update(queue=rng.choice(["a", "b"]), marker_lag=rng.randrange(9))
        out.append(row)
    rng.shuffle(out)
    return out


def _samples(m: LagJobMetrics) -> dict:
    """Every kmq sample by name and labels (creation times left out: they differ by design)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in m.registry.collect() for s in fam.samples
            if s.name.startswith("kmq_lag_") and not s.name.endswith("_created")}


def test_folded_batch_gives_the_same_metrics_as_window_by_window():
    rows = _rows(random.Random(3), 300)
    folded = LagJobMetrics(CollectorRegistry())
    assert folded.add_batch([dict(r) for r in rows], batch_id=0)
    one_by_one = LagJobMetrics(CollectorRegistry())
    for r in sorted(rows, key=lambda r: r["window_end_ms"]):
        one_by_one.update(r)
    one_by_one.last_batch.set(0)
    assert _samples(folded) == pytest.approx(_samples(one_by_one))
    assert len(_samples(folded)) > 200
    assert not folded.add_batch(rows, batch_id=0)  # a re-run batch is not added twice
