"""One in-memory OpenTelemetry tracer provider for the whole test session.

OpenTelemetry lets a process set its global tracer provider once; tests that
look at spans share this one and clear its exporter first. Skips (with the
cause) when the ``kmq[otel]`` extra is not installed."""

from __future__ import annotations

import pytest

_exporter = None


def span_exporter():
    """The session's ``InMemorySpanExporter``, installed on first use, cleared."""
    global _exporter
    pytest.importorskip("opentelemetry.sdk", reason="the kmq[otel] extra (opentelemetry-sdk) is not installed")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    if _exporter is None:
        _exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    return _exporter


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PRODUCER_SPAN_ID}-01".encode()
