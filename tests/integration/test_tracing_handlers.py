"""The delivery span reaches user code, on the real broker: a span a handler starts is a child of its
message's ``process <queue>`` span (in the producer's trace), in every way of consuming. kmq makes
the span current around the handlers it calls (``KmqConsumer.run``, ``@kmq.marked``,
``AsyncKmqConsumer.run``); where user code runs the message (iteration, ``async for``,
``kmq.share``), ``kmq.tracing.use_span(msg)`` does."""

from __future__ import annotations

import asyncio
import threading

import pytest

import kmq
from kmq import KmqConsumer
from kmq.aio import AsyncKmqConsumer
from kmq.client.kafka_python import clients
from kmq.share import AcknowledgeType, ShareConsumer
from kmq.tracing import use_span
from tests.helpers.kafka import produce, wait_for_assignment, wait_until
from tests.helpers.otel import TRACE_ID, TRACEPARENT, span_exporter

pytestmark = pytest.mark.integration

N = 4


def _work(offset: int) -> None:
    """What a handler does: a span of its own (as a database or HTTP instrumentation would start)."""
    from opentelemetry import trace

    with trace.get_tracer("app").start_as_current_span("handler work", attributes={"offset": offset}):
        pass


def _assert_children_of_their_deliveries(exporter, queue: str) -> None:
    spans = exporter.get_finished_spans()
    process = {s.attributes["messaging.kafka.offset"]: s for s in spans if s.name == f"process {queue}"}
    work = {s.attributes["offset"]: s for s in spans if s.name == "handler work"}
    assert sorted(process) == sorted(work) == list(range(N))
    for offset, child in work.items():
        assert child.parent is not None, f"offset {offset}: the handler's span has no parent"
        assert child.parent.span_id == process[offset].context.span_id, offset
        assert format(child.context.trace_id, "032x") == TRACE_ID  # the producer's trace


def test_a_handler_of_run_on_the_worker_pool_runs_inside_its_delivery_span(bootstrap, queue_topics):
    exporter = span_exporter()
    cfg, q = queue_topics(1, consumer={"ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, N, headers=[("traceparent", TRACEPARENT)])
    done: list[int] = []
    lock = threading.Lock()
    with KmqConsumer(cfg, queue=q.name) as consumer:
        def handle(msg) -> None:
            _work(msg.offset)
            with lock:
                done.append(msg.offset)
                if len(done) == N:
                    consumer.stop()
        consumer.run(handle, workers=2)
    _assert_children_of_their_deliveries(exporter, q.name)


def test_use_span_makes_the_delivery_span_current_for_iteration(bootstrap, queue_topics):
    exporter = span_exporter()
    cfg, q = queue_topics(1, consumer={"ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, N, headers=[("traceparent", TRACEPARENT)])
    with KmqConsumer(cfg, queue=q.name) as consumer:
        seen = 0
        for msg in consumer:
            assert msg.span is not None
            with use_span(msg) as span:
                assert span is msg.span
                _work(msg.offset)
            msg.ack()
            seen += 1
            if seen == N:
                break
    _assert_children_of_their_deliveries(exporter, q.name)


def test_a_marked_handler_runs_inside_a_delivery_span_ended_with_its_settlement(bootstrap, queue_topics):
    exporter = span_exporter()
    cfg, q = queue_topics(1)
    produce(bootstrap, q.name, N, headers=[("traceparent", TRACEPARENT)])
    consumer = clients.consumer(cfg.kafka, q.name, group_id=cfg.consumer.group_id)
    writer = kmq.MarkerWriter(cfg, queue=q.name, consumer=consumer)

    @kmq.marked(writer)
    def handle(record) -> None:
        _work(record.offset)
        if record.offset == 1:
            raise RuntimeError("transient")  # nacked: its span ends as such

    try:
        wait_for_assignment(consumer)
        handled = 0
        while handled < N:
            for rec in writer.start(consumer.poll(timeout_ms=500)):
                handle(rec)
                handled += 1
    finally:
        consumer.close()
        writer.close()
    _assert_children_of_their_deliveries(exporter, q.name)
    outcomes = {s.attributes["messaging.kafka.offset"]: s.attributes["kmq.outcome"]
                for s in exporter.get_finished_spans() if s.name == f"process {q.name}"}
    assert outcomes == {0: "ack", 1: "nack", 2: "ack", 3: "ack"}


def test_a_coroutine_handler_of_the_asyncio_run_runs_inside_its_delivery_span(bootstrap, queue_topics):
    exporter = span_exporter()
    cfg, q = queue_topics(1, consumer={"ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, N, headers=[("traceparent", TRACEPARENT)])

    async def scenario() -> None:
        async with AsyncKmqConsumer(cfg, queue=q.name) as consumer:
            done: list[int] = []

            async def handle(msg) -> None:
                await asyncio.sleep(0)  # other handlers run meanwhile: the span is this task's own
                _work(msg.offset)
                done.append(msg.offset)
                if len(done) == N:
                    consumer.stop()

            async with asyncio.timeout(30):
                await consumer.run(handle, concurrency=2)

    asyncio.run(scenario())
    _assert_children_of_their_deliveries(exporter, q.name)


def test_use_span_makes_the_delivery_span_current_for_async_for(bootstrap, queue_topics):
    exporter = span_exporter()
    cfg, q = queue_topics(1, consumer={"ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, N, headers=[("traceparent", TRACEPARENT)])

    async def scenario() -> None:
        async with AsyncKmqConsumer(cfg, queue=q.name) as consumer:
            seen = 0
            async with asyncio.timeout(30):
                async for msg in consumer:
                    with use_span(msg):
                        _work(msg.offset)
                    await msg.ack()
                    seen += 1
                    if seen == N:
                        break

    asyncio.run(scenario())
    _assert_children_of_their_deliveries(exporter, q.name)


def test_use_span_makes_the_delivery_span_current_for_a_share_consumers_records(bootstrap, queue_topics):
    exporter = span_exporter()
    cfg, q = queue_topics(1, consumer={"ack_flush_interval": "50ms"})
    produce(bootstrap, q.name, N, headers=[("traceparent", TRACEPARENT)])
    with ShareConsumer({"bootstrap.servers": bootstrap, "group.id": cfg.consumer.group_id,
                        "share.acknowledgement.mode": "explicit", "kmq.config": cfg}) as consumer:
        consumer.subscribe([q.name])
        seen: list[int] = []

        def step() -> bool:
            for message in consumer.poll(timeout=0.5):
                with use_span(message):
                    _work(message.offset())
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                seen.append(message.offset())
            return len(seen) == N
        wait_until(step, 30, what=f"{N} records")
        consumer.commit_sync()
    _assert_children_of_their_deliveries(exporter, q.name)
