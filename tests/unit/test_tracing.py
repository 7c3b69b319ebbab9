"""kmq.telemetry.tracing without a broker: off without the extra or a provider, spans
named and attributed by the messaging conventions, contexts carried in headers."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from kmq.core.message import KmqMessage
from kmq.telemetry import tracing
from tests.helpers.otel import PRODUCER_SPAN_ID, TRACE_ID, TRACEPARENT, span_exporter


class _NoSettler:
    def settled(self, *a) -> None: ...

    def renewed(self, *a) -> None: ...


def _msg(offset: int, headers=None) -> KmqMessage:
    return KmqMessage("orders", 3, offset, None, b"v", headers, 0, _NoSettler(), threading.Lock())


def test_importing_kmq_the_consumer_and_the_tracker_does_not_import_opentelemetry():
    code = ("import sys, kmq, kmq.aio, kmq.tracing, kmq.consumer.consumer, tracker.redeliver, tracker.service; "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tracing_is_off_without_the_opentelemetry_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import opentelemetry -> ImportError
    assert tracing.delivery_tracing("g") is None and tracing.redelivery_tracing() is None


def test_tracing_is_off_while_the_application_installed_no_tracer_provider(monkeypatch):
    trace = pytest.importorskip("opentelemetry.trace", reason="the kmq[otel] extra is not installed")
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    assert tracing.delivery_tracing("g") is None and tracing.redelivery_tracing() is None


@pytest.mark.parametrize("value, expected", [
    (TRACEPARENT, TRACE_ID),
    (b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01", None),  # all-zero trace id: invalid
    (b"garbage", None),
    (None, None),
])
def test_trace_id_of_reads_the_w3c_traceparent_header(value, expected):
    assert tracing.trace_id_of([("traceparent", value)]) == expected


def test_a_delivery_span_follows_the_messaging_conventions_and_its_parent():
    exporter = span_exporter()
    t = tracing.delivery_tracing("workers")
    assert t is not None
    a, b, c = _msg(7, [("traceparent", TRACEPARENT)]), _msg(8), _msg(9, [("kmq-delivery-count", b"3")])
    t.handed([a, b, c])
    t.settled(a, "ack")
    t.timed_out([b])
    t.close()  # c: still open
    spans = {s.attributes["messaging.kafka.offset"]: s for s in exporter.get_finished_spans()}
    assert {o: s.attributes["kmq.outcome"] for o, s in spans.items()} == {7: "ack", 8: "timeout", 9: "unsettled"}
    s = spans[7]
    assert s.name == "process orders" and s.kind.name == "CONSUMER"
    assert {k: s.attributes[k] for k in ("messaging.system", "messaging.destination.name",
                                         "messaging.destination.partition.id", "messaging.consumer.group.name",
                                         "messaging.operation.type", "kmq.delivery_count")} == {
        "messaging.system": "kafka", "messaging.destination.name": "orders",
        "messaging.destination.partition.id": "3", "messaging.consumer.group.name": "workers",
        "messaging.operation.type": "process", "kmq.delivery_count": 1}
    assert format(s.context.trace_id, "032x") == TRACE_ID and format(s.parent.span_id, "016x") == PRODUCER_SPAN_ID
    assert spans[8].parent is None and spans[8].status.status_code.name == "ERROR"
    assert spans[9].attributes["kmq.delivery_count"] == 3 and len(t) == 0


def test_a_rejected_delivery_ends_its_span_with_outcome_reject_and_an_error_status():
    exporter = span_exporter()
    t = tracing.delivery_tracing("workers")
    a, b = _msg(7, [("traceparent", TRACEPARENT)]), _msg(8)
    t.handed([a, b])
    t.settled(a, "reject")
    t.settled(b, "ack")
    spans = {s.attributes["messaging.kafka.offset"]: s for s in exporter.get_finished_spans()}
    assert spans[7].attributes["kmq.outcome"] == "reject" and spans[8].attributes["kmq.outcome"] == "ack"
    assert spans[7].status.status_code.name == "ERROR" and spans[7].status.description == "reject"
    assert spans[8].status.status_code.name == "UNSET"
    assert format(spans[7].parent.span_id, "016x") == PRODUCER_SPAN_ID and len(t) == 0


def test_a_copy_carries_the_context_of_the_trackers_span_linked_to_the_earlier_attempt():
    exporter = span_exporter()
    t = tracing.redelivery_tracing()
    assert t is not None
    out = t.traced([("app", b"x"), ("traceparent", TRACEPARENT), ("kmq-delivery-count", b"2")], "redeliver",
                   "orders", 3, "orders/3/7", 2, [("traceparent", TRACEPARENT)])
    (span,) = exporter.get_finished_spans()
    assert span.name == "redeliver orders" and span.kind.name == "PRODUCER"
    assert format(span.parent.span_id, "016x") == PRODUCER_SPAN_ID
    assert [format(link.context.span_id, "016x") for link in span.links] == [PRODUCER_SPAN_ID]
    names = [k for k, _ in out]
    assert names.count("traceparent") == 1 and names[:2] == ["app", "kmq-delivery-count"]
    assert dict(out)["traceparent"] == f"00-{TRACE_ID}-{span.context.span_id:016x}-01".encode()


def test_a_copy_of_a_record_without_context_starts_a_trace_with_no_link():
    exporter = span_exporter()
    out = tracing.redelivery_tracing().traced([], "dead_letter", "orders__dlq", 0, "orders/3/7", 5, None)
    (span,) = exporter.get_finished_spans()
    assert span.parent is None and list(span.links) == []
    assert tracing.trace_id_of(out) == format(span.context.trace_id, "032x")


def test_a_handed_message_carries_its_span_and_use_span_makes_it_current():
    from opentelemetry import trace

    exporter = span_exporter()
    t = tracing.delivery_tracing("workers")
    m = _msg(7, [("traceparent", TRACEPARENT)])
    assert m.span is None
    t.handed([m])
    with tracing.use_span(m) as span:
        assert span is m.span and trace.get_current_span() is span
        with trace.get_tracer("app").start_as_current_span("child"):
            pass
    assert trace.get_current_span() is not span  # detached on leaving
    t.settled(m, "ack")
    child, process = exporter.get_finished_spans()
    assert child.parent.span_id == process.context.span_id and process.attributes["kmq.outcome"] == "ack"


def test_use_span_does_nothing_while_tracing_is_off_and_refuses_what_is_no_message():
    with tracing.use_span(_msg(7)) as span:
        assert span is None
    with pytest.raises(TypeError, match="use_span\\(\\) takes a message kmq handed out"):
        tracing.use_span(object())
