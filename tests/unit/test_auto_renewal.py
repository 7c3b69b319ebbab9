"""consumer.auto_renew's keeper callbacks over the consumer's real parts (no Kafka, no threads):
the schedule's keys are the consumer's messages; a renewal buffers RENEW ranges and keeps the
messages' room in flow control, and messages that reach max_lease are counted and logged once."""

from __future__ import annotations

import logging
import threading

from kmq.consumer.ack_buffer import AckBuffer
from kmq.consumer.lease_expiry import LeaseExpiry
from kmq.consumer.leases import auto_renewal
from kmq.core.markers import Renew
from kmq.core.message import KmqMessage


def _messages(lock: threading.Lock, offsets: range) -> list[KmqMessage]:
    return [KmqMessage("q", 0, o, None, b"v", [], 0, None, lock) for o in offsets]


def test_the_keeper_renews_held_messages_as_ranges_and_reports_those_past_max_lease(caplog):
    lock = threading.Lock()
    buffer, expiry = AckBuffer(), LeaseExpiry(1.0)
    schedule, keeper, renewal = auto_renewal("q", 1.0, 2.5, 0.01, buffer, lock, expiry)
    held = _messages(lock, range(10, 14))
    schedule.track_many(held, 0.0)
    schedule.forget(held[1])  # settled in between: never renewed

    due = schedule.due(0.9)
    for lease, msgs in due.renew.items():
        renewal.renew(lease, msgs)
    renews = [(p, m) for p, m in buffer.drain().markers if isinstance(m, Renew)]
    assert [(p, m.ranges, m.lease_ms) for p, m in renews] == [(0, ((10, 1), (12, 2)), 1000)]
    assert set(expiry.extended) == {(0, 10), (0, 12), (0, 13)}  # they keep their room in flow control

    with caplog.at_level(logging.WARNING, logger="kmq.consumer.leases"):
        for t in (1.8, 2.4, 3.0):
            due = schedule.due(t)
            for lease, msgs in due.renew.items():
                renewal.renew(lease, msgs)
            if due.exhausted:
                renewal.exhausted_leases(due.exhausted)
    assert renewal.exhausted == 3
    assert len(schedule) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("3 message(s) of q (first q/0/10) reached consumer.max_lease")
