"""What both log readers (:mod:`kmq.client.kafka_python.log_reader`, :mod:`kmq.client.confluent.log_reader`)
do alike around the scan cursor: the state of a walk over partitions, cut a batch to the scan, assemble a
read's result, report deleted offsets."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterator

from kmq.client.api import Deleted, ReadResult
from kmq.core.errors import LogReadError
from kmq.core.ranges import RangeSet, missing
from kmq.core.scan_cursor import Done, ScanAction, ScanCursor, Stalled

__all__ = ["Walk", "cut", "read_result", "log_deleted", "check_planned_end"]

log = logging.getLogger(__name__)


class Walk:
    """The read state of one walk of a log reader over its partitions. A :class:`ScanCursor` per
    partition decides where to read and when the partition is over; beside the cursors the walk
    keeps only which partitions are still read, whether each one's current assignment reads for
    its scan (not for a probe's mark), the time the caller held the walk's batches, and how each
    partition ended (``done``: its :class:`Done`; ``stalled``: why the broker did not answer, None:
    a stall raises). Partitions are ``(topic, partition)`` tuples of either client."""

    def __init__(self, cursors: dict[Any, ScanCursor], done: dict, on_deleted: Callable[[Deleted], None] | None = None,
                 stalled: dict | None = None) -> None:
        self.cursors = cursors
        self.done = done
        self.on_deleted = on_deleted
        self.stalled = stalled
        self.active = set(cursors)  # partitions still read
        self.keep: dict[Any, bool] = {}  # whether a partition's current assignment reads for its scan
        self.held = 0.0  # seconds the caller held the walk's batches

    def now(self) -> float:
        """The reader's own waiting time: the caller's time with a batch is no broker silence."""
        return time.monotonic() - self.held

    def finish(self, tp: Any, action: ScanAction) -> bool:
        """Take a :class:`Done` or :class:`Stalled` ``action`` of ``tp``: True when ``tp`` is no
        longer read (the reader stops fetching it). A stall raises :class:`LogReadError` when the
        walk has no ``stalled``."""
        if isinstance(action, Done):
            self.done[tp] = action
        elif isinstance(action, Stalled):
            if self.stalled is None:
                raise LogReadError(action.reason)
            self.stalled[tp] = action.reason
        else:
            return False
        self.active.discard(tp)
        return True

    def out_of_range(self, tp: Any, log_start: int, now: float) -> ScanAction:
        """``tp``'s fetch position is out of range and its log starts at ``log_start``: the cursor's
        action; offsets it finds deleted go to ``on_deleted``."""
        cur = self.cursors[tp]
        before = len(cur.deleted)
        action = cur.out_of_range(log_start, now)
        if self.on_deleted is not None:
            for r in cur.deleted[before:]:
                self.on_deleted(Deleted(tp[0], tp[1], r))
        return action

    def hand_out(self, tp: Any, batch: Any) -> Iterator[tuple[Any, Any]]:
        """Yield ``tp``'s ``batch`` (if any) to the caller, counting the time the caller holds it."""
        if batch:
            t = time.monotonic()
            yield tp, batch
            self.held += time.monotonic() - t


def cut(batch: list[Any], limit: int, offset_of: Callable[[Any], int]) -> list[Any]:
    """The records of ``batch`` (in offset order) below ``limit``: one look at the last record
    when the whole batch is inside, the usual case; no per-record work for a full batch."""
    if not batch or offset_of(batch[-1]) < limit:
        return batch
    lo, hi = 0, len(batch)
    while lo < hi:
        mid = (lo + hi) // 2
        if offset_of(batch[mid]) < limit:
            lo = mid + 1
        else:
            hi = mid
    return batch[:lo]


def read_result(wanted: RangeSet, found: dict[int, Any], done: Done) -> ReadResult:
    """The :class:`ReadResult` of a read of ``wanted`` that found ``found`` and ended with ``done``.
    Missing are the wanted offsets the read passed without finding them (deleted below the log start,
    or a gap in the log), never those at or past the log end it ran into: a read that ends below an
    offset proves nothing about it (a new leader's high-water mark can lag behind the old one's)."""
    end = done.log_end
    below = wanted.ranges() if end is None else wanted.intersection(0, end)
    return ReadResult(found, missing(below, found), end)


def log_deleted(d: Deleted) -> None:
    log.warning("%s[%d]: offsets %d..%d were deleted (retention) before they were read; reading on from %d",
                d.topic, d.partition, d.offsets.first, d.offsets.last, d.offsets.end)


def check_planned_end(topic: str, partition: int, stop: int, done: Done | None) -> None:
    """Raise when a read of a planned range found the log ending before ``stop``."""
    if done is not None and done.log_end is not None and done.log_end < stop:
        raise LogReadError(f"{topic}[{partition}] ends at offset {done.log_end}, before offset {stop} that was "
                           "planned from an earlier high-water mark: was the topic deleted and recreated?")
