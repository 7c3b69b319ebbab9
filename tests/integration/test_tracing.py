"""OpenTelemetry spans on the real broker: one span per delivery, parented on the
record's traceparent; the tracker's copies and dead letters carry the trace on,
so every attempt of a message lands in one trace."""

from __future__ import annotations

import pytest
from kafka import KafkaProducer

from kmq import KmqConsumer
from tests.helpers.kafka import wait_until
from tests.helpers.otel import PRODUCER_SPAN_ID, TRACE_ID, TRACEPARENT, span_exporter
from tests.integration.tracker_util import Tail, headers, running_tracker

pytestmark = pytest.mark.integration

QUEUE = {"lease": "1s", "max_deliveries": 2, "backoff": {"initial": "100ms", "max": "200ms"}}


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def _spans(exporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_deliveries_redelivery_and_dead_letter_share_the_producers_trace(bootstrap, queue_topics):
    exporter = span_exporter()
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"},
                          consumer={"auto_renew": False, "ack_flush_interval": "50ms"})
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    p.send(q.name, value=b"nacked", headers=[("traceparent", TRACEPARENT)], partition=0)
    p.send(q.name, value=b"timed out", headers=[("traceparent", TRACEPARENT)], partition=0)
    p.flush(); p.close()
    dlq = Tail(bootstrap, q.dlq_topic)
    seen: list = []
    try:
        with running_tracker(cfg), KmqConsumer(cfg, queue=q.name) as consumer:
            def step() -> bool:
                for m in consumer.poll(timeout=0.2):
                    seen.append((m.value, m.delivery_count))
                    if m.value == b"nacked":
                        m.nack()  # delivery 1 -> copy; delivery 2 (max_deliveries) -> dead letter
                    elif m.delivery_count > 1:
                        m.ack()  # the copy of the timed-out one
                    # else: left unsettled, its lease ends in user code
                return len(dlq.poll()) >= 1 and (b"timed out", 2) in seen
            wait_until(step, 60, what="a dead letter and the timed-out message's copy")
        (dead,) = dlq.records
    finally:
        dlq.close()

    process = _spans(exporter, f"process {q.name}")
    by = {(s.attributes["kmq.origin"], s.attributes["kmq.delivery_count"]): s for s in process}
    nacked, timed = f"{q.name}/0/0", f"{q.name}/0/1"
    assert {k: by[k].attributes["kmq.outcome"] for k in by} == {
        (nacked, 1): "nack", (nacked, 2): "nack", (timed, 1): "timeout", (timed, 2): "ack"}
    for s in process:  # every attempt in the producer's trace
        assert _hex(s.context.trace_id, 32) == TRACE_ID
        assert s.attributes["messaging.system"] == "kafka"
        assert s.attributes["messaging.destination.name"] == q.name
        assert s.attributes["messaging.destination.partition.id"] == "0"
        assert s.attributes["messaging.consumer.group.name"] == cfg.consumer.group_id
    first = by[(nacked, 1)]
    assert _hex(first.parent.span_id, 16) == PRODUCER_SPAN_ID and first.attributes["messaging.kafka.offset"] == 0

    (redeliver,) = [s for s in _spans(exporter, f"redeliver {q.name}") if s.attributes["kmq.origin"] == nacked]
    assert _hex(redeliver.parent.span_id, 16) == PRODUCER_SPAN_ID
    assert [_hex(link.context.span_id, 16) for link in redeliver.links] == [PRODUCER_SPAN_ID]
    # The copy's traceparent names the tracker's span: the second attempt follows it.
    assert by[(nacked, 2)].parent.span_id == redeliver.context.span_id

    (dead_span,) = _spans(exporter, f"dead_letter {q.dlq_topic}")
    assert dead_span.parent.span_id == redeliver.context.span_id
    assert [link.context.span_id for link in dead_span.links] == [redeliver.context.span_id]
    assert headers(dead)["traceparent"] == f"00-{TRACE_ID}-{_hex(dead_span.context.span_id, 16)}-01"
