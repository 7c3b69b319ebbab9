"""Chunk cells (the kmq-kafka source's decoded runs of markers) round-trip exactly, and a
foreign or cut cell is a clear error."""

from __future__ import annotations

import pytest

from kmq.core import markers as mk
from kmq.core.markers_bulk import decode_records
from kmq.spark.marker_chunks import ChunkFormatError, pack, unpack


def test_pack_unpack_round_trip_keeps_every_column_and_bad_rows():
    values = [
        mk.encode(mk.Start(ranges=((5, 3),), lease_ms=1000, owner="w")),
        b"\x01",  # bad
        mk.encode(mk.Closed(ranges=((1, 1), (9, 2)), outcome=mk.Outcome.DEAD_LETTERED)),
        None,  # bad
        mk.encode(mk.End(ranges=((5, 3),))),
    ]
    d = decode_records(values, [mk.encode_key(1)] * 5, [1] * 5)
    offsets, ts = [100, 101, 102, 103, 104], [7, 8, 9, 10, 11]
    off2, ts2, d2 = unpack(pack(offsets, ts, d))
    assert off2.tolist() == offsets and ts2.tolist() == ts
    assert d2.mtype.tolist() == d.mtype.tolist() and d2.outcome.tolist() == d.outcome.tolist()
    assert [d2.ranges(i) for i in range(5)] == [d.ranges(i) for i in range(5)]
    assert d2.bad_count() == 2


def test_empty_chunk_round_trips():
    off, ts, d = unpack(pack([], [], decode_records([])))
    assert len(off) == len(ts) == len(d) == 0


@pytest.mark.parametrize("cell, words", [
    (b"KMC", "shorter than its header"),
    (b"KMC9" + bytes(8), "tagged"),
])
def test_foreign_or_cut_cells_are_clear_errors(cell, words):
    with pytest.raises(ChunkFormatError, match=words):
        unpack(cell)


def test_truncated_cell_is_a_clear_error():
    cell = pack([1], [2], decode_records([mk.encode(mk.End(ranges=((0, 1),)))]))
    with pytest.raises(ChunkFormatError, match="header says"):
        unpack(cell[:-1])


def test_lengths_must_agree():
    with pytest.raises(ValueError):
        pack([1, 2], [3], decode_records([b"x"]))
