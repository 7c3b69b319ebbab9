"""The walk of a partition scan (kmq.core.scan_cursor): what to read next, and when the log ends.

Event sequences as the log readers report them, with time passed in: no broker, no sleep."""

from __future__ import annotations

import pytest

from kmq.core.ranges import OffsetRange
from kmq.core.scan_cursor import POLL, SEEK_GAP, Done, ScanCursor, Seek, Stalled, needs_seek, next_target

STALL = 10.0


def ranges(*rs, now=0.0):
    c = ScanCursor.ranges(rs, now, STALL)
    return c, c.start()


# ------------------------------------------------------------------ the offset walk


TODO = [OffsetRange(10, 5), OffsetRange(100, 3)]


def test_next_target_starts_at_the_first_wanted_offset_and_resumes_at_the_first_undecided_one():
    assert next_target(TODO, 0, -1) == (0, 10)
    assert next_target(TODO, 0, 12) == (0, 12)
    assert next_target(TODO, 0, 15) == (1, 100)
    assert next_target(TODO, 0, 101) == (1, 101)
    assert next_target(TODO, 0, 103) == (2, None)
    assert next_target([], 0, -1) == (0, None)


def test_needs_seek_only_when_unplaced_backwards_or_across_a_wide_gap():
    assert needs_seek(None, 5)
    assert needs_seek(10, 5)
    assert not needs_seek(10, 10)
    assert not needs_seek(10, 10 + SEEK_GAP)
    assert needs_seek(10, 11 + SEEK_GAP)


# ------------------------------------------------------------------ reading wanted ranges


def test_ranges_are_read_in_order_with_a_seek_across_a_wide_gap_and_none_across_a_small_one():
    c, act = ranges((5, 3), (20, 2), (5000, 1))
    assert act == Seek(5)
    assert c.polled(8, 6000, 0.1) is POLL  # records 5..7, the mark: read on through the small gap
    assert c.polled(22, None, 0.2) == Seek(5000)
    assert c.polled(5001, None, 0.3) == Done(None)


def test_nothing_wanted_is_done_at_once():
    assert ranges()[1] == Done(None)


def test_a_range_running_past_the_end_stops_at_the_first_mark_of_the_scan():
    c, act = ranges((2990, 20))
    assert act == Seek(2990)
    assert c.polled(3000, 3000, 0.1) == Done(3000)
    assert c.log_end == 3000 and c.limit == 3000


def test_a_target_beyond_the_end_is_decided_by_the_mark_of_its_own_fetch():
    c, act = ranges((10_000, 5))
    assert act == Seek(10_000)
    assert c.polled(None, 3000, 0.2) == Done(3000)  # kafka-python on a broker that answers an empty fetch


def test_an_out_of_range_answer_at_or_above_the_log_start_ends_the_scan_there():
    c, _ = ranges((10_000, 5))
    assert c.out_of_range(0, 0.2) == Done(10_000)  # Kafka: beyond the end; no offset at or above it exists


def test_an_empty_partition_ends_with_its_mark():
    c, _ = ranges((0, 2))
    assert c.polled(0, 0, 0.2) == Done(0)  # confluent's end-of-partition event at 0


def test_later_marks_never_move_the_end_the_scan_started_with():
    c, _ = ranges((0, 100))
    assert c.polled(10, 10, 0.1) == Done(10)
    c, _ = ranges((0, 100))
    assert c.polled(5, 10, 0.1) is POLL
    assert c.limit == 10
    assert c.polled(10, 50, 0.2) == Done(10)  # the log grew meanwhile: not chased


# ------------------------------------------------------------------ the stale mark (the defect)


def test_no_mark_no_end_a_slow_first_fetch_never_closes_offsets_that_exist():
    # A client cached the mark 10 from an earlier read; the log now holds 0..29 and the broker is paused.
    # The reader reports no mark until a fetch of this assignment answers: the cursor must not end.
    c, act = ranges((10, 20))
    assert act == Seek(10)
    assert [c.polled(None, None, t) for t in (0.2, 0.4)] == [POLL, POLL]
    assert c.polled(None, None, 0.6) == Seek(None, probe=True)  # ask the log start for a mark
    assert c.probing
    for t in (0.8, 1.0, 1.2, 1.4):
        assert c.polled(None, None, t) is POLL  # still paused: wait, conclude nothing
    # The broker is back: the probe's first fetch answers with records of 0.. and the mark 30.
    assert c.polled(5, 30, 1.6) == Seek(10)  # the offsets exist: read them
    assert not c.probing
    assert c.polled(30, None, 1.8) == Done(None)
    assert c.log_end == 30


def test_a_broker_that_never_answers_stalls_the_scan_and_concludes_nothing():
    c, _ = ranges((10, 20))
    t, act = 0.0, POLL
    while not isinstance(act, Stalled):
        t += 0.2
        act = c.polled(None, None, t)
        assert not isinstance(act, Done)
    assert t > STALL and "no answer from the broker for 10s" in act.reason and c.log_end is None


def test_the_probe_finds_the_end_when_the_broker_answers_a_fetch_beyond_it_with_nothing():
    # confluent on a broker that sends neither end-of-partition nor out-of-range beyond the end.
    c, _ = ranges((10_000, 5))
    assert [c.polled(None, None, t) for t in (0.2, 0.4, 0.6)] == [POLL, POLL, Seek(None, probe=True)]
    assert c.polled(2000, 3000, 0.7) == Done(3000)


def test_a_mark_seen_before_is_no_progress_and_an_idle_read_stalls():
    c = ScanCursor.to_end(0, 0.0, 1.0, stop=100)
    assert c.start() == Seek(0)
    assert c.polled(50, 80, 0.1) is POLL
    acts = [c.polled(None, 80, t / 10) for t in range(2, 14)]
    assert isinstance(acts[-1], Stalled) and "offset 50" in acts[-1].reason
    assert not any(isinstance(a, Seek) for a in acts)  # a mark exists: no probe


# ------------------------------------------------------------------ retention


def test_offsets_below_the_log_start_are_deleted_and_the_scan_goes_on_at_the_log_start():
    c, _ = ranges((5, 10), (5000, 5))
    assert c.out_of_range(12, 0.1) == Seek(12)
    assert c.deleted == [OffsetRange(5, 7)]
    assert c.polled(15, 9000, 0.2) == Seek(5000)


def test_every_wanted_offset_deleted_is_done_without_an_end():
    c, _ = ranges((5, 3))
    assert c.out_of_range(50, 0.1) == Done(None)
    assert c.deleted == [OffsetRange(5, 45)]


def test_a_log_start_that_moves_under_a_read_from_the_start_is_sought_again():
    c = ScanCursor.to_end(None, 0.0, STALL)
    assert c.start() == Seek(None)
    assert c.out_of_range(40, 0.1) == Seek(None)
    assert c.deleted == []


# ------------------------------------------------------------------ to the end, planned ranges, marks


def test_a_scan_from_the_log_start_reads_to_the_first_mark():
    c = ScanCursor.to_end(None, 0.0, STALL)
    assert c.start() == Seek(None)
    assert c.polled(None, None, 0.1) is POLL
    assert c.polled(120, 150, 0.2) is POLL  # records from the log start (100) to 119
    assert c.polled(150, 170, 0.3) == Done(150)


def test_a_scan_of_an_empty_log_from_its_start_is_done_at_its_position():
    c = ScanCursor.to_end(None, 0.0, STALL)
    c.start()
    assert c.polled(40, 40, 0.1) == Done(40)  # all deleted: the start is the end; nothing reported deleted
    assert c.deleted == []


def test_a_planned_range_ends_without_a_log_end_and_one_past_the_end_reports_it():
    c = ScanCursor.to_end(10, 0.0, STALL, stop=20)
    assert c.start() == Seek(10)
    assert c.polled(25, 30, 0.1) == Done(None)
    assert c.limit == 20
    c = ScanCursor.to_end(10, 0.0, STALL, stop=20)
    c.start()
    assert c.polled(15, 15, 0.1) == Done(15)  # the topic was recreated: the log ends before the plan


def test_an_empty_planned_range_is_done_at_once():
    c = ScanCursor.to_end(10, 0.0, STALL, stop=10)
    assert c.start() == Done(None)


def test_for_mark_reads_once_at_the_offset_and_ignores_the_records():
    c = ScanCursor.for_mark(7, 0.0, STALL)
    assert c.start() == Seek(7, probe=True)
    assert c.polled(50, None, 0.1) is POLL  # records without a mark: not the scan's
    assert c.polled(60, 90, 0.2) == Done(90)


def test_for_mark_beyond_the_end_falls_back_to_the_log_start():
    c = ScanCursor.for_mark(500, 0.0, STALL)
    c.start()
    assert [c.polled(None, None, t) for t in (0.2, 0.4, 0.6)] == [POLL, POLL, Seek(None, probe=True)]
    assert [c.polled(None, None, t) for t in (0.8, 1.0, 1.2, 1.4)] == [POLL] * 4  # no second probe
    assert c.polled(3, 40, 1.6) == Done(40)


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
@pytest.mark.parametrize("beyond_end", ["empty", "out-of-range"])
@pytest.mark.parametrize("wanted,log", [
    ([(0, 10)], (0, 30)),
    ([(25, 10)], (0, 30)),
    ([(5, 3), (2000, 5), (40_000, 2)], (0, 30_000)),
    ([(0, 5), (90, 20)], (100, 150)),  # retention moved the start past some
    ([(10, 2)], (0, 0)),  # empty
    ([(31, 2)], (0, 30)),
])
def test_simulated_readers_find_every_offset_in_the_log_and_decide_every_other(client, beyond_end, wanted, log):
    """A log of offsets start..end-1, read by a simulated client: kafka-python reports the mark of
    every fetch response of its assignment; confluent only with a record or an end-of-partition event.
    The broker answers a fetch beyond the end with nothing or with out-of-range."""
    start, end = log
    c = ScanCursor.ranges(wanted, 0.0, STALL)
    act, now, found, pos, probe = c.start(), 0.0, set(), None, False
    for _ in range(10_000):
        if isinstance(act, (Done, Stalled)):
            break
        if isinstance(act, Seek):
            pos, probe = (start if act.offset is None else act.offset), act.probe
        now += 0.1
        if pos < start:
            act = c.out_of_range(start, now)
            continue
        if pos > end:
            act = c.out_of_range(start, now) if beyond_end == "out-of-range" else \
                c.polled(None, end if client == "kafka-python" else None, now)
            continue
        batch = list(range(pos, min(end, pos + 500)))
        if not probe:
            found.update(o for o in batch if o < c.limit and any(f <= o < f + n for f, n in wanted))
        pos += len(batch)
        if client == "confluent" and not batch:
            act = c.polled(pos, pos, now)  # end-of-partition event: the position and its mark
        else:
            act = c.polled(pos if batch else None, end if (batch or client == "kafka-python") else None, now)
    assert isinstance(act, Done), act
    expect = {o for f, n in wanted for o in range(f, f + n) if start <= o < end}
    assert found == expect
    assert act.log_end is None or act.log_end <= min(o for f, n in wanted for o in range(f, f + n) if o >= end)
    assert all(r.end <= start for r in c.deleted)
