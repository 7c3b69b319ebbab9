"""A broker that does not answer the tracker's produce requests for a while: no copy twice.

The tracker judges a copy failed after waiting for it, and retries it. If its
producer still held the first copy then (its own delivery timeout longer than
the tracker's wait), the first copy is delivered when the broker answers
again, next to the retried one: one more copy per retry. The producer must
have given the first copy up before the tracker retries it.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from kmq.client.topics import ensure_topics
from kmq.config import Config
from kmq.core.markers import Start
from kmq.dev.broker import DevBroker, free_port
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import APP_RECORD, produce, wait_until
from tests.helpers.produce_blackhole import ProduceBlackhole
from tests.integration.tracker_util import MarkerProducer, http_status
from tracker import Tracker

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _wait_metadata(bootstrap: str) -> None:
    def answers() -> bool:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
        except KafkaError:
            return False
        try:
            admin.list_topics()
            return True
        finally:
            admin.close()

    wait_until(answers, 30, what="the broker behind the proxy")


def _copies(bootstrap: str, topic: str) -> list:
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50)
    tp = TopicPartition(topic, 0)
    try:
        c.assign([tp])
        c.seek_to_beginning(tp)
        out: list = []
        deadline = time.monotonic() + 30
        while c.highwater(tp) is None or c.position(tp) < c.highwater(tp):
            out += c.poll(timeout_ms=200).get(tp, [])
            assert time.monotonic() < deadline, "the queue was not read to its end"
        return out[1:]  # after the original
    finally:
        c.close()


# kafka_client: the tracker's producer on either client.
def test_a_copy_judged_failed_is_not_delivered_later_by_the_producer_on_top_of_its_retry(kafka_client):
    broker_port = free_port()
    proxy = ProduceBlackhole(broker_port)
    try:
        with DevBroker(port=broker_port, advertised_port=proxy.port):
            bootstrap = f"127.0.0.1:{proxy.port}"
            _wait_metadata(bootstrap)
            cfg = Config.from_dict({
                "kafka": {"bootstrap_servers": bootstrap, "client": kafka_client, **TEST_GROUP_TIMING},
                "queues": [{"name": unique("q"), "lease": "3s",
                            "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0}}],
                "tracker": {"group_id": unique("tracker"), "http_port": 0, "tick": "50ms"},
            })
            q = cfg.queues[0]
            ensure_topics(cfg.kafka, q, 1)
            produce(bootstrap, q.name, 1, **APP_RECORD)
            t = Tracker(cfg, http_host="127.0.0.1").start()
            try:
                wait_until(lambda: http_status(t.http_port, "/readyz") == 200, 30, what="tracker ready")
                markers = MarkerProducer(bootstrap, q.markers_topic)
                markers.send(0, Start([(0, 1)], lease_ms=3000, owner="w"))
                markers.close()
                proxy.cut()  # the copy, due in about 3 s, is lost on its way, and so is every resend
                failures = t.metrics.redelivery_failures.labels(q.name)
                wait_until(lambda: failures._value.get() >= 1, 120, interval=0.2, what="the copy judged failed")
                proxy.heal()  # the broker answers again: the tracker retries the copy
                in_flight = t.metrics.in_flight.labels(q.name, "0")
                wait_until(lambda: t.metrics.redelivered.labels(q.name, "timeout")._value.get() >= 1, 120,
                           interval=0.2, what="the retried copy acknowledged")
                wait_until(lambda: in_flight._value.get() == 0, 30, interval=0.2, what="the message closed")
            finally:
                t.stop()
            assert proxy.swallowed >= 1
            copies = _copies(bootstrap, q.name)
            assert [c.key for c in copies] == [b"k0"], f"{len(copies)} copies of one message"
    finally:
        proxy.close()
