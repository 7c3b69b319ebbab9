"""OpenTelemetry for user code (public module): :func:`use_span`.

kmq makes a ``process <queue>`` span per delivery when the application installed
a tracer provider (docs/operations.md, "Tracing with OpenTelemetry"), and makes
it current around every handler kmq calls. Where user code runs the message
itself (iteration, ``poll()``, ``async for``, ``kmq.share``)::

    from kmq.tracing import use_span

    for msg in consumer:
        with use_span(msg):   # spans started here are children of the delivery's
            handle(msg)
        msg.ack()

The implementation lives in :mod:`kmq.telemetry.tracing`; importing this module
does not import ``opentelemetry``.
"""

from __future__ import annotations

from kmq.telemetry.tracing import use_span

__all__ = ["use_span"]
