"""Scheduled delivery (``kmq-not-before``): the worker's decision per record and the producer helper, pure."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

import kmq
from kmq.consumer.scheduled import MALFORMED, SCHEDULED, TOO_FAR, hold_back_scheduled
from kmq.core.message import NACK, REJECT, KmqMessage
from kmq.core.schedule import (
    DEFAULT_LONGEST_DELAY_S,
    HEADER_NOT_BEFORE,
    Decision,
    ScheduleError,
    Verdict,
    decide,
    longest_delay_ms,
    schedule,
)
from kmq.core.settlement import Released

NOW = 1_765_000_000_000
LONGEST = 3_600_000


def nb(value: bytes) -> list[tuple[str, bytes]]:
    return [("trace", b"x"), (HEADER_NOT_BEFORE, value)]


@pytest.mark.parametrize("headers, verdict, delay_ms", [
    (None, Verdict.DELIVER, 0),
    ([("other", b"1")], Verdict.DELIVER, 0),
    (nb(b"%d" % NOW), Verdict.DELIVER, 0),  # its time has come
    (nb(b"%d" % (NOW - 5000)), Verdict.DELIVER, 0),
    (nb(b"%d" % (NOW + 1)), Verdict.HOLD, 1),
    (nb(b"%d" % (NOW + LONGEST)), Verdict.HOLD, LONGEST),
    (nb(b"%d" % (NOW + LONGEST + 1)), Verdict.REJECT, 0),
    (nb(b""), Verdict.MALFORMED, 0),
    (nb(b"-5"), Verdict.MALFORMED, 0),
    (nb(b"12.5"), Verdict.MALFORMED, 0),
    (nb("١٢٣".encode()), Verdict.MALFORMED, 0),  # not ascii digits
    (nb(b"9" * 16), Verdict.MALFORMED, 0),  # longer than any epoch ms
    (nb(None), Verdict.MALFORMED, 0),  # a null header value
])
def test_the_worker_decides_by_the_header_and_its_own_clock(headers, verdict, delay_ms):
    d = decide(headers, NOW, LONGEST)
    assert (d.verdict, d.delay_ms) == (verdict, delay_ms)
    if verdict in (Verdict.REJECT, Verdict.MALFORMED):
        assert HEADER_NOT_BEFORE in d.reason


def test_the_last_header_counts():
    assert decide(nb(b"%d" % (NOW + 10)) + nb(b"%d" % NOW), NOW, LONGEST) == Decision(Verdict.DELIVER)


def test_a_time_beyond_the_longest_delay_is_rejected_with_a_reason_naming_the_fix():
    d = decide(nb(b"%d" % (NOW + 2 * LONGEST)), NOW, LONGEST)
    assert d.verdict is Verdict.REJECT and "longest delay of 3600s" in d.reason and "markers retention" in d.reason


def test_the_longest_delay_is_half_the_markers_retention_within_the_nack_field():
    assert longest_delay_ms(7 * 86400) == 302_400_000 == DEFAULT_LONGEST_DELAY_S * 1000
    assert longest_delay_ms(365 * 86400) == 0xFFFFFFFF  # u32 delay_ms


def test_schedule_builds_the_header_from_a_delay_or_a_time():
    assert schedule(30, now=1000.0) == [(HEADER_NOT_BEFORE, b"1030000")]
    at = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
    assert schedule(at=at, now=at.timestamp() - 60) == [(HEADER_NOT_BEFORE, b"%d" % (at.timestamp() * 1000))]
    assert schedule(at=1000.5, now=1000.0) == [(HEADER_NOT_BEFORE, b"1000500")]
    assert kmq.schedule is schedule and kmq.HEADER_NOT_BEFORE == HEADER_NOT_BEFORE


@pytest.mark.parametrize("call, match", [
    (lambda: schedule(DEFAULT_LONGEST_DELAY_S + 1, now=0.0), "beyond the queue's longest delay"),
    (lambda: schedule(120, longest=60, now=0.0), "longest delay of 60s"),
    (lambda: schedule(float("inf"), now=0.0), "finite"),
    (lambda: schedule(at=datetime(2026, 1, 1), now=0.0), "no time zone"),
])
def test_schedule_refuses_what_the_queue_cannot_keep(call, match):
    with pytest.raises(ScheduleError, match=match) as info:
        call()
    assert isinstance(info.value, ValueError) and isinstance(info.value, kmq.KmqError)


def test_schedule_takes_a_delay_or_a_time():
    with pytest.raises(TypeError):
        schedule()
    with pytest.raises(TypeError):
        schedule(1, at=datetime.now(timezone.utc) + timedelta(seconds=1))


# ------------------------------------------------------------------ at hand-over
class Settled:
    def __init__(self) -> None:
        self.outcomes: list[tuple[int, str, object]] = []

    def settled(self, msg: KmqMessage, outcome: str, arg: object) -> None:
        self.outcomes.append((msg.offset, outcome, arg))


def test_at_hand_over_not_due_messages_go_back_without_a_delivery_and_the_rest_are_handed():
    settler, lock, counted = Settled(), threading.Lock(), []
    msgs = [KmqMessage("q", 0, off, None, b"v", h, 0, settler, lock) for off, h in [
        (0, None), (1, nb(b"%d" % (NOW + 2500))), (2, nb(b"soon")), (3, nb(b"%d" % (NOW + 10 * LONGEST))),
        (4, nb(b"%d" % NOW))]]
    scheduled = [m for m in msgs if m.offset]  # as the fetch pipeline notes them at the poll
    handed = hold_back_scheduled(msgs, scheduled, LONGEST, "q", lambda outcome, n: counted.append((outcome, n)),
                                 now_ms=NOW)
    assert [m.offset for m in handed] == [0, 2, 4]  # due, malformed (delivered now), due
    assert [(o, k) for o, k, _ in settler.outcomes] == [(1, NACK), (3, REJECT)]
    delay = settler.outcomes[0][2]
    assert isinstance(delay, Released) and delay == 2.5  # a NACK "not a delivery" until its time
    assert "longest delay" in settler.outcomes[1][2]
    assert counted == [(SCHEDULED, 1), (MALFORMED, 1), (TOO_FAR, 1)]


def test_at_hand_over_a_batch_without_headers_is_handed_as_it_is():
    msgs = [KmqMessage("q", 0, off, None, b"v", None, 0, Settled(), threading.Lock()) for off in range(3)]
    assert hold_back_scheduled(msgs, [], LONGEST, "q", lambda *_: None, now_ms=NOW) is msgs
