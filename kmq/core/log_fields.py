"""The structured fields of a log line about one message or a range of offsets.

Pure: no I/O. Passed as ``extra=`` to a ``logging`` call, they become JSON
fields with ``logging.format: json`` (:class:`kmq.telemetry.logs.JsonFormatter`)
and are ignored by the text format, so a line keeps its readable message and
a log shipper can still filter by queue, partition, offset, origin, delivery
count or trace id:

* ``queue``, ``partition``; a line about several partitions of one queue (assigned, revoked)
  carries ``queue`` and ``partitions`` (a JSON array of numbers) instead;
* for one message: ``offset``, ``origin`` (``topic/partition/offset`` of its
  first delivery), ``delivery_count`` and ``trace_id`` (the W3C
  ``traceparent`` header's trace id, when the record has one);
* for a range: ``offsets`` (``"5-16,20"``) and ``count``.
"""

from __future__ import annotations

from typing import Any, Iterable

from kmq.core.message import Headers, delivery_count_of, origin_of
from kmq.core.ranges import OffsetRange

__all__ = ["log_fields", "message_fields", "partitions_fields", "trace_id_of", "show_ranges"]

_ZERO_TRACE = "0" * 32


def trace_id_of(headers: Headers | None) -> str | None:
    """The trace id of a record's W3C ``traceparent`` header (32 hex digits), None without a valid one."""
    for k, v in headers or ():
        if k == "traceparent" and v:
            parts = bytes(v).decode("ascii", "replace").split("-")
            if len(parts) >= 4 and len(parts[1]) == 32 and parts[1] != _ZERO_TRACE:
                return parts[1].lower()
    return None


def show_ranges(ranges: Iterable[OffsetRange], limit: int = 20) -> str:
    """``"5-16,20"``: offset ranges as text, the first ``limit`` of them (``",..."`` after)."""
    parts, more = [], False
    for i, r in enumerate(ranges):
        if i == limit:
            more = True
            break
        parts.append(f"{r.first}" if r.count == 1 else f"{r.first}-{r.last}")
    return ",".join(parts) + (",..." if more else "")


def log_fields(queue: str, partition: int, offset: int | None = None, *, headers: Headers | None = None,
               ranges: Iterable[OffsetRange] | None = None, **more: Any) -> dict[str, Any]:
    """``extra=`` for a line about the message at ``offset`` (its ``headers`` give origin, delivery
    count and trace id) or about ``ranges``; ``more`` adds fields (e.g. ``outcome``)."""
    fields: dict[str, Any] = {"queue": queue, "partition": partition}
    if offset is not None:
        fields["offset"] = offset
        fields["origin"] = origin_of(headers, queue, partition, offset)
        fields["delivery_count"] = delivery_count_of(headers)
        trace_id = trace_id_of(headers)
        if trace_id is not None:
            fields["trace_id"] = trace_id
    if ranges is not None:
        ranges = list(ranges)
        fields["offsets"] = show_ranges(ranges)
        fields["count"] = sum(r.count for r in ranges)
    fields.update(more)
    return fields


def message_fields(msg: Any, **more: Any) -> dict[str, Any]:
    """:func:`log_fields` of a message (anything with ``topic``, ``partition``, ``offset`` and,
    optionally, ``headers``)."""
    return log_fields(msg.topic, msg.partition, msg.offset, headers=getattr(msg, "headers", None), **more)


def partitions_fields(queue: str, partitions: Iterable[int], **more: Any) -> dict[str, Any]:
    """``extra=`` for a line about several partitions of ``queue`` (assigned, revoked)."""
    return {"queue": queue, "partitions": sorted(partitions), **more}
