"""Read partitions without a group, with kafka-python: the :class:`~kmq.client.api.LogReader` seam.

One consumer without a group (assign + seek). Every read starts a fresh
assignment, so ``highwater()`` answers only from this read's own fetch
responses (kafka-python forgets the marks of an unassigned partition), and a
:class:`~kmq.core.scan_cursor.ScanCursor` per partition decides where to read
and where the read ends. An offset out of range is reported by the fetch
(``auto_offset_reset='none'``) and looked up against the log start, never
silently reset. It reads uncommitted: it sees every record a worker on either client could have
been handed, also those of a transaction still open or aborted later.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Iterator, Mapping

from kafka import TopicPartition
from kafka.errors import KafkaError, OffsetOutOfRangeError
from kafka.structs import OffsetAndMetadata

from kmq.client.api import LOG_READER_ISOLATION, Deleted, LogEnds, Partition, ReadResult
from kmq.client.kafka_python.clients import classify, consumer as make_consumer
from kmq.client.kafka_python.watchdog import unstrand_records
from kmq.client.scan import Walk, check_planned_end, cut, log_deleted, read_result
from kmq.config import KafkaConfig
from kmq.core.errors import LogReadError
from kmq.core.ranges import RangeSet
from kmq.core.scan_cursor import ScanCursor, Seek

__all__ = ["LogReader", "ReadResult", "LogReadError"]

_POLL_MS = 200
# A poll of a small walk is cut into slices this long so that it returns once a needed high-water
# mark arrived: kafka-python's poll() returns early for records only, and an empty fetch answer at
# the log end (a read-through look-up of an idle partition) would otherwise cost the whole poll.
_SLICE_MS = 5
# Walks over more partitions than this poll whole: checking every mark each slice would cost more.
_SLICED_UP_TO = 64


class LogReader:
    """The kafka-python :class:`~kmq.client.api.LogReader`. ``timeout_s``: how long a read waits
    without an answer from the broker before it raises :class:`LogReadError`. ``overrides``:
    consumer settings (kafka-python names), e.g. fetch sizes."""

    def __init__(self, kafka: KafkaConfig, timeout_s: float = 10.0, **overrides: Any) -> None:
        self._kafka = kafka
        self._timeout_s = timeout_s
        # No incremental fetch sessions (KIP-227): every read assigns its partitions anew, which resets
        # kafka-python's marks but not its session with the broker, and a broker that keeps the session
        # answers a partition unchanged since the last read with nothing, so no mark, and the read of an
        # empty partition waited out its whole timeout (Apache Kafka; tansu keeps no sessions).
        # read_uncommitted, whatever the overrides: a reader must see every record a worker could have
        # been handed (a worker reading uncommitted is handed an open transaction's records; a reader
        # stopped at the last stable offset below them would report them past the log end).
        settings = {"fetch_max_wait_ms": 50, "max_poll_records": 2000, "enable_incremental_fetch_sessions": False,
                    **overrides, "isolation_level": LOG_READER_ISOLATION}
        self._consumer = make_consumer(kafka, group_id=None, enable_auto_commit=False, auto_offset_reset="none",
                                       **settings)
        self._groups: dict[str, Any] = {}

    def close(self) -> None:
        for g in self._groups.values():
            g.close()
        self._groups.clear()
        self._consumer.close()

    def release(self) -> None:
        """Nothing to let go: every read assigns anew and unassigns when it ends."""

    # ------------------------------------------------------------ reads
    def read(self, topic: str, partition: int, ranges: Iterable[tuple[int, int]]) -> ReadResult:
        """Records at exactly these offsets; raises :class:`LogReadError` when the broker does not answer."""
        wanted = RangeSet(ranges)
        found: dict[int, Any] = {}
        if not wanted:
            return ReadResult(found, [])
        tp = TopicPartition(topic, partition)
        cursor = ScanCursor.ranges(wanted, time.monotonic(), self._timeout_s, what=f"{topic}[{partition}]")
        done: dict = {}
        for _tp, batch in self._walk({tp: cursor}, done):
            for rec in batch:
                if rec.offset in wanted:
                    found[rec.offset] = rec
        return read_result(wanted, found, done[tp])

    def scan(self, starts: Mapping[Partition, int | None]) -> Iterator[tuple[Partition, list]]:
        """See :meth:`kmq.client.api.LogReader.scan`; records are kafka-python ``ConsumerRecord``\\ s."""
        now = time.monotonic()
        cursors = {TopicPartition(*tp): ScanCursor.to_end(off, now, self._timeout_s, what=f"{tp[0]}[{tp[1]}]")
                   for tp, off in starts.items()}
        for tp, batch in self._walk(cursors, {}, log_deleted):
            yield (tp.topic, tp.partition), batch

    def batches(self, topic: str, partition: int, start: int, stop: int,
                on_deleted: Callable[[Deleted], None]) -> Iterator[list]:
        """Records ``start..stop-1`` of one partition as kafka-python lists (a Spark task's read).
        ``on_deleted`` is told of offsets deleted before the read reached them (it may raise);
        a log that ends before ``stop`` raises :class:`LogReadError`."""
        tp = TopicPartition(topic, partition)
        cursor = ScanCursor.to_end(start, time.monotonic(), self._timeout_s, stop=stop, what=f"{topic}[{partition}]")
        done: dict = {}
        for _tp, batch in self._walk({tp: cursor}, done, on_deleted):
            yield batch
        check_planned_end(topic, partition, stop, done.get(tp))

    def high_waters(self, starts: Mapping[Any, int | None]) -> dict[Any, int]:
        """See :meth:`kmq.client.api.LogReader.high_waters`."""
        return self._ends(starts, None).ends

    def log_ends(self, starts: Mapping[Any, int | None]) -> LogEnds:
        """See :meth:`kmq.client.api.LogReader.log_ends`."""
        return self._ends(starts, {})

    def _ends(self, starts: Mapping[Any, int | None], stalled: dict | None) -> LogEnds:
        """The marks of ``starts``; a partition that stalls goes into ``stalled`` (None: raise)."""
        if not starts:
            return LogEnds({}, {})
        now = time.monotonic()
        keys = {TopicPartition(k[0], k[1]): k for k in starts}
        cursors = {tp: ScanCursor.for_mark(starts[k], now, self._timeout_s, what=f"{tp.topic}[{tp.partition}]")
                   for tp, k in keys.items()}
        done: dict = {}
        for _ in self._walk(cursors, done, stalled=stalled):
            pass
        return LogEnds({keys[tp]: d.log_end for tp, d in done.items()},
                       {keys[tp]: why for tp, why in (stalled or {}).items()})

    def bounds(self, partitions: Iterable[Partition]) -> dict[Partition, tuple[int, int]]:
        """See :meth:`kmq.client.api.LogReader.bounds`."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        if not tps:
            return {}
        ends = self.high_waters({tp: None for tp in tps})
        starts = self._call("reading log starts", self._consumer.beginning_offsets, tps)
        return {(tp.topic, tp.partition): (starts[tp], max(starts[tp], ends[tp])) for tp in tps}

    def _walk(self, cursors: dict[TopicPartition, ScanCursor], done: dict,
              on_deleted: Callable[[Deleted], None] | None = None,
              stalled: dict | None = None) -> Iterator[tuple[TopicPartition, list]]:
        """Drive ``cursors`` over one fresh assignment; yield each partition's batches cut to its scan;
        ``done`` gets each partition's final :class:`Done`. ``stalled``: a partition the broker does
        not answer is put there with why and the walk goes on without it (None: the walk raises)."""
        c = self._consumer
        w = Walk(cursors, done, on_deleted, stalled)
        try:
            c.unsubscribe()  # forgets every mark: only this assignment's fetches answer highwater()
            c.assign(list(cursors))
            for tp, cur in cursors.items():
                self._act(w, tp, cur.start())
            while w.active:
                try:
                    polled, marked = self._poll(cursors, w.active)
                except OffsetOutOfRangeError as exc:
                    self._out_of_range(w, exc)
                    continue
                now = w.now()
                anything = marked or any(polled.get(tp) for tp in w.active)
                for tp in list(w.active):
                    yield from self._polled(w, tp, polled.get(tp), anything, now)
        except KafkaError as exc:
            raise classify(self._kafka, exc) or LogReadError(f"reading {_names(cursors)} failed: {exc}") from exc

    def _polled(self, w: Walk, tp: TopicPartition, batch: list | None, anything: bool,
                now: float) -> Iterator[tuple[TopicPartition, list]]:
        """``tp``'s part of a poll (``anything``: the poll brought records or a mark for some
        partition): tell its cursor, yield its records cut to its scan, act on the answer."""
        c = self._consumer
        cur = w.cursors[tp]
        mark = c.highwater(tp) if cur.log_end is None else None
        if not batch and mark is None and anything:
            return  # another partition's turn: no news for this one
        nxt = None
        if batch:
            nxt = max(c.position(tp, timeout_ms=0) or 0, batch[-1].offset + 1)
        elif mark is not None:
            nxt = c.position(tp, timeout_ms=0)
        action = cur.polled(nxt, mark, now)
        if batch and w.keep.get(tp):
            yield from w.hand_out(tp, cut(batch, cur.limit, _offset))
        self._act(w, tp, action)

    def _poll(self, cursors: dict[TopicPartition, ScanCursor], active: set[TopicPartition]) -> tuple[dict, bool]:
        """One poll of up to ``_POLL_MS``: (records by partition, whether it ended early because a
        partition still without a mark got one). A small walk polls in slices (see ``_SLICE_MS``)."""
        c = self._consumer
        # A partition paused by an earlier read (done) keeps its fetched records parked, and
        # kafka-python may never put them back: without this the partition is never fetched
        # again, and a later read of it waits out its whole timeout (the Spark job's planner
        # stalled a micro-batch that way).
        if len(active) > _SLICED_UP_TO:
            unstrand_records(c)
            return c.poll(timeout_ms=_POLL_MS), False
        deadline = time.monotonic() + _POLL_MS / 1000.0
        waiting = [tp for tp in active if cursors[tp].log_end is None]
        while True:
            unstrand_records(c)
            polled = c.poll(timeout_ms=_SLICE_MS)
            if polled or time.monotonic() >= deadline:
                return polled, False
            if any(c.highwater(tp) is not None for tp in waiting):
                return polled, True

    def _act(self, w: Walk, tp: TopicPartition, action: Any) -> None:
        if isinstance(action, Seek):
            w.keep[tp] = not action.probe
            if action.offset is None:
                self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, action.offset)
        elif w.finish(tp, action):
            self._consumer.pause(tp)

    def _out_of_range(self, w: Walk, exc: OffsetOutOfRangeError) -> None:
        now = w.now()
        offsets = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
        hit = [tp for tp in offsets if tp in w.active] or list(w.active)
        starts = self._consumer.beginning_offsets(hit)
        for tp in hit:
            self._act(w, tp, w.out_of_range(tp, starts[tp], now))

    # ------------------------------------------------------------ offsets and metadata
    def committed(self, group: str, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        """See :meth:`kmq.client.api.LogReader.committed`."""
        g = self._group(group)
        return {(t, p): self._call(f"reading the offsets of group {group}", g.committed, TopicPartition(t, p))
                for t, p in partitions}

    def commit(self, group: str, offsets: Mapping[Partition, int]) -> None:
        """See :meth:`kmq.client.api.LogReader.commit`."""
        if offsets:
            self._call(f"committing offsets of group {group}", self._group(group).commit,
                       {TopicPartition(t, p): OffsetAndMetadata(off, "", -1) for (t, p), off in offsets.items()})

    def offsets_at(self, partitions: Iterable[Partition], timestamp_ms: int) -> dict[Partition, int | None]:
        """See :meth:`kmq.client.api.LogReader.offsets_at`."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        found = self._call("looking up offsets by time", self._consumer.offsets_for_times,
                           {tp: timestamp_ms for tp in tps})
        return {(tp.topic, tp.partition): (found[tp].offset if found.get(tp) is not None else None) for tp in tps}

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic``; 0 when it does not exist or this client may not see it.

        One metadata request, never a wait for the topic to appear (a producer's
        metadata wait would block the tracker for ``max_block_ms``)."""
        # topics() always asks the cluster: the metadata cache can still list a topic
        # that was deleted since (a DLQ removed by an operator).
        if topic not in self._call(f"reading the metadata of {topic}", self._consumer.topics):
            return 0
        return len(self._consumer.partitions_for_topic(topic) or ())

    def _group(self, group: str) -> Any:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = make_consumer(self._kafka, group_id=group, enable_auto_commit=False)
        return g

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except KafkaError as exc:
            raise classify(self._kafka, exc) or LogReadError(f"{what} failed: {exc}") from exc


def _offset(rec: Any) -> int:
    return rec.offset


def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in tps)
