"""kmq bench spark counts markers by offsets, not rows (the lag job's source emits one row per chunk)."""

from __future__ import annotations

from kmq.bench.spark import batch_markers


def test_markers_of_a_batch_are_end_minus_start_offsets():
    first = {"sources": [{"startOffset": None, "endOffset": '{"t": {"0": 50000, "1": 49999}}', "numInputRows": 6}]}
    later = {"sources": [{"startOffset": {"t": {"0": 50000, "1": 49999}}, "endOffset": {"t": {"0": 100000, "1": 99999}},
                          "numInputRows": 6}]}
    idle = {"sources": [{"startOffset": '{"t": {"0": 7}}', "endOffset": '{"t": {"0": 7}}', "numInputRows": 0}]}
    assert batch_markers(first) == 99_999  # no start offset: read from the log start (0 on the bench's topic)
    assert batch_markers(later) == 100_000
    assert batch_markers(idle) == 0
