"""Leases on one clock: when a marker counts as written on the tracker's clock (pure)."""

from __future__ import annotations

import pytest

from kmq.core.lease_state import PartitionState
from kmq.core.marker_clock import CLOCK_JUMP_MS, SKEW_ALLOWANCE_MS, ClockWatch, SkewWindow, marker_time
from kmq.core.markers import End, Nack, Renew, Start


@pytest.mark.parametrize("ts, read, floor, expected, why", [
    (1_000, 1_040, 990, 1_000, "clocks that agree: the record time, to the millisecond"),
    (985, 1_040, 990, 1_040, "stamped by the producer just before the floor: the read"),
    (-9_000, 1_040, 990, 1_040, "a writer 10 s behind: the read, never earlier than it was written"),
    (-99_000, 1_040, 990, 1_040, "a writer further behind than the allowance: the read"),
    (11_000, 1_040, 990, 1_040, "a writer 10 s ahead: no later than the read"),
    (10**13, 1_040, 990, 1_040, "a writer centuries ahead: no later than the read"),
    (1_000, 301_000, None, 1_000 + SKEW_ALLOWANCE_MS, "replayed after 5 min: at most the allowance later"),
    (1_000, 31_000, None, 31_000, "replayed after 30 s: at most its read time"),
    (-9_000, 1_040, None, 1_040, "replayed, written by a writer 10 s behind: not earlier than read"),
    (11_000, 1_040, None, 1_040, "replayed, written by a writer ahead: no later than the read"),
])
def test_a_marker_counts_as_written_on_the_readers_clock(ts, read, floor, expected, why):
    assert marker_time(ts, read, floor) == expected, why


def test_a_stale_floor_cuts_no_lease_of_a_writer_behind():
    # The tracker's clock jumped 26 s forward (every worker now reads 26 s behind it) and a stalled
    # look-up held its step 10 s between two fetches: the START was written just before the read,
    # 10 s after the floor. Counted from the floor its 2 s lease was over when it was read.
    floor, written = 35_322, 45_522
    read = written + 50
    ts = written - 25_915
    start = marker_time(ts, read, floor)
    assert start >= written
    assert start + 2_000 > read + 1_000  # still held a second after the read


@pytest.mark.parametrize("behind_ms", [1, 50, 985, 10_000, 25_915, SKEW_ALLOWANCE_MS, 3_600_000])
@pytest.mark.parametrize("gap_ms", [50, 1_000, 10_000, 30_000])
def test_a_writer_behind_loses_no_more_than_its_lag_however_long_the_fetch_gap(behind_ms, gap_ms):
    # Whenever it was written between the floor and the read, and however far its writer's clock
    # (or the tracker's, after a jump) is off: a record time below the floor loses nothing, one
    # within the gap loses the writer's lag, never the gap.
    floor = 1_000_000
    for written in (floor, floor + gap_ms // 2, floor + gap_ms):
        ts = written - behind_ms
        assert marker_time(ts, floor + gap_ms, floor) >= (written if ts < floor else ts)


def backoff(count: int) -> float:
    return 0.1 * 2 ** (count - 1)


def lease_run(skew_ms: int, read_times: bool, lease_ms: int = 2_000, ack_after_ms: int = 300,
              messages: int = 20, tick_ms: int = 50) -> list:
    """A tracker reading one partition every tick (its clock: ``now``) while a worker whose clock is
    ``skew_ms`` off starts a message, acks it ``ack_after_ms`` later, and starts the next; returns what
    became due. ``read_times``: apply markers with their read time and floor, as the tracker does."""
    state = PartitionState(backoff, max_deliveries=5, position=0)
    now, moff = 1_000_000, 0
    sent = now - tick_ms  # at the log end from the start (caught up)
    log: list[tuple[object, int]] = []  # (marker, record time) written since the last fetch
    due: list = []
    plan = []  # (time, marker) in the worker's order
    for i in range(messages):
        t = now + i * (ack_after_ms + tick_ms)
        plan += [(t, Start([(i, 1)], lease_ms=lease_ms, owner="w")), (t + ack_after_ms, End([(i, 1)]))]
    end = plan[-1][0] + 10 * lease_ms
    while now <= end:
        while plan and plan[0][0] <= now:
            t, marker = plan.pop(0)
            log.append((marker, t + skew_ms))
        # One fetch: sent at `now`, everything appended by then read at `now` (at the log end after it).
        for marker, ts in log:
            if read_times:
                state.apply(marker, moff, ts, now, sent)
            else:
                state.apply(marker, moff, ts)
            moff += 1
        log.clear()
        sent = now
        due += state.due(now)
        now += tick_ms
    return due


@pytest.mark.parametrize("skew_ms", [-10_000, 10_000, -3_600_000])
def test_handlers_that_ack_within_the_lease_are_never_due_whatever_the_writers_clock(skew_ms):
    assert lease_run(skew_ms, read_times=True) == []


def test_on_the_writers_clock_a_writer_10s_behind_made_every_message_due():
    # What judging the record time against the tracker's clock did (apply without read times).
    assert len(lease_run(-10_000, read_times=False)) == 20


def test_renew_and_nack_count_from_the_same_clock():
    state = PartitionState(backoff, max_deliveries=5, position=0)
    behind = -10_000
    state.apply(Start([(0, 2)], lease_ms=2_000, owner="w"), 0, 100_000 + behind, 100_000, 99_950)
    state.apply(Renew([(0, 1)], lease_ms=5_000), 1, 101_000 + behind, 101_000, 100_950)
    state.apply(Nack([(1, 1)], delay_ms=3_000), 2, 101_000 + behind, 101_000, 100_950)
    # On the writer's clock offset 0 would be due at 96.1 s and offset 1 at 94 s; on the tracker's
    # they count from their read.
    assert state.due(103_999) == []
    assert [d.ranges[0].first for d in state.due(104_000)] == [1]  # the NACK's 3 s delay
    assert state.due(106_099) == [] and [d.ranges[0].first for d in state.due(106_100)] == [0]  # 5 s + backoff


def test_the_skew_window_keeps_the_least_read_minus_record_time_per_owner():
    w = SkewWindow()
    w.observe(("q", "a"), 10_050, 0)
    w.observe(("q", "a"), 20_010, 10_000)
    w.observe(("q", "b"), 1_000, 5_000)
    assert w.take() == {("q", "a"): 10_010, ("q", "b"): -4_000}
    assert w.take() == {}


@pytest.mark.parametrize("looks, jumps, why", [
    ([(1_000, 0), (1_050, 50), (2_050, 1_050)], [0, 0, 0], "both clocks move alike"),
    ([(1_000, 0), (1_000 - 30_000, 50)], [0, -30_050], "set back 30 s between two steps"),
    ([(1_000, 0), (61_050, 50)], [0, 60_000], "set forward a minute"),
    ([(1_000, 0), (1_050 - CLOCK_JUMP_MS, 50)], [0, 0], "back by the bound: not a jump"),
    ([(1_000, 0), (1_049 - CLOCK_JUMP_MS, 50)], [0, -CLOCK_JUMP_MS - 1], "back by just more"),
    ([(1_000, 0), (1_000, 600), (1_000, 1_200)], [0, 0, 0], "slewed back 0.6 s a look: each within it"),
    ([(1_000, 0), (1_000 - 5_000, 50), (1_000 - 4_950, 100)], [0, -5_050, 0], "a jump is told once"),
])
def test_a_jump_of_the_trackers_clock_is_told_by_its_monotonic_clock(looks, jumps, why):
    watch = ClockWatch()
    assert [watch.observe(wall, mono) for wall, mono in looks] == jumps, why
