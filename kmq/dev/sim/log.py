"""One simulated partition's log: offsets, the log start, the high-water mark, transactions, segments.

Like a Kafka partition with ``acks=all`` on one replica: a record is readable
(below the high-water mark) as soon as it is appended. Records may belong to
a transaction (``txn``): it ends with a control record (its commit or abort
marker), which takes an offset as in Kafka and is never handed to a reader.
The last stable offset (LSO) is the first offset of the earliest transaction
still open, else the high-water mark. A reader's isolation level decides
what it sees: ``read_uncommitted`` every data record up to the high-water
mark (also those of open and aborted transactions), ``read_committed`` only
below the LSO and never an aborted transaction's records. Retention deletes
whole segments from the oldest on and never the active (last) one, so the log
start moves in steps of ``segment_records``; ``delete_records`` (the admin
DeleteRecords call) moves it to any offset up to the high-water mark.
Offsets are never reused: after deletions the log start is where reading
begins, and a position below it is out of range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kmq.client.api import READ_COMMITTED, READ_UNCOMMITTED
from kmq.dev.sim.errors import SimulationError

__all__ = ["StoredRecord", "PartitionLog", "record_size", "ISOLATION_LEVELS", "check_isolation"]

#: The isolation levels a reader of the log may have.
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)


def check_isolation(level: str) -> str:
    """``level`` if it is one of :data:`ISOLATION_LEVELS`; else a :class:`SimulationError` naming them."""
    if level not in ISOLATION_LEVELS:
        raise SimulationError(f"isolation_level must be {READ_UNCOMMITTED!r} or {READ_COMMITTED!r}, not {level!r}")
    return level

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
    txn: int | None = None  # the transaction it was written in (None: none)
    control: bool = False  # a transaction's commit or abort marker: takes an offset, never handed to a reader


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
        self._open: dict[int, int] = {}  # open transaction -> its first offset here
        self._aborted: set[int] = set()  # transactions that wrote here and were aborted

    @property
    def log_start(self) -> int:
        """The first offset still in the log (retention and DeleteRecords move it up)."""
        return self._log_start

    @property
    def high_water(self) -> int:
        """The offset the next record gets; every offset below it and at or above the log start is readable."""
        return self._log_start + len(self._records)

    @property
    def last_stable(self) -> int:
        """The first offset of the earliest open transaction, else the high-water mark: where a
        ``read_committed`` reader's log ends."""
        return min(self._open.values(), default=self.high_water)

    def end(self, isolation: str = READ_UNCOMMITTED) -> int:
        """Where the log ends for a reader of ``isolation``: the high-water mark, or the LSO."""
        return self.last_stable if isolation == READ_COMMITTED else self.high_water

    def open_transactions(self) -> int:
        """How many transactions are open on this partition."""
        return len(self._open)

    def aborted(self, rec: StoredRecord) -> bool:
        """Whether ``rec`` belongs to a transaction that was aborted."""
        return rec.txn is not None and rec.txn in self._aborted

    def append(self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]],
               timestamp: int, skew_ms: int = 0, txn: int | None = None) -> int:
        """Append one record (in transaction ``txn``, which it opens here if it is its first); returns its offset."""
        offset = self.high_water
        if txn is not None:
            if txn in self._aborted:
                raise SimulationError(f"transaction {txn} was aborted: it writes nothing more")
            self._open.setdefault(txn, offset)
        self._records.append(StoredRecord(offset, key, value, tuple((k, v) for k, v in headers), timestamp, skew_ms,
                                          txn))
        return offset

    def end_transaction(self, txn: int, commit: bool, timestamp: int) -> int | None:
        """Write transaction ``txn``'s commit or abort marker (a control record); returns its offset,
        None when the transaction wrote nothing here (Kafka writes no marker then)."""
        if txn not in self._open:
            return None
        del self._open[txn]
        if not commit:
            self._aborted.add(txn)
        offset = self.high_water
        self._records.append(StoredRecord(offset, None, None, (), timestamp, 0, txn, control=True))
        return offset

    def visible(self, rec: StoredRecord, isolation: str = READ_UNCOMMITTED) -> bool:
        """Whether a reader of ``isolation`` is handed ``rec``."""
        if rec.control:
            return False
        return isolation != READ_COMMITTED or (rec.offset < self.last_stable and not self.aborted(rec))

    def read(self, position: int, max_records: int, isolation: str = READ_UNCOMMITTED) -> list[StoredRecord]:
        """Up to ``max_records`` offsets from ``position`` on, the data records among them a reader of
        ``isolation`` is handed (no control record; nothing when ``position`` is out of range)."""
        if position < self._log_start or max_records <= 0:
            return []
        i = position - self._log_start
        last = min(i + max_records, self.end(isolation) - self._log_start)
        return [r for r in self._records[i:last] if self.visible(r, isolation)]

    def fetch(self, position: int, max_records: int, isolation: str = READ_UNCOMMITTED) -> tuple[list[StoredRecord], int]:
        """A consumer's fetch: up to ``max_records`` records handed from ``position`` on, and the
        position after it (past the control records and, ``read_committed``, the aborted records in
        between, as a client moves past them, up to the end for ``isolation``)."""
        if position < self._log_start or max_records <= 0:
            return [], position
        out: list[StoredRecord] = []
        end = self.end(isolation)
        nxt = position
        for i in range(position - self._log_start, end - self._log_start):
            rec = self._records[i]
            if self.visible(rec, isolation):
                if len(out) == max_records:
                    break
                out.append(rec)
            nxt = rec.offset + 1
        return out, nxt

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
