"""Offset-range arithmetic shared by the consumer, the tracker and the Spark job.

Pure Python, no I/O. An :class:`OffsetRange` covers ``first .. first+count-1``.
Markers carry ranges instead of single offsets, so one marker record stands
for a whole poll batch or flush (see docs/protocol.md).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Iterable, Iterator, NamedTuple

__all__ = ["OffsetRange", "coalesce", "normalize", "RangeSet", "RangeOverlapError", "missing", "CLOSED_MEMORY_RANGES"]

#: How many closed ranges the tracker and the lag job remember to count late acks: beyond this
#: the lowest are forgotten (:meth:`RangeSet.add_bounded`), so hostile or very fragmented markers
#: cannot grow a partition's state without bound. A late ack of a forgotten range is not counted.
CLOSED_MEMORY_RANGES = 50_000


class RangeOverlapError(ValueError):
    """Two ranges given where disjoint ones were required share an offset."""


class OffsetRange(NamedTuple):
    """Offsets ``first`` to ``first + count - 1``."""

    first: int
    count: int  # type: ignore[assignment]  # a field named count shadows tuple.count, on purpose

    @property
    def end(self) -> int:
        """One past the last offset (exclusive end)."""
        return self.first + self.count

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def __contains__(self, offset: object) -> bool:
        return isinstance(offset, int) and self.first <= offset < self.first + self.count

    def offsets(self) -> range:
        return range(self.first, self.first + self.count)


def coalesce(offsets: Iterable[int]) -> list[OffsetRange]:
    """Turn offsets (any order, duplicates allowed) into sorted, merged ranges.

    >>> coalesce([45, 46, 47, 48, 49, 50, 52])
    [OffsetRange(first=45, count=6), OffsetRange(first=52, count=1)]
    """
    if isinstance(offsets, list) and offsets and offsets[-1] - offsets[0] + 1 == len(offsets) \
            and offsets == list(range(offsets[0], offsets[-1] + 1)):
        # The usual case (a fetch, acks in order): one range, checked at C speed.
        return [OffsetRange(offsets[0], len(offsets))]
    ordered = sorted(set(offsets))
    out: list[OffsetRange] = []
    if not ordered:
        return out
    start = prev = ordered[0]
    for off in ordered[1:]:
        if off != prev + 1:
            out.append(OffsetRange(start, prev - start + 1))
            start = off
        prev = off
    out.append(OffsetRange(start, prev - start + 1))
    return out


def normalize(ranges: Iterable[tuple[int, int]]) -> tuple[OffsetRange, ...]:
    """Sort ranges and merge adjacent ones; overlapping ranges are an error.

    Raises :class:`RangeOverlapError` when two ranges share an offset and
    ``ValueError`` for a count below 1 or a negative offset.
    """
    items = sorted(OffsetRange(int(f), int(c)) for f, c in ranges)
    out: list[OffsetRange] = []
    for r in items:
        if r.count < 1:
            raise ValueError(f"range at offset {r.first} has count {r.count}; counts start at 1")
        if r.first < 0:
            raise ValueError(f"range starts at negative offset {r.first}")
        if out:
            prev = out[-1]
            if r.first < prev.end:
                raise RangeOverlapError(
                    f"ranges {prev.first}+{prev.count} and {r.first}+{r.count} overlap"
                )
            if r.first == prev.end:
                out[-1] = OffsetRange(prev.first, prev.count + r.count)
                continue
        out.append(r)
    return tuple(out)


class RangeSet:
    """A set of offsets stored as sorted, disjoint, coalesced ranges.

    Memory is proportional to the number of ranges, not offsets. ``add`` and
    ``remove`` are O(log n + k) where k is the number of ranges touched.
    """

    __slots__ = ("_starts", "_ends", "_size")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []  # inclusive
        self._ends: list[int] = []  # exclusive
        self._size = 0
        for first, count in ranges:
            self.add(first, count)

    def __len__(self) -> int:
        """Number of offsets in the set."""
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    @property
    def range_count(self) -> int:
        return len(self._starts)

    def __iter__(self) -> Iterator[OffsetRange]:
        for s, e in zip(self._starts, self._ends):
            yield OffsetRange(s, e - s)

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        i = bisect_right(self._starts, offset) - 1
        return i >= 0 and offset < self._ends[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self._starts == other._starts and self._ends == other._ends

    def __repr__(self) -> str:
        body = ", ".join(f"{s}..{e - 1}" for s, e in zip(self._starts, self._ends))
        return f"RangeSet([{body}])"

    def ranges(self) -> list[OffsetRange]:
        # Not list(self): list() takes len() (the offset count, up to billions) as its size
        # hint and would allocate that many slots.
        return [OffsetRange(s, e - s) for s, e in zip(self._starts, self._ends)]

    def min(self) -> int | None:
        return self._starts[0] if self._starts else None

    def max_end(self) -> int:
        """One past the largest offset in the set (0 when empty)."""
        return self._ends[-1] if self._ends else 0

    def add(self, first: int, count: int = 1) -> int:
        """Add offsets; return how many of them were not already present.

        O(1) when the offsets are at or past the end of the set (offsets closed in rising
        order, the common case of the tracker and the lag job)."""
        if count < 1:
            return 0
        starts, ends = self._starts, self._ends
        if not ends or first > ends[-1]:
            starts.append(first)
            ends.append(first + count)
            self._size += count
            return count
        if first == ends[-1]:
            ends[-1] = first + count
            self._size += count
            return count
        start, end = first, first + count
        # Ranges that overlap or touch [start, end) are merged into one.
        lo = bisect_left(ends, start)
        hi = bisect_right(starts, end)
        if lo == hi:
            starts.insert(lo, start)
            ends.insert(lo, end)
            self._size += count
            return count
        covered = sum(min(e, end) - max(s, start) for s, e in zip(starts[lo:hi], ends[lo:hi]) if e > start and s < end)
        new_start = min(start, starts[lo])
        new_end = max(end, ends[hi - 1])
        starts[lo:hi] = [new_start]
        ends[lo:hi] = [new_end]
        added = count - covered
        self._size += added
        return added

    def add_bounded(self, first: int, count: int, max_ranges: int) -> None:
        """Add offsets, then forget the lowest ranges beyond ``max_ranges`` (memory stays bounded
        however fragmented the set gets)."""
        self.add(first, count)
        extra = len(self._starts) - max_ranges
        if extra > 0:
            self._size -= sum(e - s for s, e in zip(self._starts[:extra], self._ends[:extra]))
            del self._starts[:extra], self._ends[:extra]

    def remove(self, first: int, count: int = 1) -> list[OffsetRange]:
        """Remove offsets; return the ranges that were actually present."""
        if count < 1:
            return []
        start, end = first, first + count
        starts, ends = self._starts, self._ends
        lo = bisect_right(ends, start)
        hi = bisect_left(starts, end)
        if lo >= hi:
            return []
        removed: list[OffsetRange] = []
        keep_s: list[int] = []
        keep_e: list[int] = []
        for s, e in zip(starts[lo:hi], ends[lo:hi]):
            cs, ce = max(s, start), min(e, end)
            removed.append(OffsetRange(cs, ce - cs))
            self._size -= ce - cs
            if s < cs:
                keep_s.append(s)
                keep_e.append(cs)
            if ce < e:
                keep_s.append(ce)
                keep_e.append(e)
        starts[lo:hi] = keep_s
        ends[lo:hi] = keep_e
        return removed

    def intersection(self, first: int, count: int) -> list[OffsetRange]:
        """The parts of ``first..first+count-1`` that are in the set."""
        start, end = first, first + count
        lo = bisect_right(self._ends, start)
        hi = bisect_left(self._starts, end)
        out = []
        for s, e in zip(self._starts[lo:hi], self._ends[lo:hi]):
            cs, ce = max(s, start), min(e, end)
            if cs < ce:
                out.append(OffsetRange(cs, ce - cs))
        return out

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()
        self._size = 0


def missing(wanted: Iterable[tuple[int, int]], found: Iterable[int]) -> list[OffsetRange]:
    """The offsets of ``wanted`` (ranges) that are not in ``found`` (offsets), as sorted ranges.

    Range arithmetic, never a walk over every wanted offset: a wanted range may hold
    billions of offsets, while ``found`` holds only records actually read.

    >>> missing([(10, 5)], [11, 12])
    [OffsetRange(first=10, count=1), OffsetRange(first=13, count=2)]
    """
    left = RangeSet(wanted)
    for r in coalesce(found):
        left.remove(r.first, r.count)
    return left.ranges()
