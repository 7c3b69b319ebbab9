"""The offset walk both log readers share (kmq.client.kafka_python.log_reader): which offset to read next, and when to seek."""

from __future__ import annotations

from kmq.core.ranges import OffsetRange
from kmq.client.kafka_python.log_reader import _SEEK_GAP, needs_seek, next_target

TODO = [OffsetRange(10, 5), OffsetRange(100, 3)]


def test_next_target_starts_at_the_first_wanted_offset():
    assert next_target(TODO, 0, -1) == (0, 10)


def test_next_target_resumes_inside_a_range_at_the_first_undecided_offset():
    assert next_target(TODO, 0, 12) == (0, 12)


def test_next_target_skips_decided_ranges():
    assert next_target(TODO, 0, 15) == (1, 100)
    assert next_target(TODO, 0, 101) == (1, 101)


def test_next_target_is_none_when_everything_is_decided():
    assert next_target(TODO, 0, 103) == (2, None)
    assert next_target([], 0, -1) == (0, None)


def test_needs_seek_only_when_unplaced_backwards_or_across_a_wide_gap():
    assert needs_seek(None, 5)
    assert needs_seek(10, 5)
    assert not needs_seek(10, 10)
    assert not needs_seek(10, 10 + _SEEK_GAP)
    assert needs_seek(10, 11 + _SEEK_GAP)
