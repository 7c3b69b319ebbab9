"""Scheduled messages at hand-over: not-yet-due ones go back to the tracker (the consumer's fetcher).

A record whose ``kmq-not-before`` time has not come is STARTed like any record
(its START and commit are in Kafka) but never handed to user code: it is given
back at once with a NACK *not a delivery* whose delay runs to its time, so the
tracker copies it when it is due, with the delivery count it had. A malformed
header is delivered now (with a warning); a time beyond the queue's longest
delay is rejected to the DLQ (:mod:`kmq.core.schedule` decides).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from kmq.core.errors import MessageAlreadySettled
from kmq.core.message import KmqMessage
from kmq.core.schedule import Verdict, decide

__all__ = ["SCHEDULED", "MALFORMED", "TOO_FAR", "hold_back_scheduled"]

log = logging.getLogger(__name__)

#: ``kmq_consumer_messages_total{outcome}`` labels.
SCHEDULED, MALFORMED, TOO_FAR = "scheduled", "schedule_malformed", "schedule_too_far"


def hold_back_scheduled(messages: list[KmqMessage], scheduled: list[KmqMessage], longest_ms: int, queue: str,
                        count: Callable[[str, int], Any], now_ms: int | None = None) -> list[KmqMessage]:
    """``messages`` without the scheduled ones not due yet (given back until their time) or too far
    ahead (rejected); ``count(outcome, n)`` counts them. ``scheduled``: those of ``messages`` with a
    ``kmq-not-before`` header, as the fetch pipeline noted them at the poll (the only headers looked
    at here; none, most batches: nothing to do)."""
    if not scheduled:
        return messages
    now = int(time.time() * 1000) if now_ms is None else now_ms
    gone: set[int] = set()
    for m in scheduled:
        d = decide(m._headers, now, longest_ms)
        if d.verdict is Verdict.DELIVER:
            continue
        try:
            if d.verdict is Verdict.HOLD:
                m._give_back(d.delay_ms / 1000)
                count(SCHEDULED, 1)
                gone.add(id(m))
                continue
            if d.verdict is Verdict.REJECT:
                m.reject(d.reason)
                count(TOO_FAR, 1)
                log.warning("%s: %s/%d/%d rejected to the DLQ: %s", queue, m.topic, m.partition, m.offset, d.reason)
                gone.add(id(m))
                continue
        except MessageAlreadySettled:  # cannot happen before hand-over; never lose the message over it
            gone.add(id(m))
            continue
        count(MALFORMED, 1)
        log.warning("%s: %s/%d/%d: %s", queue, m.topic, m.partition, m.offset, d.reason)
    return [m for m in messages if id(m) not in gone] if gone else messages
