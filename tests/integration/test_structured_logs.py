"""Structured log lines on the real broker: the consumer's line about a lease that ended
unsettled and the tracker's dead-letter line carry the message's fields as JSON."""

from __future__ import annotations

import json
import logging

import pytest
from kafka import KafkaProducer

from kmq import KmqConsumer
from kmq.telemetry.logs import JsonFormatter
from tests.helpers.kafka import wait_until
from tests.helpers.otel import TRACE_ID, TRACEPARENT
from tests.integration.tracker_util import Tail, running_tracker

pytestmark = pytest.mark.integration


def _has(caplog, logger: str, text: str) -> bool:
    return any(r.name == logger and text in r.getMessage() for r in caplog.records)


def _line(caplog, logger: str, text: str) -> dict:
    records = [r for r in caplog.records if r.name == logger and text in r.getMessage()]
    assert records, f"no {logger} line with {text!r}"
    return json.loads(JsonFormatter().format(records[0]))


def test_lease_end_and_dead_letter_lines_carry_the_messages_fields(bootstrap, queue_topics, caplog):
    cfg, q = queue_topics(1, queue={"lease": "1s", "max_deliveries": 1}, tracker={"tick": "50ms"},
                          consumer={"auto_renew": False, "ack_flush_interval": "50ms"})
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    p.send(q.name, value=b"left unsettled", headers=[("traceparent", TRACEPARENT)], partition=0)
    p.flush()
    p.close()
    caplog.set_level(logging.INFO, logger="tracker.redeliver")
    caplog.set_level(logging.INFO, logger="kmq.consumer.consumer")  # one level: it is also the handler's
    dlq = Tail(bootstrap, q.dlq_topic)
    got: list = []
    try:
        with running_tracker(cfg), KmqConsumer(cfg, queue=q.name) as consumer:
            wait_until(lambda: got.extend(consumer.poll(timeout=0.2)) or got, 30, what="the message")
            # Left unsettled: its lease ends in user code, then the tracker dead-letters it (max_deliveries 1).
            # The tracker logs a dead letter once Kafka acknowledged it: wait for the line, not only the record.
            wait_until(lambda: _has(caplog, "kmq.consumer.consumer", "reached the end of their lease"), 30,
                       what="the consumer's lease-end line")
            wait_until(lambda: _has(caplog, "tracker.redeliver", "dead-lettered to"), 30,
                       what="the tracker's dead-letter line")
            wait_until(dlq.poll, 30, what="the dead letter")
    finally:
        dlq.close()
    expected = {"queue": q.name, "partition": 0, "offset": 0, "origin": f"{q.name}/0/0", "delivery_count": 1,
                "trace_id": TRACE_ID}
    lease_end = _line(caplog, "kmq.consumer.consumer", "reached the end of their lease unsettled")
    assert {k: lease_end[k] for k in expected} == expected and lease_end["outcome"] == "timeout"
    dead = _line(caplog, "tracker.redeliver", "dead-lettered to")
    assert {k: dead[k] for k in expected} == expected
    assert (dead["outcome"], dead["reason"], dead["level"]) == ("dead_letter", "timeout", "INFO")


def test_partition_lines_of_the_tracker_and_the_consumer_carry_queue_and_partition(queue_topics, caplog):
    cfg, q = queue_topics(2)
    caplog.set_level(logging.INFO, logger="tracker")
    caplog.set_level(logging.INFO, logger="kmq.consumer.consumer")
    with running_tracker(cfg):
        wait_until(lambda: _has(caplog, "tracker.catch_up", "caught up at marker offset"), 30,
                   what="the tracker's caught-up line")
        with KmqConsumer(cfg, queue=q.name) as consumer:
            wait_until(lambda: consumer.poll(timeout=0.2) is not None and _has(
                caplog, "kmq.consumer.consumer", "assigned partitions"), 30, what="the consumer's assigned line")
    assigned = _line(caplog, "tracker.service", "assigned markers partitions")
    assert (assigned["queue"], assigned["partitions"], assigned["markers_topic"]) == (q.name, [0, 1], q.markers_topic)
    caught = _line(caplog, "tracker.catch_up", "caught up at marker offset")
    assert caught["queue"] == q.name and caught["partition"] in (0, 1) and caught["marker_offset"] == 0
    revoked = _line(caplog, "tracker.service", "revoked markers partitions")
    assert (revoked["queue"], revoked["partitions"]) == (q.name, [0, 1])
    mine = _line(caplog, "kmq.consumer.consumer", "assigned partitions")
    assert (mine["queue"], mine["partitions"]) == (q.name, [0, 1])
