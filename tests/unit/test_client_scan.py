"""What both log readers share around the scan cursor (kmq.client.scan) and a delivery's coordinates."""

from __future__ import annotations

from collections import namedtuple

import pytest

from kmq.client import LogReadError, delivered_at
from kmq.client.scan import check_planned_end, cut, read_result
from kmq.core.ranges import OffsetRange, RangeSet
from kmq.core.scan_cursor import Done


def _offset(o):
    return o


@pytest.mark.parametrize("batch,limit,kept", [
    ([], 5, []),
    ([1, 2, 3], 4, [1, 2, 3]),  # all inside: the batch itself
    ([1, 2, 3], 3, [1, 2]),
    ([1, 2, 3], 1, []),
    ([5, 7, 9, 11], 10, [5, 7, 9]),  # gaps (compaction) cut at the first offset at or past the limit
])
def test_cut_keeps_the_records_below_the_limit(batch, limit, kept):
    assert list(cut(batch, limit, _offset)) == kept


def test_cut_returns_a_whole_batch_untouched():
    batch = [1, 2, 3]
    assert cut(batch, 10, _offset) is batch


def test_read_result_reports_what_was_not_found_below_the_end_it_ran_into_and_that_end():
    res = read_result(RangeSet([(5, 3), (20, 5)]), {5: "a", 7: "b"}, Done(22))
    assert res.records == {5: "a", 7: "b"}
    # 22..24 are past the end: the read proves nothing about them, so they are not missing.
    assert res.missing == [OffsetRange(6, 1), OffsetRange(20, 2)] and res.log_end == 22
    assert read_result(RangeSet([(5, 3)]), {5: "a"}, Done(None)).missing == [OffsetRange(6, 2)]


def test_a_planned_range_past_the_log_end_is_an_error_naming_the_cause():
    check_planned_end("t", 0, 20, Done(None))
    check_planned_end("t", 0, 20, Done(25))
    with pytest.raises(LogReadError, match=r"t\[0\] ends at offset 15, before offset 20 .* recreated"):
        check_planned_end("t", 0, 20, Done(15))


def test_delivered_at_reads_either_clients_delivery_metadata():
    meta = namedtuple("RecordMetadata", "topic partition topic_partition offset timestamp")
    assert delivered_at(meta("q", 1, None, 42, 0)) == ("q", 1, 42)  # kafka-python
    assert delivered_at(("q", 1, 42)) == ("q", 1, 42)  # the confluent adapter
