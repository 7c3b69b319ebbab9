"""A record larger than 1 MiB that the queue accepted is carried by the tracker, never dropped.

The embedded broker accepts records above 1 MiB when the producer raises its
``max_request_size``, and returns no topic configs (so the tracker cannot read
the queue's ``max.message.bytes``). With ``tracker.max_request_size`` raised the
tracker redelivers the record whole; left at its default it cannot, and the DLQ
(same limit) cannot take it either: a reference dead letter (origin, size,
reason, no payload) names it, so it can be found and redriven from the queue log.
"""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from kmq.cli import cli
from kmq.core.markers import Closed, Outcome, Start, decode
from tests.helpers.kafka import produce, read_all, set_max_message_bytes, wait_until
from tests.integration.tracker_util import MarkerProducer, Tail, headers, metric, running_tracker

pytestmark = pytest.mark.integration

SIZE = 1_500_000
QUEUE = {"lease": "1s", "max_deliveries": 3, "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0}}


def produce_large(bootstrap: str, topic: str) -> bytes:
    value = bytes(range(256)) * (SIZE // 256) + b"x" * (SIZE % 256)
    (meta,) = produce(bootstrap, topic, values=[value], keys=b"big", headers=[("app", b"1")],
                      settings={"max_request_size": 4 * SIZE})
    assert meta.offset == 0
    return value


def closed_markers(bootstrap: str, topic: str) -> list:
    return [m for m in (decode(r.value) for r in read_all(bootstrap, topic)) if isinstance(m, Closed)]


# kafka_client: the tracker's producer (and reader) on either client.
def test_a_large_record_is_redelivered_whole_when_the_tracker_may_send_it(bootstrap, queue_topics, kafka_client):
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms", "max_request_size": 2 * SIZE},
                          kafka={"client": kafka_client})
    set_max_message_bytes(bootstrap, 4 * SIZE, q.name, q.dlq_topic)  # Kafka refuses above 1 MiB by default
    value = produce_large(bootstrap, q.name)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail = Tail(bootstrap, q.name)
    try:
        with running_tracker(cfg) as t:
            markers.send(0, Start([(0, 1)], lease_ms=1000, owner="w"))
            _, copy = tail.wait_for(2, what="the copy of the large record")
            wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 0, 15, what="closed")
        assert copy.value == value and copy.key == b"big"
        assert headers(copy)["kmq-origin"] == f"{q.name}/0/0" and headers(copy)["kmq-delivery-count"] == "2"
        assert Closed([(0, 1)], Outcome.REDELIVERED) in closed_markers(bootstrap, q.markers_topic)
    finally:
        markers.close()
        tail.close()


def test_a_record_too_large_for_the_tracker_leaves_a_reference_dead_letter(bootstrap, queue_topics, caplog, kafka_broker):
    if not kafka_broker.is_tansu:
        pytest.skip("needs a broker that reports no topic configs: Apache Kafka reports the queue's max.message.bytes, "
                    "so the tracker's producer takes every record the queue accepted "
                    "(test_the_tracker_sizes_its_producer_from_the_topics_max_message_bytes)")
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"})
    produce_large(bootstrap, q.name)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    dlq = Tail(bootstrap, q.dlq_topic)
    try:
        with caplog.at_level(logging.WARNING, logger="tracker"), running_tracker(cfg) as t:
            # At start-up: the broker does not say how large the queue's records may be; the log says what to set.
            assert any("tracker.max_request_size" in r.getMessage() and "max.message.bytes" in r.getMessage()
                       for r in caplog.records if r.levelno >= logging.WARNING), caplog.text
            markers.send(0, Start([(0, 1)], lease_ms=1000, owner="w"))
            (ref,) = dlq.wait_for(1, what="the reference dead letter")
            wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 0, 15, what="closed")
            assert metric(t.http_port, "kmq_tracker_undeliverable_total", queue=q.name) == 1
        h = headers(ref)
        assert not ref.value and ref.key == b"big"  # no payload
        assert h["kmq-origin"] == f"{q.name}/0/0" and h["kmq-dlq-reference"] == f"{q.name}/0/0"
        assert int(h["kmq-dlq-size"]) >= SIZE and h["kmq-dlq-reason"] == "undeliverable"
        assert "MessageSizeTooLarge" in h["kmq-dlq-error"]
        assert Closed([(0, 1)], Outcome.UNDELIVERABLE) in closed_markers(bootstrap, q.markers_topic)

        run = CliRunner()
        listed = run.invoke(cli, ["dlq", "list", q.name, "--bootstrap", bootstrap])
        assert listed.exit_code == 0, listed.output
        assert "1 dead letter(s)" in listed.output
        assert f"reference: the payload is not in the DLQ; the record is at {q.name}/0/0" in listed.output
        replayed = run.invoke(cli, ["dlq", "replay", q.name, "--bootstrap", bootstrap])
        assert replayed.exit_code == 0, replayed.output
        assert "replayed 0 message(s)" in replayed.output
        assert "cannot be replayed from the DLQ" in replayed.output and f"{q.name}/0/0" in replayed.output
    finally:
        markers.close()
        dlq.close()


def test_the_tracker_sizes_its_producer_from_the_topics_max_message_bytes(bootstrap, make_config, caplog):
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    cfg = make_config(queue=QUEUE, tracker={"tick": "50ms"})  # tracker.max_request_size left at 1 MiB
    q = cfg.queues[0]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        limit = {"max.message.bytes": str(2 * SIZE)}
        admin.create_topics([NewTopic(q.name, 1, 1, topic_configs=limit), NewTopic(q.markers_topic, 1, 1),
                             NewTopic(q.dlq_topic, 1, 1, topic_configs=limit)])
    finally:
        admin.close()
    value = produce_large(bootstrap, q.name)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail = Tail(bootstrap, q.name)
    try:
        with caplog.at_level(logging.INFO, logger="tracker"), running_tracker(cfg):
            assert f"the tracker produces records of up to {2 * SIZE + 8192} bytes" in caplog.text
            assert "did not report max.message.bytes" not in caplog.text
            markers.send(0, Start([(0, 1)], lease_ms=1000, owner="w"))
            _, copy = tail.wait_for(2, what="the copy of the large record")
        assert copy.value == value
    finally:
        markers.close()
        tail.close()
