"""Settlement markers that cannot be written show up in the consumer's metrics:
the broker is stopped under a real KmqConsumer, acks are made, and the retried / given-up
counters and the waiting gauge move as the writes fail, are resent and are given up."""

from __future__ import annotations

import pytest

from kmq.config import Config
from kmq.consumer.consumer import KmqConsumer
from tests.helpers.kafka import own_broker, produce
from kmq.telemetry.metrics import ConsumerMetrics
from kmq.client.topics import ensure_topics
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_failed_marker_writes_are_counted_retried_waiting_and_given_up(tmp_path):
    broker = own_broker(tmp_path, durable=False).start()
    try:
        cfg = Config.from_dict({
            # delivery timeout = connect_timeout + 1 s: a failed END is known after 2 s
            "kafka": {"bootstrap_servers": broker.bootstrap, **TEST_GROUP_TIMING, "connect_timeout": "1s"},
            "queues": [{"name": unique("q"), "lease": "30s"}],
            "consumer": {"group_id": unique("workers"), "ack_flush_interval": "50ms", "marker_retry_budget": "4s"},
            "tracker": {"group_id": unique("tracker"), "http_port": 0},
        })
        q = cfg.queues[0]
        ensure_topics(cfg.kafka, q, 1)
        produce(cfg, q.name, 5)
        metrics = ConsumerMetrics()

        def sample(name: str, **labels: str) -> float:
            return metrics.registry.get_sample_value(name, {"queue": q.name, **labels}) or 0.0

        consumer = KmqConsumer(cfg, queue=q.name, metrics=metrics)
        try:
            msgs: list = []
            wait_until(lambda: msgs.extend(consumer.poll(timeout=0.2)) or len(msgs) == 5, 30, what="5 messages")
            assert sample("kmq_consumer_markers_awaiting_retry") == 0
            broker.kill()
            for m in msgs[:3]:
                m.ack()
            msgs[3].nack(delay=1.0)
            # The END and NACK fail after the delivery timeout, wait in the retry store and are resent.
            wait_until(lambda: sample("kmq_consumer_markers_awaiting_retry") == 4, 20, what="4 messages waiting")
            wait_until(lambda: sample("kmq_consumer_markers_retried_total", type="END") >= 3
                       and sample("kmq_consumer_markers_retried_total", type="NACK") >= 1, 20, what="resends counted")
            # Past consumer.marker_retry_budget they are given up: counted once per message, nothing waits.
            wait_until(lambda: sample("kmq_consumer_markers_given_up_total", type="END") == 3
                       and sample("kmq_consumer_markers_given_up_total", type="NACK") == 1, 30, what="given up")
            assert sample("kmq_consumer_markers_awaiting_retry") == 0
            assert consumer.writer.failed_writes >= 2
        finally:
            consumer.close(timeout=1.0)
        assert sample("kmq_consumer_markers_given_up_total", type="END") == 3  # close gave up nothing more
    finally:
        broker.stop()
