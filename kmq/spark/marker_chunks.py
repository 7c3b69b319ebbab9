"""Decoded markers packed into one binary cell: how the lag job's source hands a
whole run of markers to the stateful step as a single row (pure: numpy only).

Why: Spark moves every row through its JVM (Arrow to rows, shuffle, sort,
rows to Arrow again for the Python state function). At one row per marker
that costs more than all of kmq's Python work together; one row per chunk of
up to 20,000 markers makes it negligible, and decoding moves to the source
tasks, which run in parallel per Kafka partition.

A chunk holds consecutive records of one markers partition, in offset order:
marker offsets, record times (ms), and the columns of
:class:`kmq.core.markers_bulk.DecodedMarkers` (bad records stay as type BAD rows,
so they are counted downstream). Layout, little-endian::

    b"KMC1", u32 n, u32 ranges,
    i64 offsets[n], i64 ts_ms[n], i8 mtype[n], i8 outcome[n], u32 range_count[n],
    i64 firsts[ranges], i64 counts[ranges]

The layout is internal to one running job (the state store never holds it),
so it may change with any release; the version tag makes a mismatch loud.
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from kmq.core.errors import KmqError
from kmq.core.markers_bulk import DecodedMarkers

__all__ = ["CHUNK_COLUMNS", "ChunkFormatError", "pack", "unpack"]

MAGIC = b"KMC1"
_HEAD = struct.Struct("<4sII")
# The source's columns when it emits chunks (option markerChunks=true).
CHUNK_COLUMNS = "topic string, partition int, first_offset long, records int, chunk binary"


class ChunkFormatError(KmqError):
    """A chunk cell that this build cannot read (another kmq version wrote it, or it is cut short)."""


def pack(offsets: Sequence[int] | np.ndarray, ts_ms: Sequence[int] | np.ndarray, decoded: DecodedMarkers) -> bytes:
    """One chunk cell from records in offset order and their bulk decoding."""
    off = np.asarray(offsets, dtype="<i8")
    ts = np.asarray(ts_ms, dtype="<i8")
    n = len(decoded)
    if len(off) != n or len(ts) != n:
        raise ValueError(f"{len(off)} offsets and {len(ts)} times for {n} decoded records")
    per_row = np.diff(decoded.range_start).astype("<u4")
    return b"".join((
        _HEAD.pack(MAGIC, n, len(decoded.firsts)),
        off.tobytes(), ts.tobytes(),
        decoded.mtype.astype("<i1").tobytes(), decoded.outcome.astype("<i1").tobytes(), per_row.tobytes(),
        decoded.firsts.astype("<i8").tobytes(), decoded.counts.astype("<i8").tobytes(),
    ))


def unpack(cell: bytes) -> tuple[np.ndarray, np.ndarray, DecodedMarkers]:
    """``(offsets, ts_ms, decoded)`` of a chunk cell (bad-record reasons are not carried)."""
    if len(cell) < _HEAD.size:
        raise ChunkFormatError(f"marker chunk of {len(cell)} bytes is shorter than its header")
    magic, n, nr = _HEAD.unpack_from(cell, 0)
    if magic != MAGIC:
        raise ChunkFormatError(f"marker chunk tagged {magic!r}, this build reads {MAGIC!r}: run one kmq version "
                               "on the driver and the executors")
    want = _HEAD.size + n * (8 + 8 + 1 + 1 + 4) + nr * 16
    if len(cell) != want:
        raise ChunkFormatError(f"marker chunk has {len(cell)} bytes, its header says {want}")
    pos = _HEAD.size

    def take(dtype: str, count: int) -> np.ndarray:
        nonlocal pos
        a = np.frombuffer(cell, dtype=dtype, count=count, offset=pos)
        pos += a.nbytes
        return a

    off, ts = take("<i8", n), take("<i8", n)
    mtype, outcome, per_row = take("<i1", n), take("<i1", n), take("<u4", n)
    firsts, counts = take("<i8", nr), take("<i8", nr)
    range_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(per_row, out=range_start[1:])
    return off, ts, DecodedMarkers(mtype, outcome, range_start, firsts, counts, {})
