"""What both log readers (:mod:`kmq.client.kafka_python.log_reader`, :mod:`kmq.client.confluent.log_reader`)
do alike around the scan cursor: cut a batch to the scan, assemble a read's result, report deleted offsets."""

from __future__ import annotations

import logging
from typing import Any, Callable

from kmq.client.api import Deleted, ReadResult
from kmq.core.errors import LogReadError
from kmq.core.ranges import RangeSet, missing
from kmq.core.scan_cursor import Done

__all__ = ["cut", "read_result", "log_deleted", "check_planned_end"]

log = logging.getLogger(__name__)


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
