"""One simulated partition's log: offsets, the log start, the high-water mark, segments.

Like a Kafka partition with ``acks=all`` on one replica: a record is readable
(below the high-water mark) as soon as it is appended. Retention deletes
whole segments from the oldest on and never the active (last) one, so the log
start moves in steps of ``segment_records``; ``delete_records`` (the admin
DeleteRecords call) moves it to any offset up to the high-water mark.
Offsets are never reused: after deletions the log start is where reading
begins, and a position below it is out of range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kmq.dev.sim.errors import SimulationError

__all__ = ["StoredRecord", "PartitionLog", "record_size"]

Headers = tuple[tuple[str, "bytes | None"], ...]


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record as the broker keeps it (immutable: fetches hand out copies of the headers)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int  # milliseconds since the epoch (CreateTime)
    skew_ms: int = 0  # how far the writer's clock read off when it stamped it (the checks' true time: timestamp - skew)


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> int:
    """Bytes a record takes on the wire, near enough for size limits (key, value, headers)."""
    return (len(key or b"") + len(value or b"")
            + sum(len(k.encode("utf-8")) + len(v or b"") for k, v in headers))


class PartitionLog:
    """The records of one partition from its log start to its high-water mark."""

    def __init__(self, segment_records: int = 100) -> None:
        if segment_records < 1:
            raise SimulationError(f"segment_records must be at least 1, not {segment_records}")
        self.segment_records = segment_records
        self._records: list[StoredRecord] = []  # offsets log_start .. high_water - 1
        self._log_start = 0

    @property
    def log_start(self) -> int:
        """The first offset still in the log (retention and DeleteRecords move it up)."""
        return self._log_start

    @property
    def high_water(self) -> int:
        """The offset the next record gets; every offset below it and at or above the log start is readable."""
        return self._log_start + len(self._records)

    def append(self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]],
               timestamp: int, skew_ms: int = 0) -> int:
        """Append one record; returns its offset."""
        offset = self.high_water
        self._records.append(StoredRecord(offset, key, value, tuple((k, v) for k, v in headers), timestamp, skew_ms))
        return offset

    def read(self, position: int, max_records: int) -> list[StoredRecord]:
        """Up to ``max_records`` records from ``position`` on (nothing when it is out of range)."""
        if position < self._log_start or max_records <= 0:
            return []
        i = position - self._log_start
        return self._records[i:i + max_records]

    def at(self, offset: int) -> StoredRecord | None:
        """The record at ``offset``, None when it is not in the log (deleted, or not written yet)."""
        if self._log_start <= offset < self.high_water:
            return self._records[offset - self._log_start]
        return None

    def in_range(self, position: int) -> bool:
        """Whether a fetch from ``position`` is valid (Kafka answers OFFSET_OUT_OF_RANGE otherwise)."""
        return self._log_start <= position <= self.high_water

    def delete_records(self, before: int) -> int:
        """DeleteRecords: drop every record below ``before`` (at most the high-water mark);
        returns the new log start."""
        before = min(max(before, self._log_start), self.high_water)
        del self._records[:before - self._log_start]
        self._log_start = before
        return self._log_start

    def delete_oldest_segment(self) -> int | None:
        """Retention: delete the oldest segment unless it is the active one; returns the new log
        start, or None when nothing was deleted."""
        segment_end = (self._log_start // self.segment_records + 1) * self.segment_records
        if segment_end > self.high_water - 1:  # the active segment holds the last record: kept
            return None
        return self.delete_records(segment_end)

    def __repr__(self) -> str:
        return f"PartitionLog(log_start={self._log_start}, high_water={self.high_water})"
