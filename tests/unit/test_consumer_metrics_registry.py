"""Worker metrics go to the application's default Prometheus registry unless told otherwise."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from kmq.telemetry.metrics import ConsumerMetrics


def test_shared_metrics_are_one_set_per_registry_and_the_default_is_prometheus_default():
    assert ConsumerMetrics.shared() is ConsumerMetrics.shared(REGISTRY)
    own = CollectorRegistry()
    assert ConsumerMetrics.shared(own) is ConsumerMetrics.shared(own)
    assert ConsumerMetrics.shared(own) is not ConsumerMetrics.shared()


def test_what_a_consumer_records_is_served_by_the_default_registry():
    ConsumerMetrics.shared().messages.labels("metrics-default-q", "acked").inc(3)
    text = generate_latest(REGISTRY).decode()
    assert 'kmq_consumer_messages_total{outcome="acked",queue="metrics-default-q"} 3.0' in text


def test_metrics_of_their_own_stay_out_of_the_default_registry():
    own = ConsumerMetrics()
    own.messages.labels("metrics-private-q", "acked").inc()
    assert "metrics-private-q" not in generate_latest(REGISTRY).decode()
    assert "metrics-private-q" in generate_latest(own.registry).decode()
