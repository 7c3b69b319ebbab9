"""Read original records back from the queue log, verifying every offset.

A dedicated consumer without a group (assign + seek). Each requested offset
is either returned with its record or reported missing (deleted by
retention, compacted away, or past the end of the log): a neighbouring
record is never returned in its place.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable, Sequence

from kafka import TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError

from kmq.client.kafka_python.clients import consumer as make_consumer
from kmq.config import KafkaConfig
from kmq.core.errors import KmqError
from kmq.core.ranges import OffsetRange, RangeSet, missing

__all__ = ["LogReader", "ReadResult", "LogReadError"]

log = logging.getLogger(__name__)

# Re-seek instead of reading through a gap wider than this many offsets.
_SEEK_GAP = 1000


def needs_seek(pos: int | None, target: int) -> bool:
    """Whether a reader at ``pos`` (None: not placed yet) seeks to ``target`` rather than
    reads on: never backwards, never through a gap wider than ``_SEEK_GAP`` offsets."""
    return pos is None or target < pos or target - pos > _SEEK_GAP


def next_target(todo: Sequence[OffsetRange], i: int, known: int) -> tuple[int, int | None]:
    """The next offset to read: from range ``todo[i]`` on, the first range with an offset at or
    above ``known`` (every wanted offset below it is decided), and that offset; None when all are decided."""
    while i < len(todo) and todo[i].end <= known:
        i += 1
    return i, (max(todo[i].first, known) if i < len(todo) else None)


class LogReadError(KmqError):
    """The queue log could not be read in time; the redelivery is retried later."""

    retriable = True


class ReadResult:
    """Records found, by offset, and the requested offsets that are not in the log."""

    __slots__ = ("records", "missing", "log_end")

    def __init__(self, records: dict[int, ConsumerRecord], missing: list[OffsetRange],
                 log_end: int | None = None) -> None:
        self.records = records
        self.missing = missing
        # The high-water mark when the read ran into the end of the log: no offset at or
        # above it exists (a START far beyond it is closed as missing, not retried forever).
        self.log_end = log_end


class LogReader:
    """Reads given offsets of one partition at a time."""

    def __init__(self, kafka: KafkaConfig, timeout_s: float = 10.0) -> None:
        self._timeout_s = timeout_s
        self._consumer = make_consumer(
            kafka, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=50, max_poll_records=2000,
        )

    def close(self) -> None:
        self._consumer.close()

    def read(self, topic: str, partition: int, ranges: Iterable[tuple[int, int]]) -> ReadResult:
        """Records at exactly these offsets; raises :class:`LogReadError` on timeout."""
        wanted = RangeSet(ranges)
        found: dict[int, ConsumerRecord] = {}
        if not wanted:
            return ReadResult(found, [])
        tp = TopicPartition(topic, partition)
        c = self._consumer
        todo = wanted.ranges()
        deadline = time.monotonic() + self._timeout_s
        known = -1  # every wanted offset below this is decided (found or absent)
        pos: int | None = None  # the reader's position
        log_end: int | None = None
        i = 0
        try:
            # A fresh assignment forgets the high-water mark of an earlier read, so
            # "position >= high-water" below always compares with a mark fetched now.
            c.unsubscribe()
            c.assign([tp])
            while True:
                i, target = next_target(todo, i, known)
                if target is None:
                    break
                hw = c.highwater(tp)  # from a fetch of this assignment (fresh, see above)
                if hw is not None and target >= hw:
                    log_end = hw  # nothing from here on exists: do not seek past the end and reset
                    break
                if needs_seek(pos, target):
                    c.seek(tp, target)
                    pos = target
                batch = c.poll(timeout_ms=200, max_records=2000).get(tp, [])
                if batch:
                    for rec in batch:
                        if rec.offset in wanted:
                            found[rec.offset] = rec
                    pos = known = max(c.position(tp), batch[-1].offset + 1)
                    continue
                cur = c.position(tp)
                hw = c.highwater(tp)
                if cur is not None and hw is not None and cur >= hw:
                    log_end = hw
                    break  # end of the log: nothing from here on exists
                if cur is not None and cur > pos:
                    # Reset to the log start: offsets below it were deleted by retention.
                    pos = known = cur
                    continue
                if time.monotonic() > deadline:
                    raise LogReadError(f"timed out reading {topic}[{partition}] at offset {pos}")
        except KafkaError as exc:
            raise LogReadError(f"reading {topic}[{partition}] failed: {exc}") from exc
        return ReadResult(found, missing(todo, found), log_end)

    def high_waters(self, starts: dict[TopicPartition, int | None]) -> dict[TopicPartition, int]:
        """High-water marks fetched now (from the given start offsets; None = log start).

        The tracker's group consumer keeps a partition's old high-water mark when the
        partition is revoked and assigned again to the same member, so its catch-up target
        is taken here, from a fresh assignment, never from a mark seen before the rebalance.
        Raises :class:`LogReadError` on timeout."""
        if not starts:
            return {}
        c = self._consumer
        tps = list(starts)
        deadline = time.monotonic() + self._timeout_s
        try:
            c.unsubscribe()
            c.assign(tps)
            for tp, off in starts.items():
                if off is None:
                    c.seek_to_beginning(tp)
                else:
                    c.seek(tp, off)
            while any(c.highwater(tp) is None for tp in tps):
                c.poll(timeout_ms=20, max_records=1)
                if time.monotonic() > deadline:
                    raise LogReadError(f"timed out reading the high-water marks of {len(tps)} markers partition(s)")
            return {tp: c.highwater(tp) for tp in tps}
        except KafkaError as exc:
            raise LogReadError(f"reading high-water marks failed: {exc}") from exc

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic``; 0 when it does not exist or this client may not see it.

        One metadata request, never a wait for the topic to appear (a producer's
        metadata wait would block the tracker for ``max_block_ms``)."""
        try:
            # topics() always asks the cluster: the metadata cache can still list a topic
            # that was deleted since (a DLQ removed by an operator).
            if topic not in self._consumer.topics():
                return 0
            return len(self._consumer.partitions_for_topic(topic) or ())
        except KafkaError as exc:
            raise LogReadError(f"metadata of {topic} could not be read: {exc}") from exc
