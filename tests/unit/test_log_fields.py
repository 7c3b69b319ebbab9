"""Structured log fields: one helper (kmq.core.log_fields), rendered as JSON fields by
``logging.format: json`` and used by the consumer's, writer's and tracker's lines."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from kmq.consumer import marker_sender
from kmq.core.log_fields import log_fields, message_fields, show_ranges
from kmq.core.markers import End, Renew
from kmq.core.message import KmqMessage
from kmq.core.outcome import HandlerOutcome, settle
from kmq.core.ranges import OffsetRange
from kmq.telemetry.logs import JsonFormatter
from tests.helpers.otel import TRACE_ID, TRACEPARENT


class _Buffer:
    def settled(self, *a) -> None: ...

    def renewed(self, *a) -> None: ...


def _msg(offset: int, headers=None) -> KmqMessage:
    return KmqMessage("orders", 2, offset, None, b"v", headers, 0, _Buffer(), threading.Lock())


def _json(record: logging.LogRecord) -> dict:
    return json.loads(JsonFormatter().format(record))


def test_a_message_line_carries_queue_partition_offset_origin_delivery_count_and_trace_id():
    copy = _msg(40, [("kmq-origin", b"orders/2/7"), ("kmq-delivery-count", b"3"), ("traceparent", TRACEPARENT)])
    assert message_fields(copy, outcome="nack") == {
        "queue": "orders", "partition": 2, "offset": 40, "origin": "orders/2/7", "delivery_count": 3,
        "trace_id": TRACE_ID, "outcome": "nack"}
    assert "trace_id" not in message_fields(_msg(1))  # no traceparent: no field, not a null


def test_a_range_line_carries_the_offsets_as_text_and_their_count():
    assert log_fields("orders", 0, ranges=[OffsetRange(5, 12), OffsetRange(20, 1)]) == {
        "queue": "orders", "partition": 0, "offsets": "5-16,20", "count": 13}
    assert show_ranges([OffsetRange(i * 2, 1) for i in range(30)], limit=3) == "0,2,4,..."


def test_the_json_formatter_renders_the_fields_and_the_text_format_ignores_them():
    record = logging.LogRecord("kmq.x", logging.WARNING, __file__, 1, "about %s", ("it",), None)
    record.__dict__.update(log_fields("orders", 1, 9, headers=[("traceparent", TRACEPARENT)]))
    out = _json(record)
    assert out["message"] == "about it" and out["level"] == "WARNING"
    assert (out["queue"], out["partition"], out["offset"], out["origin"], out["delivery_count"], out["trace_id"]) == (
        "orders", 1, 9, "orders/1/9", 1, TRACE_ID)
    assert logging.Formatter("%(levelname)s %(message)s").format(record) == "WARNING about it"


@pytest.mark.parametrize("outcome, action", [
    (HandlerOutcome("nack", delay=1.5, error=RuntimeError("db down")), "nack"),
    (HandlerOutcome("reject", reason="bad payload"), "reject"),
])
def test_the_handlers_nack_and_reject_lines_are_structured(caplog, outcome, action):
    msg = _msg(7, [("traceparent", TRACEPARENT), ("kmq-delivery-count", b"2")])
    with caplog.at_level(logging.WARNING, logger="kmq.core.outcome"):
        settle(msg, outcome)
    (record,) = caplog.records
    out = _json(record)
    assert msg.outcome == action
    assert {k: out[k] for k in ("queue", "partition", "offset", "origin", "delivery_count", "trace_id", "outcome")} == {
        "queue": "orders", "partition": 2, "offset": 7, "origin": "orders/2/7", "delivery_count": 2,
        "trace_id": TRACE_ID, "outcome": action}


def test_the_writers_given_up_markers_line_names_the_range():
    pending = [(3, End((OffsetRange(10, 5),)), 0.0), (4, Renew((OffsetRange(1, 1),), 1000), 0.0)]
    fields = marker_sender._given_up_fields("orders", pending)
    assert fields == {"queue": "orders", "partition": 3, "offsets": "10-14", "count": 5, "markers": 2,
                      "marker_types": "END,RENEW", "messages": 6}
