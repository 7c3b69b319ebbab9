"""The tracker's redelivery step, pure: every branch of plan() and settle() with controlled time."""

from __future__ import annotations

from collections import namedtuple

import pytest

from kmq.config import BackoffConfig
from kmq.core.copies import REASON_UNDELIVERABLE, Step
from kmq.core.lease_state import PartitionState
from kmq.core.markers import Closed, Nack, Outcome, Reject, Start, encode
from kmq.core.ranges import OffsetRange
from kmq.core.redelivery_plan import (
    SENT,
    below,
    Defer,
    Send,
    SendResult,
    closed_chunks,
    closed_ranges_limit,
    plan,
    retry_at_ms,
    retry_delay_s,
    settle,
    wanted_ranges,
)

Rec = namedtuple("Rec", "key value headers")
BACKOFF = BackoffConfig(initial=1.0, max=8.0, multiplier=2.0)
NOW = 100_000


def state(max_deliveries: int = 3) -> PartitionState:
    return PartitionState(BACKOFF.delay, max_deliveries)


def rec(count: int | None = None, key=b"k", value=b"v", headers=()) -> Rec:
    h = list(headers) + ([("kmq-delivery-count", str(count).encode())] if count else [])
    return Rec(key, value, h)


def started(n: int, ts: int = 0, lease_ms: int = 1000) -> PartitionState:
    s = state()
    s.apply(Start([(0, n)], lease_ms=lease_ms, owner="w"), 0, ts)
    return s


def planned(s: PartitionState, records: dict, missing=(), log_end=None, now=NOW):
    items = s.due(now)
    return items, plan(s, items, records, missing, log_end, now)


# ---------------------------------------------------------------- plan
def test_an_expired_lease_is_copied_with_the_count_read_from_the_record():
    s = started(2)
    items, p = planned(s, {0: rec(), 1: rec(count=2)})
    assert p.sends == [Send(0, Step.COPY, 1, "timeout", "", items[0].due_ms, 0),
                       Send(1, Step.COPY, 2, "timeout", "", items[0].due_ms, 0)]
    assert (p.missing, p.defer, p.unread) == ([], [], [])


def test_a_record_whose_backoff_is_not_over_waits_grouped_by_its_due_time_and_count():
    s = started(4)  # lease ends at 1 s; due at 2 s (count 1); count 2 waits until 1 s + 2 s, count 3 ...
    _, p = planned(s, {0: rec(count=2), 1: rec(count=2), 2: rec(), 3: rec(count=2)}, now=2_500)
    assert [x.offset for x in p.sends] == [2]
    assert p.defer == [Defer((OffsetRange(0, 2), OffsetRange(3, 1)), 3_000, 2)]
    assert p.defer[0].offset_count == 3


def test_rejected_messages_go_to_the_dlq_with_the_reason_text():
    s = started(1)
    s.apply(Reject([(0, 1)], reason="bad payload"), 1, 5)
    _, p = planned(s, {0: rec()})
    assert p.sends == [Send(0, Step.DEAD_LETTER, 1, "rejected", "bad payload", 5, 0)]


@pytest.mark.parametrize("nack, reason", [(False, "timeout"), (True, "nack-limit")])
def test_the_last_delivery_goes_to_the_dlq_with_why(nack, reason):
    s = started(1)
    if nack:
        s.apply(Nack([(0, 1)], delay_ms=0), 1, 5)
    _, p = planned(s, {0: rec(count=3)})
    assert [(x.step, x.reason, x.count) for x in p.sends] == [(Step.DEAD_LETTER, reason, 3)]


def test_a_tombstone_cannot_be_copied_and_is_dead_lettered_as_undeliverable():
    _, p = planned(started(1), {0: rec(key=None, value=None)})
    ((send,),) = [p.sends]
    assert (send.step, send.reason) == (Step.DEAD_LETTER, REASON_UNDELIVERABLE) and "tombstone" in send.error


def test_null_header_values_and_unreadable_counts_do_not_stop_a_copy():
    _, p = planned(started(1), {0: rec(headers=[("trace", None), ("kmq-delivery-count", b"\xff")])})
    assert [(x.step, x.count) for x in p.sends] == [(Step.COPY, 1)]


def test_offsets_missing_from_the_log_are_closed_as_missing_and_never_replaced():
    _, p = planned(started(3), {0: rec()}, missing=[(1, 2)])
    assert p.missing == [OffsetRange(1, 2)] and [x.offset for x in p.sends] == [0]


def test_a_read_that_ends_below_started_offsets_closes_none_of_them_they_wait_with_a_backoff():
    """A reader stopped at the last stable offset (read_committed, a transaction still open), or at a
    new leader's lagging high-water mark: offsets 5..9 were fetched by a worker, so they exist. The
    old rule closed them as missing, also when the reader reported them missing itself."""
    s = started(10)
    items, p = planned(s, {o: rec() for o in range(5)}, missing=[(5, 5)], log_end=5)
    assert p.missing == [] and p.unread == []
    assert p.past_end == [OffsetRange(5, 5)] and p.past_end_at_ms == NOW + 500 and p.log_end == 5
    assert [x.offset for x in p.sends] == [0, 1, 2, 3, 4]


def test_a_read_that_ends_below_them_never_touches_the_live_leases_of_other_workers():
    s = state()
    s.apply(Start([(0, 5)], lease_ms=1000, owner="a"), 0, 0)  # due at NOW
    s.apply(Start([(5, 5)], lease_ms=600_000, owner="b"), 1, 0)  # live for ten minutes
    items = s.due(NOW)
    assert wanted_ranges(items) == [OffsetRange(0, 5)]
    p = plan(s, items, {0: rec(), 1: rec(), 2: rec()}, [], 3, NOW)  # a high-water mark lagging at 3
    assert p.missing == [] and p.past_end == [OffsetRange(3, 2)] and [x.offset for x in p.sends] == [0, 1, 2]


def test_only_offsets_the_read_passed_below_the_log_end_are_closed_as_missing():
    s = started(10)
    # 0..1 deleted below the log start (retention, DeleteRecords); 2..4 read; the log ends at 5.
    _, p = planned(s, {2: rec(), 3: rec(), 4: rec()}, missing=[(0, 2), (5, 5)], log_end=5)
    assert p.missing == [OffsetRange(0, 2)] and p.past_end == [OffsetRange(5, 5)]


def test_the_backoff_past_the_log_end_grows_with_the_earlier_attempts():
    s = started(2)
    items = s.due(NOW)
    s.hold_from(0, NOW, NOW + 500)  # read once before and found past the end
    items = s.due(NOW + 500)
    assert items[0].failures == 1
    p = plan(s, items, {}, [], 0, NOW + 500)
    assert p.past_end == [OffsetRange(0, 2)] and p.past_end_at_ms == NOW + 500 + 1000


def test_below_cuts_due_items_at_the_log_end():
    s = state()
    s.apply(Start([(0, 4), (10, 4)], lease_ms=1000), 0, 0)
    items = s.due(NOW)
    assert [i.ranges for i in below(items, 12)] == [(OffsetRange(0, 4),), (OffsetRange(10, 2),)]
    assert [i.ranges for i in below(items, 3)] == [(OffsetRange(0, 3),)]
    assert below(items, 0) == []


def test_a_missing_offset_already_closed_by_an_end_is_not_closed_again():
    s = started(3)
    items = s.due(NOW)
    s.close([(1, 1)])  # an END read meanwhile
    p = plan(s, items, {0: rec()}, [(1, 2)], None, NOW)
    assert p.missing == [OffsetRange(2, 1)] and p.unread == []


def test_offsets_neither_read_nor_missing_are_retried_not_forgotten():
    s = started(3)
    items, p = planned(s, {0: rec()})
    assert p.unread == [OffsetRange(1, 2)] and p.retry_at_ms == NOW + 500
    assert wanted_ranges(items) == [OffsetRange(0, 3)]
    s.close([(1, 1)])  # closed meanwhile (an END): nothing to retry there
    assert plan(s, items, {0: rec()}, [], None, NOW).unread == [OffsetRange(2, 1)]


# ---------------------------------------------------------------- settle
COPY = Send(0, Step.COPY, 1, "timeout", due_ms=1, failures=0)
DEAD = Send(1, Step.DEAD_LETTER, 3, "timeout", due_ms=1, failures=2)
REF = Send(2, Step.REFERENCE, 1, REASON_UNDELIVERABLE, "dead letter refused", due_ms=1, failures=0)
TOO_LARGE = SendResult("too_large", True, "MessageSizeTooLargeError: too large")
BROKER_DOWN = SendResult("send_failed", False, "KafkaTimeoutError")


def test_acknowledged_sends_close_with_the_outcome_of_their_step():
    out = settle([COPY, DEAD, REF], [SENT, SENT, SENT], NOW)
    assert dict(out.closed) == {Outcome.REDELIVERED: [COPY], Outcome.DEAD_LETTERED: [DEAD],
                                Outcome.UNDELIVERABLE: [REF]}
    assert (out.fallbacks, out.retry, out.retry_at_ms, out.unreferenced) == ([], [], None, [])


def test_a_copy_refused_for_good_is_dead_lettered_as_undeliverable():
    out = settle([COPY], [TOO_LARGE], NOW)
    (fb,) = out.fallbacks
    assert (fb.offset, fb.step, fb.reason, fb.count) == (0, Step.DEAD_LETTER, REASON_UNDELIVERABLE, 1)
    assert fb.error == "copy to the queue refused: MessageSizeTooLargeError: too large"
    assert not out.closed and not out.retry


def test_a_dead_letter_refused_for_good_becomes_a_reference_with_the_whole_story():
    refused_copy = settle([COPY], [TOO_LARGE], NOW).fallbacks[0]
    (ref,) = settle([refused_copy], [TOO_LARGE], NOW).fallbacks
    assert (ref.step, ref.reason) == (Step.REFERENCE, REASON_UNDELIVERABLE)
    assert ref.error == ("dead letter (undeliverable) refused by the DLQ: MessageSizeTooLargeError: too large; "
                         "copy to the queue refused: MessageSizeTooLargeError: too large")
    (ref2,) = settle([DEAD], [TOO_LARGE], NOW).fallbacks
    assert ref2.error.startswith("dead letter (timeout) refused by the DLQ") and ref2.count == 3


def test_a_reference_refused_for_good_is_closed_undeliverable_and_reported_as_unreferenced():
    out = settle([REF], [SendResult("invalid_record", True, "InvalidRecordError")], NOW)
    assert dict(out.closed) == {Outcome.UNDELIVERABLE: [REF]} and out.unreferenced == [REF]


def test_transient_failures_are_retried_after_the_backoff_of_the_worst_one_and_the_rest_closed():
    out = settle([COPY, DEAD, REF], [BROKER_DOWN, BROKER_DOWN, SENT], NOW)
    assert out.retry == [COPY, DEAD] and out.retry_at_ms == NOW + 2_000  # DEAD failed twice before
    assert dict(out.closed) == {Outcome.UNDELIVERABLE: [REF]} and out.closed_offsets(Outcome.UNDELIVERABLE) == [2]


def test_results_must_match_the_sends():
    with pytest.raises(ValueError):
        settle([COPY, DEAD], [SENT], NOW)


@pytest.mark.parametrize("failures, delay", [(0, 0.5), (1, 1.0), (2, 2.0), (5, 16.0), (6, 30.0), (10**6, 30.0)])
def test_failed_attempts_back_off_doubling_up_to_30_seconds(failures, delay):
    assert retry_delay_s(failures) == delay and retry_at_ms(failures, NOW) == NOW + int(delay * 1000)


# ---------------------------------------------------------------- CLOSED markers
def test_closed_markers_split_ranges_longer_than_u32_into_separate_markers():
    groups = closed_chunks([OffsetRange(0, 3 * 0xFFFFFFFF + 5), OffsetRange(1 << 40, 7)])
    assert [len(g) for g in groups] == [1, 1, 1, 2]
    for g in groups:
        assert Closed(tuple(g), Outcome.MISSING).offset_count() == sum(r.count for r in g)
    assert sum(r.count for g in groups for r in g) == 3 * 0xFFFFFFFF + 12


def test_closed_markers_fit_the_producer_request_size():
    ranges = [OffsetRange(i * 2, 1) for i in range(1000)]
    groups = closed_chunks(ranges, max_ranges=closed_ranges_limit(2048))
    assert all(len(encode(Closed(tuple(g), Outcome.REDELIVERED))) <= 2048 - 512 + 16 for g in groups)
    assert sum(len(g) for g in groups) == 1000
    assert closed_ranges_limit(100) == 1 and closed_ranges_limit(1 << 30) == 0xFFFF
