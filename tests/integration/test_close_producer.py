"""Closing a kafka-python producer whose broker is gone leaves nothing for its finalizer.

kafka-python's ``KafkaProducer.__del__`` closes a producer not marked closed with a
1 s flush, which raises while records are still pending: Python prints that as an
"Exception ignored in KafkaProducer.__del__" traceback on stderr, in the middle of a
worker's log, whenever the garbage collector gets to it."""

from __future__ import annotations

import pytest

from kmq.client.errors import ProduceFailed
from kmq.client.kafka_python import clients
from kmq.config import Config
from tests.helpers.kafka import own_broker

pytestmark = pytest.mark.integration


@pytest.fixture
def broker():
    broker = own_broker(durable=False).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_a_producer_given_up_on_a_dead_broker_is_closed_for_good(broker):
    kafka = Config.from_dict({"kafka": {"bootstrap_servers": broker.bootstrap}, "queues": [{"name": "q"}]}).kafka
    producer = clients.producer(kafka)
    producer.send("q", b"before").get(10)
    broker.kill()
    pending = [producer.send("q", b"after") for _ in range(50)]
    clients.close_producer(producer, timeout=0)  # what a marker writer does with a producer it replaces

    def flush(timeout=None):
        raise AssertionError("the producer was flushed again after close_producer gave up on it")

    producer.flush = flush
    producer.__del__()  # what the garbage collector runs
    for fut in pending:
        with pytest.raises(ProduceFailed):
            fut.get(10)  # every pending send fails, and says so
