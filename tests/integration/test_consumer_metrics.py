"""A plain KmqConsumer application exposes its kmq_consumer_* metrics through the default
Prometheus registry: the one a service serves with start_http_server()."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import REGISTRY, start_http_server

from kmq.consumer.consumer import KmqConsumer
from kmq.dev.broker import free_port
from tests.helpers.kafka import produce, wait_until

pytestmark = pytest.mark.integration


def test_a_plain_consumer_app_serves_its_metrics_on_the_default_registry(queue_topics, kafka_client):
    cfg, q = queue_topics(partitions=1, consumer={"ack_flush_interval": "50ms"}, kafka={"client": kafka_client})
    produce(cfg, q.name, 20, partition=None)

    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=REGISTRY)
    try:
        with KmqConsumer(cfg, queue=q.name) as consumer:  # no metrics argument: the application's default
            got: list = []
            wait_until(lambda: got.extend(consumer.poll(timeout=0.2)) or len(got) >= 20, 30, what="20 messages")
            for m in got:
                m.ack()
            consumer.writer.flush()
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
        thread.join(10)
    assert f'kmq_consumer_messages_total{{outcome="acked",queue="{q.name}"}} 20.0' in page
    assert "kmq_consumer_marker_write_seconds_count" in page
