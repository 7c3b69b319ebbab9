"""observe_many: one update that reads the same as n observes (the tracker's redelivery delays)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from kmq.telemetry.metrics import LATENCY_BUCKETS, observe_many


def _samples(h: Histogram) -> dict:
    return {(s.name, s.labels.get("le")): s.value for m in h.collect() for s in m.samples if not s.name.endswith("_created")}


@pytest.mark.parametrize("amount", [0.0, 0.001, 0.0031, 0.2, 7.5, 31.0])
def test_observe_many_reads_as_n_observes(amount):
    one, many = (Histogram("h", "h", buckets=LATENCY_BUCKETS, registry=CollectorRegistry()) for _ in range(2))
    for _ in range(37):
        one.observe(amount)
    observe_many(many, amount, 37)
    got, want = _samples(many), _samples(one)
    assert got.pop(("h_sum", None)) == pytest.approx(want.pop(("h_sum", None)))  # one product, not 37 additions
    assert got == want  # every bucket and the count


def test_observe_many_of_nothing_changes_nothing():
    h = Histogram("h", "h", registry=CollectorRegistry())
    before = _samples(h)
    observe_many(h, 1.0, 0)
    assert _samples(h) == before


def test_a_histogram_of_another_layout_is_observed_one_by_one():
    class Plain:
        def __init__(self):
            self.seen = []

        def observe(self, amount):
            self.seen.append(amount)

    p = Plain()
    observe_many(p, 0.5, 3)
    assert p.seen == [0.5, 0.5, 0.5]
