"""A long non-ASCII ``kafka.client_id`` does not stop a consumer: its START markers carry an
owner id (the group member id, which brokers build from the client id) cut to 255 utf-8 bytes.

Cut to 255 characters instead, such an owner did not fit the marker, every START was refused
and the fetcher failed on every start."""

from __future__ import annotations

import pytest

from kmq.consumer.consumer import KmqConsumer
from kmq.core.markers import Start
from tests.helpers.kafka import produce, wait_until
from tests.helpers.workers import markers_by_partition

pytestmark = pytest.mark.integration


def test_a_consumer_with_a_long_non_ascii_client_id_starts_and_settles(queue_topics, bootstrap, kafka_client):
    cfg, q = queue_topics(partitions=1, kafka={"client": kafka_client, "client_id": "é" * 200},
                          consumer={"ack_flush_interval": "50ms"})
    produce(cfg, q.name, 3, partition=None)
    with KmqConsumer(cfg, queue=q.name) as consumer:
        got: list = []
        wait_until(lambda: got.extend(consumer.poll(timeout=0.2)) or len(got) >= 3, 30, what="3 messages")
        for m in got:
            m.ack()
        consumer.writer.flush()
    owners = [m.owner for ms in markers_by_partition(bootstrap, q.markers_topic).values() for m in ms
              if isinstance(m, Start)]
    assert owners and all(0 < len(o.encode("utf-8")) <= 255 for o in owners), owners
    assert all(o.startswith("é") for o in owners), owners
