"""The tracker's pure lease state, driven with controlled time (no broker, no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.config import BackoffConfig
from kmq.core.markers import Closed, End, Nack, Outcome, Reject, Renew, Start, decode, encode
from kmq.core.ranges import OffsetRange, RangeSet
from kmq.core.lease_state import Action, PartitionState, Reason

BACKOFF = BackoffConfig(initial=1.0, max=8.0, multiplier=2.0)


def state(max_deliveries: int = 3) -> PartitionState:
    return PartitionState(BACKOFF.delay, max_deliveries)


def R(first: int, count: int) -> list[tuple[int, int]]:
    return [(first, count)]


def test_start_opens_and_end_closes_with_fragmentation():
    s = state()
    s.apply(Start(R(100, 500), lease_ms=30_000, owner="w1"), 0, 1_000)
    assert s.in_flight == 500 and s.segment_count == 1
    s.apply(End([(150, 10), (300, 5)]), 1, 1_100)
    assert s.in_flight == 485
    assert s.segment_count == 3  # two holes split one segment into three, not 485
    assert s.open_ranges() == [OffsetRange(100, 50), OffsetRange(160, 140), OffsetRange(305, 295)]
    s.apply(End(R(100, 500)), 2, 1_200)
    assert s.in_flight == 0 and s.segment_count == 0
    assert s.committable_offset() == 3  # nothing open: the position


@pytest.mark.parametrize(
    "now_ms, expect_due",
    [
        (30_999, False),  # lease 30 s from t=1 s ends at 31 s ...
        (31_999, False),  # ... plus the first backoff step (1 s)
        (32_000, True),
    ],
)
def test_timeout_is_due_after_lease_plus_first_backoff(now_ms, expect_due):
    s = state()
    s.apply(Start(R(0, 10), lease_ms=30_000), 0, 1_000)
    assert s.next_due_ms() == 32_000
    items = s.due(now_ms)
    assert bool(items) is expect_due
    if items:
        (item,) = items
        assert item.reason is Reason.TIMEOUT and item.ranges == (OffsetRange(0, 10),)
        assert item.deadline_ms == 31_000 and item.start_offset == 0


def test_due_items_are_handed_out_once_until_deferred_or_retried():
    s = state()
    s.apply(Start(R(0, 4), lease_ms=1_000), 0, 0)
    assert len(s.due(10_000)) == 1
    assert s.due(10_000) == []
    assert s.in_flight == 4  # still open, still pins the commit
    assert s.committable_offset() == 0
    s.retry(R(0, 4), until_ms=12_000)
    assert s.due(11_999) == []
    (item,) = s.due(12_000)
    assert item.failures == 1


def test_renew_moves_the_deadline_and_renew_of_closed_offsets_is_late():
    s = state()
    s.apply(Start(R(0, 10), lease_ms=5_000), 0, 0)
    s.apply(Renew(R(0, 5), lease_ms=20_000), 1, 4_000)
    # offsets 5..9 keep the old deadline (5 s + 1 s backoff), 0..4 move to 24 s + 1 s
    (item,) = s.due(6_000)
    assert item.ranges == (OffsetRange(5, 5),)
    assert s.due(24_999) == []
    s.close(item.ranges)
    eff = s.apply(Renew(R(5, 5), lease_ms=20_000), 2, 7_000)
    assert eff.late == 5
    eff = s.apply(End(R(0, 10)), 3, 8_000)
    assert eff.closed == 5 and eff.late == 5
    assert s.in_flight == 0


@pytest.mark.parametrize("delay_ms", [0, 2_500])
def test_nack_sets_the_due_time_without_backoff(delay_ms):
    s = state()
    s.apply(Start(R(10, 3), lease_ms=60_000), 0, 1_000)
    s.apply(Nack(R(11, 1), delay_ms=delay_ms), 1, 2_000)
    assert s.due(2_000 + delay_ms - 1) == []
    (item,) = s.due(2_000 + delay_ms)
    assert item.reason is Reason.NACK and item.ranges == (OffsetRange(11, 1),)
    assert s.plan(item, count=1, now_ms=2_000 + delay_ms).action is Action.REDELIVER
    p = s.plan(item, count=3, now_ms=2_000 + delay_ms)
    assert (p.action, p.dlq_reason) == (Action.DEAD_LETTER, "nack-limit")


def test_reject_dead_letters_at_once_with_its_reason():
    s = state()
    s.apply(Start(R(0, 3), lease_ms=60_000), 0, 1_000)
    s.apply(Reject(R(2, 1), reason="bad payload"), 1, 1_500)
    (item,) = s.due(1_500)
    assert item.reason is Reason.REJECT and item.error == "bad payload"
    p = s.plan(item, count=1, now_ms=1_500)
    assert (p.action, p.dlq_reason) == (Action.DEAD_LETTER, "rejected")


@pytest.mark.parametrize(
    "count, expect",
    [
        (1, (Action.REDELIVER, None)),  # deadline 1 s + backoff 1 s = 2 s <= now
        (2, (Action.WAIT, 1_000 + 2_000)),  # backoff doubles
        (3, (Action.DEAD_LETTER, "timeout")),  # max_deliveries reached
    ],
)
def test_plan_by_delivery_count(count, expect):
    s = state(max_deliveries=3)
    s.apply(Start(R(0, 1), lease_ms=1_000), 0, 0)
    (item,) = s.due(2_000)
    p = s.plan(item, count, now_ms=2_000)
    assert p.action is expect[0]
    assert (p.dlq_reason if p.action is Action.DEAD_LETTER else p.until_ms) == expect[1]


def test_deferred_offsets_come_back_with_their_known_count():
    s = state()
    s.apply(Start(R(0, 2), lease_ms=1_000), 0, 0)
    (item,) = s.due(2_000)
    s.defer(R(1, 1), until_ms=3_000, count=2)
    s.close(R(0, 1))
    assert s.due(2_999) == []
    (item,) = s.due(3_000)
    assert item.count == 2 and item.ranges == (OffsetRange(1, 1),)
    assert s.plan(item, 2, 3_000).action is Action.REDELIVER


def test_repeated_start_takes_the_newer_lease_and_moves_the_commit():
    s = state()
    s.apply(Start(R(0, 10), lease_ms=1_000, owner="a"), 5, 0)
    s.apply(Start(R(5, 10), lease_ms=60_000, owner="b"), 6, 500)
    assert s.in_flight == 15
    assert s.committable_offset() == 5
    s.apply(End(R(0, 5)), 7, 600)
    assert s.committable_offset() == 6  # START 5 has nothing open any more
    (item,) = s.due(2_000) or [None]
    assert item is None  # offsets 5..9 now live under the 60 s lease
    s.apply(End(R(5, 10)), 8, 700)
    assert s.committable_offset() == 9


def test_closed_read_back_closes_and_later_end_is_late():
    s = state()
    s.apply(Start(R(0, 3), lease_ms=1_000), 0, 0)
    eff = s.apply(Closed(R(0, 3), Outcome.REDELIVERED), 1, 3_000)
    assert eff.closed == 3 and s.in_flight == 0
    assert s.apply(End(R(0, 3)), 2, 3_500).late == 3
    # a START for the same offsets (re-polled original) opens them again: not late any more
    s.apply(Start(R(0, 3), lease_ms=1_000), 3, 4_000)
    assert s.apply(End(R(0, 3)), 4, 4_100).late == 0


def test_memory_is_per_segment_not_per_message():
    s = state()
    for b in range(2_000):
        s.apply(Start(R(b * 500, 500), lease_ms=30_000), b, b)
    assert s.in_flight == 1_000_000 and s.segment_count == 2_000


def test_oldest_age_and_committable_before_anything_read():
    s = state()
    assert s.committable_offset() is None and s.oldest_age_s(10) == 0.0
    s.apply(Start(R(0, 1), lease_ms=1_000), 3, 1_000)
    s.apply(Start(R(1, 1), lease_ms=1_000), 4, 2_000)
    assert s.oldest_age_s(5_000) == 4.0
    s.skip(5)
    assert s.position == 6 and s.committable_offset() == 3


# ------------------------------------------------------------------ property test
offsets = st.integers(min_value=0, max_value=60)
rng = st.tuples(offsets, st.integers(min_value=1, max_value=12))
kinds = st.sampled_from(["start", "start", "end", "end", "renew", "nack", "reject", "closed", "due", "close"])
ops = st.lists(st.tuples(kinds, rng, st.integers(min_value=0, max_value=5_000)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_model_in_flight_and_commit_never_pass_an_open_start(ops):
    """in_flight == |started - closed| and the committable offset never passes
    the START marker of an open offset, for random marker sequences."""
    s = state()
    model: dict[int, int] = {}  # open offset -> marker offset of its START
    now = 0
    for moff, (kind, (first, count), dt) in enumerate(ops):
        now += dt
        rs = [(first, count)]
        if kind == "start":
            s.apply(Start(rs, lease_ms=1_000), moff, now)
            model.update({o: moff for o in range(first, first + count)})
        elif kind == "end":
            s.apply(End(rs), moff, now)
            for o in range(first, first + count):
                model.pop(o, None)
        elif kind == "renew":
            s.apply(Renew(rs, lease_ms=2_000), moff, now)
        elif kind == "nack":
            s.apply(Nack(rs, delay_ms=100), moff, now)
        elif kind == "reject":
            s.apply(Reject(rs, reason="x"), moff, now)
        elif kind == "closed":
            s.apply(Closed(rs, Outcome.REDELIVERED), moff, now)
            for o in range(first, first + count):
                model.pop(o, None)
        elif kind == "due":
            s.skip(moff)
            counts = (1, 2, 7, 50, 500, 5_000)
            at_least = {k: s.due_at_least(now, k) for k in counts}
            items = s.due(now)
            handed_out = sum(r.count for item in items for r in item.ranges)
            assert at_least == {k: k <= handed_out for k in counts}
            for item in items:
                # every handed-out offset is open; send half back, close the rest
                for r in item.ranges:
                    assert all(o in model for o in r.offsets())
                    if r.first % 2:
                        s.retry([r], now + 10)
                    else:
                        s.close([r])
                        for o in r.offsets():
                            model.pop(o)
        else:
            s.skip(moff)
            s.close(rs)
            for o in range(first, first + count):
                model.pop(o, None)
        assert s.in_flight == len(model)
        assert RangeSet(s.open_ranges()) == RangeSet((o, 1) for o in model)
        c = s.committable_offset()
        if model:
            assert c is not None and c <= min(model.values())
            assert c == min(model.values())
        else:
            assert c == moff + 1
    s.release()
    # nothing open is lost: every open offset is eventually handed out
    handed = RangeSet()
    for item in s.due(10**12):
        for r in item.ranges:
            handed.add(r.first, r.count)
    assert handed == RangeSet((o, 1) for o in model)


def test_codec_round_trip_feeds_the_state():
    s = state()
    s.apply(decode(encode(Start(R(0, 5), lease_ms=100, owner="w"))), 0, 0)
    s.apply(decode(encode(End(R(1, 2)))), 1, 1)
    assert s.in_flight == 3


def test_due_at_least_counts_what_due_would_hand_out_without_handing_it_out():
    s = state()
    s.apply(Start(R(0, 10), lease_ms=1_000), 0, 0)  # due at 2.0 s
    s.apply(Start(R(10, 5), lease_ms=1_000), 1, 500)  # due at 2.5 s
    s.apply(Renew(R(0, 4), lease_ms=5_000), 2, 600)  # 0-3 due at 6.6 s now; their old entry is stale
    assert s.due_at_least(2_000, 6) and not s.due_at_least(2_000, 7)
    assert s.due_at_least(2_500, 11) and not s.due_at_least(2_500, 12)
    assert s.due_at_least(9_000, 15) and not s.due_at_least(1_999, 1)
    assert s.in_flight == 15 and len(s.due(2_500)) == 2  # nothing was handed out by counting
    assert not s.due_at_least(2_500, 1)  # handed out: no longer counted


def test_due_honours_its_limit_inside_one_huge_segment():
    from kmq.core.markers import Start as _Start

    st = PartitionState(lambda n: 0.0, 5)
    st.apply(_Start([(0, 0xFFFFFFFF)], lease_ms=10), 0, 0)
    first = st.due(100, limit=5000)
    assert [(r.first, r.count) for i in first for r in i.ranges] == [(0, 5000)]
    second = st.due(100, limit=5000)
    assert [(r.first, r.count) for i in second for r in i.ranges] == [(5000, 5000)]
    st.close([(0, 10_000)])
    assert st.in_flight == 0xFFFFFFFF - 10_000 and st.segment_count == 1
    assert st.open_from(1 << 40) == [] and st.open_from(20_000)[0].first == 20_000


def test_hold_from_holds_everything_due_past_a_log_end_in_one_go_and_no_live_lease():
    st = PartitionState(lambda n: 0.0, 5)
    st.apply(Start([(0, 10)], lease_ms=10), 0, 0)  # due at 10
    st.apply(Start([(10, 0xFFFFFFFF)], lease_ms=10), 1, 0)  # a START of 4 billion offsets, due at 10
    st.apply(Start([(0x1_0000_0100, 5)], lease_ms=60_000, owner="b"), 2, 0)  # a live lease past the end
    handed = st.due(100, limit=5000)
    assert sum(i.offset_count for i in handed) == 5000  # 0..4999: part of the huge START is not handed out
    held = st.hold_from(6, 100, 600)
    # Handed out or due: held, the 4 billion at once (one segment each side of the cut); the live lease kept.
    assert held == [OffsetRange(6, 4 + 0xFFFFFFFF)] and st.segment_count <= 5
    assert st.due(599) == [] and st.failing == 4 + 0xFFFFFFFF
    assert [r for i in st.due(600, limit=10) for r in i.ranges] == [OffsetRange(6, 4), OffsetRange(10, 6)]
    assert st.is_open(0x1_0000_0100) and st.next_due_ms() == 600


def test_leases_and_nack_delays_are_cut_to_the_hold_bound():
    from kmq.core.markers import Nack as _Nack, Renew as _Renew, Start as _Start

    st = PartitionState(lambda n: 0.0, 5, max_hold_ms=1000)
    st.apply(_Start([(0, 2)], lease_ms=0xFFFFFFFF), 0, 0)
    assert st.next_due_ms() == 1000
    st.apply(_Renew([(0, 1)], lease_ms=0xFFFFFFFF), 1, 500)
    st.apply(_Nack([(1, 1)], delay_ms=0xFFFFFFFF), 2, 600)
    assert sorted(r.first for i in st.due(1600) for r in i.ranges) == [0, 1]


# ------------------------------------------------------------------ a NACK that is not a delivery
@pytest.mark.parametrize("count", [1, 3, 7])
def test_a_nack_not_a_delivery_is_copied_at_its_delay_whatever_the_delivery_count(count):
    s = state(max_deliveries=3)
    s.apply(Start(R(10, 1), lease_ms=30_000, owner="w"), 0, 1_000)
    s.apply(Nack(R(10, 1), delay_ms=5_000, counted=False), 1, 2_000)
    assert s.due(6_999) == []
    assert (s.scheduled(6_999), s.scheduled(7_000)) == (1, 0)  # kmq status: waiting for its time until then
    [item] = s.due(7_000)
    assert item.reason is Reason.RELEASE
    assert s.plan(item, count, 7_000).action is Action.REDELIVER  # never dead-lettered: no delivery was made


def test_a_counted_nack_at_the_last_delivery_is_still_dead_lettered():
    s = state(max_deliveries=3)
    s.apply(Start(R(10, 1), lease_ms=30_000, owner="w"), 0, 1_000)
    s.apply(Nack(R(10, 1)), 1, 2_000)
    [item] = s.due(2_000)
    assert (item.reason, s.plan(item, 3, 2_000).action) == (Reason.NACK, Action.DEAD_LETTER)
