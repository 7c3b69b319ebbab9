"""OpenTelemetry spans for deliveries and redeliveries (the optional ``kmq[otel]`` extra).

The library's only module that imports ``opentelemetry`` (kmq's own processes
set the SDK up in :mod:`kmq.telemetry.otel_sdk`), and only lazily: without the
package, or without a tracer provider installed by the application
(``opentelemetry.trace.set_tracer_provider`` before the consumer or tracker is
built), :func:`delivery_tracing` and :func:`redelivery_tracing` return None
and the callers skip every tracing call (one ``is None`` test per batch or
settlement, no span objects).

Spans follow the OpenTelemetry messaging semantic conventions
(``messaging.system`` ``kafka``, ``messaging.destination.name``,
``messaging.destination.partition.id``, ``messaging.kafka.offset``,
``messaging.consumer.group.name``), plus ``kmq.delivery_count``,
``kmq.origin`` and ``kmq.outcome`` (``ack``, ``nack``, ``reject``,
``abandon``, ``timeout``):

* a consumer span ``process <queue>`` per delivery, from hand-over to
  settlement (or the end of the lease), parented on the record's W3C
  ``traceparent`` header when it has one; the message carries it
  (``msg.span``) and :func:`use_span` makes it the current span, so the spans
  user code starts inside are its children (kmq does so around every handler
  it calls: ``KmqConsumer.run``, ``AsyncKmqConsumer.run``, ``@kmq.marked``);
* a producer span ``redeliver <queue>`` or ``dead_letter <dlq>`` per copy or
  dead letter the tracker writes, parented on and linked to the context the
  earlier attempt carried; the copy's ``traceparent`` names this span, so
  every attempt of one message lands in the producer's trace, one after
  the other.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Iterable, Iterator, Sequence

from kmq.core.log_fields import trace_id_of
from kmq.core.message import delivery_count_of, origin_of
from kmq.version import __version__

__all__ = ["DeliveryTracing", "RedeliveryTracing", "delivery_tracing", "redelivery_tracing", "trace_id_of",
           "TRACE_HEADERS", "use_span", "current"]

log = logging.getLogger(__name__)

#: The W3C trace-context headers (the propagator may add others, e.g. ``baggage``).
TRACE_HEADERS = ("traceparent", "tracestate")
_ERROR_OUTCOMES = frozenset({"nack", "reject", "timeout"})

Headers = Sequence[tuple[str, "bytes | None"]]


def _otel() -> Any:
    """The ``opentelemetry`` API modules, or None when the extra is not installed."""
    try:
        from opentelemetry import propagate, trace  # optional extra: kmq[otel]
    except ImportError:
        return None
    return trace, propagate


def _tracer(name: str) -> Any:
    """A tracer of the application's provider; None when tracing is off."""
    otel = _otel()
    if otel is None:
        return None
    trace = otel[0]
    provider = trace.get_tracer_provider()
    # The API's own placeholders record nothing: no provider set means tracing is off.
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider.get_tracer(name, __version__)


class _Getter:
    """Reads propagation fields from Kafka headers (``(str, bytes)`` pairs)."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        values = [v.decode("utf-8", "replace") for k, v in carrier if k == key and v]
        return values or None

    def keys(self, carrier: Headers) -> list[str]:
        return [k for k, _ in carrier]


_GETTER = _Getter()


def _context_of(headers: Headers | None) -> Any:
    """The trace context a record carries (an empty context when it carries none)."""
    propagate = _otel()[1]
    return propagate.extract(list(headers or ()), getter=_GETTER)


def _base_attributes(topic: str, partition: int, offset: int) -> dict[str, Any]:
    return {"messaging.system": "kafka", "messaging.destination.name": topic,
            "messaging.destination.partition.id": str(partition), "messaging.kafka.offset": offset}


class DeliveryTracing:
    """One consumer span per delivery, from hand-over to its end (settled or the lease over)."""

    def __init__(self, tracer: Any, group: str) -> None:
        self._tracer = tracer
        self._group = group
        self._kind = _otel()[0].SpanKind.CONSUMER
        self._spans: dict[tuple[int, int], Any] = {}

    def __len__(self) -> int:
        return len(self._spans)

    def start(self, topic: str, partition: int, offset: int, headers: Headers | None,
              start: int | None = None) -> Any:
        """A new delivery span for the record at ``topic/partition/offset`` (not kept: the caller ends it
        with :meth:`end`; ``@kmq.marked`` uses it for each record its handler is called with)."""
        attrs = _base_attributes(topic, partition, offset)
        attrs.update({"messaging.operation.name": "process", "messaging.operation.type": "process",
                      "messaging.consumer.group.name": self._group, "kmq.delivery_count": delivery_count_of(headers),
                      "kmq.origin": origin_of(headers, topic, partition, offset)})
        return self._tracer.start_span(f"process {topic}", context=_context_of(headers), kind=self._kind,
                                       attributes=attrs, start_time=start)

    @staticmethod
    def end(span: Any, outcome: str) -> None:
        """End a span of :meth:`start` with ``outcome`` (``ack``, ``nack``, ``reject``, ``unsettled``)."""
        _end(span, outcome)

    def handed(self, messages: Iterable[Any]) -> None:
        """Messages handed to user code: their spans start now; each message carries its own."""
        start = time.time_ns()
        for m in messages:
            span = self.start(m.topic, m.partition, m.offset, m._headers, start)
            m.traced_by(span)
            old = self._spans.pop((m.partition, m.offset), None)
            if old is not None:  # handed again (a rebalance gave it back): the earlier one is over
                _end(old, "abandon")
            self._spans[(m.partition, m.offset)] = span

    def settled(self, msg: Any, outcome: str) -> None:
        """``msg`` was settled (``ack``, ``nack``, ``reject``, ``abandon``)."""
        span = self._spans.pop((msg.partition, msg.offset), None)
        if span is not None:
            _end(span, outcome)

    def timed_out(self, messages: Iterable[Any]) -> None:
        """Their leases ended in user code unsettled: the tracker redelivers them."""
        for m in messages:
            self.settled(m, "timeout")

    def close(self) -> None:
        """The consumer closes: deliveries still open end unsettled (redelivered by the tracker)."""
        spans, self._spans = self._spans, {}
        for span in spans.values():
            _end(span, "unsettled")


def _end(span: Any, outcome: str) -> None:
    span.set_attribute("kmq.outcome", outcome)
    if outcome in _ERROR_OUTCOMES:
        status = _otel()[0].Status(_otel()[0].StatusCode.ERROR, outcome)
        span.set_status(status)
    span.end()


class RedeliveryTracing:
    """One producer span per copy or dead letter the tracker writes; the record carries its context."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        trace = _otel()[0]
        self._kind = trace.SpanKind.PRODUCER
        self._trace = trace

    def traced(self, headers: list[tuple[str, bytes]], step: str, topic: str, partition: int, origin: str,
               count: int, earlier: Headers | None) -> list[tuple[str, bytes]]:
        """``headers`` of a copy or dead letter to ``topic`` with the trace context of a new span
        (``step``: ``redeliver`` or ``dead_letter``), parented on and linked to ``earlier``'s context."""
        parent = _context_of(earlier)
        earlier_span = self._trace.get_current_span(parent).get_span_context()
        links = [self._trace.Link(earlier_span, {"kmq.link": "earlier_attempt"})] if earlier_span.is_valid else []
        attrs = {"messaging.system": "kafka", "messaging.destination.name": topic,
                 "messaging.operation.name": step, "messaging.operation.type": "send",
                 "messaging.destination.partition.id": str(partition), "kmq.delivery_count": count,
                 "kmq.origin": origin}
        span = self._tracer.start_span(f"{step} {topic}", context=parent, kind=self._kind, attributes=attrs,
                                       links=links)
        try:
            carrier: dict[str, str] = {}
            propagate = _otel()[1]
            propagate.inject(carrier, context=self._trace.set_span_in_context(span))
        finally:
            span.end()
        out = [(k, v) for k, v in headers if k not in carrier]
        out.extend((k, v.encode("utf-8")) for k, v in carrier.items())
        return out


@contextlib.contextmanager
def current(span: Any) -> Iterator[Any]:
    """Make ``span`` the current span of this thread (or asyncio task) inside the block; nothing when
    ``span`` is None. The span is not ended on leaving: its delivery's settlement ends it."""
    if span is None:
        yield None
        return
    trace = _otel()[0]
    with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        yield span


def _span_of(msg: Any) -> Any:
    """The delivery span of a :class:`~kmq.core.message.KmqMessage`, an ``AsyncKmqMessage`` or a
    ``kmq.share`` ``Message`` (its ``kmq_message``)."""
    inner = getattr(msg, "kmq_message", None)  # kmq.share's Message: span() would clash with confluent's API
    target = msg if inner is None else inner
    try:
        return target.span
    except AttributeError:
        raise TypeError(f"use_span() takes a message kmq handed out (KmqMessage, AsyncKmqMessage or kmq.share's "
                        f"Message), got {type(msg).__name__}") from None


def use_span(msg: Any) -> "contextlib.AbstractContextManager[Any]":
    """``with use_span(msg):`` makes ``msg``'s delivery span current, so the spans started inside (a
    database call, an HTTP request, by hand or by an instrumentation) are its children, in the trace
    of the message's producer. For the ways of consuming where user code, not kmq, runs the message
    (``for msg in consumer``, ``poll()``, ``async for``, ``kmq.share``); around a handler kmq calls it
    does this itself. Yields the span, or None when tracing is off (then it does nothing)."""
    return current(_span_of(msg))


def delivery_tracing(group: str) -> DeliveryTracing | None:
    """Delivery spans for a consumer of ``group``; None when tracing is off."""
    tracer = _tracer("kmq.consumer")
    return DeliveryTracing(tracer, group) if tracer is not None else None


def redelivery_tracing() -> RedeliveryTracing | None:
    """Redelivery spans for the tracker; None when tracing is off."""
    tracer = _tracer("kmq.tracker")
    return RedeliveryTracing(tracer) if tracer is not None else None
