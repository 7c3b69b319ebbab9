"""OpenTelemetry spans on the real broker, with each Kafka client: one span per delivery,
parented on the record's traceparent, ending with its outcome (ack, nack, reject, timeout);
the tracker's copies and dead letters carry the trace on, so every attempt of a message lands
in one trace. The asyncio consumer's deliveries are traced the same way."""

from __future__ import annotations

import asyncio

import pytest

from kmq import KmqConsumer
from kmq.aio import AsyncKmqConsumer
from tests.helpers.kafka import produce, wait_until
from tests.helpers.otel import PRODUCER_SPAN_ID, TRACE_ID, TRACEPARENT, span_exporter
from tests.integration.tracker_util import Tail, headers, running_tracker

pytestmark = pytest.mark.integration

QUEUE = {"lease": "1s", "max_deliveries": 2, "backoff": {"initial": "100ms", "max": "200ms"}}


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def _spans(exporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_deliveries_redelivery_and_dead_letter_share_the_producers_trace(bootstrap, queue_topics, kafka_client):
    exporter = span_exporter()
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client},
                          consumer={"auto_renew": False, "ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, values=[b"nacked", b"timed out", b"rejected"], headers=[("traceparent", TRACEPARENT)])
    dlq = Tail(bootstrap, q.dlq_topic)
    seen: list = []
    try:
        with running_tracker(cfg), KmqConsumer(cfg, queue=q.name) as consumer:
            def step() -> bool:
                for m in consumer.poll(timeout=0.2):
                    seen.append((m.value, m.delivery_count))
                    if m.value == b"nacked":
                        m.nack()  # delivery 1 -> copy; delivery 2 (max_deliveries) -> dead letter
                    elif m.value == b"rejected":
                        m.reject("bad payload")  # -> dead letter at once, no copy
                    elif m.delivery_count > 1:
                        m.ack()  # the copy of the timed-out one
                    # else: left unsettled, its lease ends in user code
                return len(dlq.poll()) >= 2 and (b"timed out", 2) in seen
            wait_until(step, 60, what="two dead letters and the timed-out message's copy")
        dead_of = {headers(r)["kmq-origin"]: r for r in dlq.records}
    finally:
        dlq.close()

    process = _spans(exporter, f"process {q.name}")
    by = {(s.attributes["kmq.origin"], s.attributes["kmq.delivery_count"]): s for s in process}
    nacked, timed, rejected = f"{q.name}/0/0", f"{q.name}/0/1", f"{q.name}/0/2"
    assert sorted(dead_of) == [nacked, rejected]
    assert {k: by[k].attributes["kmq.outcome"] for k in by} == {
        (nacked, 1): "nack", (nacked, 2): "nack", (timed, 1): "timeout", (timed, 2): "ack", (rejected, 1): "reject"}
    assert {k: by[k].status.status_code.name for k in by} == {
        (nacked, 1): "ERROR", (nacked, 2): "ERROR", (timed, 1): "ERROR", (timed, 2): "UNSET", (rejected, 1): "ERROR"}
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

    dead_spans = {s.attributes["kmq.origin"]: s for s in _spans(exporter, f"dead_letter {q.dlq_topic}")}
    assert sorted(dead_spans) == [nacked, rejected]
    dead_span = dead_spans[nacked]
    assert dead_span.parent.span_id == redeliver.context.span_id
    assert [link.context.span_id for link in dead_span.links] == [redeliver.context.span_id]
    assert headers(dead_of[nacked])["traceparent"] == f"00-{TRACE_ID}-{_hex(dead_span.context.span_id, 16)}-01"

    # A rejected message goes to the DLQ without a copy: its dead letter is parented on and linked
    # to the context the rejected delivery carried (the producer's span, the rejected process
    # span's parent), in the same trace, and the dead letter's traceparent names it.
    reject_span = dead_spans[rejected]
    assert reject_span.attributes["kmq.delivery_count"] == 1
    assert _hex(reject_span.context.trace_id, 32) == TRACE_ID
    assert _hex(reject_span.parent.span_id, 16) == PRODUCER_SPAN_ID
    assert [_hex(link.context.span_id, 16) for link in reject_span.links] == [PRODUCER_SPAN_ID]
    assert by[(rejected, 1)].parent.span_id == reject_span.parent.span_id
    assert headers(dead_of[rejected])["kmq-dlq-reason"] == "rejected"
    assert headers(dead_of[rejected])["traceparent"] == f"00-{TRACE_ID}-{_hex(reject_span.context.span_id, 16)}-01"


def test_the_asyncio_consumers_deliveries_are_traced_with_their_outcomes(bootstrap, queue_topics):
    exporter = span_exporter()
    cfg, q = queue_topics(1, queue=QUEUE, consumer={"ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, values=[b"acked", b"rejected", b"nacked"], headers=[("traceparent", TRACEPARENT)])

    async def scenario() -> None:
        async with AsyncKmqConsumer(cfg, queue=q.name) as consumer:
            got = []
            async with asyncio.timeout(30):
                async for msg in consumer:
                    got.append(msg)
                    if len(got) == 3:
                        break
            acked, rejected, nacked = sorted(got, key=lambda m: m.offset)
            await acked.ack()
            await rejected.reject("bad payload")
            await nacked.nack()

    asyncio.run(scenario())
    process = _spans(exporter, f"process {q.name}")
    assert {s.attributes["messaging.kafka.offset"]: s.attributes["kmq.outcome"] for s in process} == {
        0: "ack", 1: "reject", 2: "nack"}
    for s in process:
        assert _hex(s.context.trace_id, 32) == TRACE_ID and _hex(s.parent.span_id, 16) == PRODUCER_SPAN_ID
        assert s.attributes["messaging.consumer.group.name"] == cfg.consumer.group_id
