"""One simulated partition log: offsets, log start, high-water mark, segment retention."""

from __future__ import annotations

import pytest

from kmq.dev.sim.errors import SimulationError
from kmq.dev.sim.log import PartitionLog


def _log(n: int, segment: int = 10) -> PartitionLog:
    log = PartitionLog(segment)
    for i in range(n):
        assert log.append(b"k", b"v%d" % i, [("h", None)], 1000 + i) == i
    return log


def test_appended_records_are_read_back_from_a_position_with_their_fields():
    log = _log(5)
    assert (log.log_start, log.high_water) == (0, 5)
    recs = log.read(2, 10)
    assert [r.offset for r in recs] == [2, 3, 4]
    assert (recs[0].key, recs[0].value, recs[0].headers, recs[0].timestamp) == (b"k", b"v2", (("h", None),), 1002)
    assert log.read(5, 10) == [] and log.at(5) is None and log.at(4).value == b"v4"


def test_delete_records_moves_the_log_start_but_never_past_the_high_water_mark():
    log = _log(5)
    assert log.delete_records(3) == 3
    assert log.read(0, 10) == [] and [r.offset for r in log.read(3, 10)] == [3, 4]
    assert not log.in_range(2) and log.in_range(3) and log.in_range(5) and not log.in_range(6)
    assert log.delete_records(99) == 5 and log.high_water == 5
    assert log.append(None, b"x", [], 0) == 5  # offsets are never reused


def test_retention_deletes_whole_segments_and_never_the_active_one():
    log = _log(25, segment=10)  # segments [0,10) [10,20) [20,25: active)
    assert log.delete_oldest_segment() == 10
    assert log.delete_oldest_segment() == 20
    assert log.delete_oldest_segment() is None and log.log_start == 20
    full = _log(20, segment=10)  # the last record is in [10,20): that segment is the active one
    assert full.delete_oldest_segment() == 10 and full.delete_oldest_segment() is None
    assert PartitionLog(10).delete_oldest_segment() is None


def test_a_segment_size_below_one_is_refused():
    with pytest.raises(SimulationError, match="segment_records"):
        PartitionLog(0)
