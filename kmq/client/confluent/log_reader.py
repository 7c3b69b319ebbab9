"""Read partitions without a group, with confluent-kafka (``kafka.client: confluent``).

The same :class:`~kmq.client.api.LogReader` as :mod:`kmq.client.kafka_python.log_reader`,
walked by the same :class:`~kmq.core.scan_cursor.ScanCursor`. What differs is where a
high-water mark of *this* read comes from: librdkafka caches a partition's mark across
assignments (``get_watermark_offsets(cached=True)`` still answers with a fetch of an
earlier read), so the cached mark counts only once this assignment delivered a record
or an end-of-partition event (librdkafka stores a fetch response's mark before it hands
out the response's records, and drops the responses of older assignments). An
offset out of range is reported (``auto.offset.reset: error``) and looked up against
the log start, never silently reset.

A read that continues exactly where the last one stopped (the tracker reads a backlog's
originals chunk after chunk) keeps the last read's assignment and the records librdkafka
fetched ahead, instead of assigning anew and fetching them again: measured, a new
assignment per chunk of 25,000 cost about as much as reading the chunk. Such a read takes
only records from the kept assignment: its fetches may predate the read, so an
end-of-partition event, a high-water mark or an out-of-range answer of it proves nothing
about offsets written since, and any of them (or a poll that brings nothing) makes the
read assign anew where it stands, as a read of its own. :meth:`ConfluentLogReader.release`
lets the assignment go.

It reads uncommitted (librdkafka's default is ``read_committed``): it sees every record a worker on
either client could have been handed, also those of a transaction still open or aborted later. Read
committed, it stopped at the last stable offset below an open transaction's records that workers on
kafka-python (uncommitted by default) had already been handed.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generator, Iterable, Iterator, Mapping, NamedTuple

from kmq.client.api import LOG_READER_ISOLATION, Deleted, LogEnds, Partition, ReadResult, Record
from kmq.client.confluent.errors import classify
from kmq.client.confluent.settings import FETCH_QUEUE_BACKOFF_MS, construct, passthrough, settings
from kmq.client.scan import Walk, check_planned_end, cut, log_deleted, read_result
from kmq.config import KafkaConfig
from kmq.core.errors import LogReadError
from kmq.core.ranges import RangeSet
from kmq.core.scan_cursor import Done, ScanCursor, Seek, Stalled

import confluent_kafka as ck  # noqa: E402,I001 - after kmq.client.confluent.errors: its import names the missing extra
from confluent_kafka import KafkaError, KafkaException, TopicPartition  # noqa: E402

__all__ = ["ConfluentLogReader", "ReadRecord"]

_BATCH = 2000
_POLL_S = 0.2


class ReadRecord(NamedTuple):
    """A record :meth:`ConfluentLogReader.read` found: the fields of :class:`~kmq.client.api.Record`
    as a tuple (kafka-python's reader hands out its ``ConsumerRecord`` tuples alike). A read of a
    backlog makes one per original; a frozen dataclass cost about three times as much."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list
    timestamp: int


class ConfluentLogReader:
    """The confluent-kafka :class:`~kmq.client.api.LogReader` (see the module docstring).
    ``timeout_s``: how long a read waits without an answer from the broker before it raises
    :class:`~kmq.core.errors.LogReadError`. ``overrides``: librdkafka properties (fetch sizes...)."""

    def __init__(self, kafka: KafkaConfig, timeout_s: float = 10.0, batch: int = _BATCH, **overrides: Any) -> None:
        self._kafka = kafka
        self._timeout_s = timeout_s
        self._batch = batch
        conf = settings(kafka)
        self._log_bridge = conf["logger"]  # holds the counts of repeated librdkafka lines until close
        self._consumer = construct(ck.Consumer, {
            **conf,
            "group.id": f"{kafka.client_id}-log-reader",  # required by librdkafka; never joined, never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 50,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            "queued.max.messages.kbytes": 16 * 1024,  # the prefetch a read may leave unused
            **overrides,
            **passthrough(kafka),
            # Not librdkafka's default (read_committed): see the module docstring.
            "isolation.level": LOG_READER_ISOLATION,
        }, kafka)
        self._groups: dict[str, Any] = {}
        # What the last read left for one that continues where it stopped (see the module docstring).
        self._parked: _Parked | None = None

    def close(self) -> None:
        self._parked = None
        for g in self._groups.values():
            g.close()
        self._groups.clear()
        self._consumer.close()
        self._log_bridge.flush()

    def release(self) -> None:
        """Let go of the assignment the last read kept for a read that continues it (librdkafka
        stops fetching ahead for it)."""
        if self._parked is not None:
            self._parked = None
            try:
                self._consumer.unassign()
            except KafkaException:
                pass  # nothing assigned any more

    # ------------------------------------------------------------ reads
    def read(self, topic: str, partition: int, ranges: Iterable[tuple[int, int]]) -> ReadResult:
        """Records at exactly these offsets; raises :class:`LogReadError` when the broker does not answer."""
        wanted = RangeSet(ranges)
        found: dict[int, ReadRecord] = {}
        if not wanted:
            return ReadResult(found, [])
        cursor = ScanCursor.ranges(wanted, time.monotonic(), self._timeout_s, what=f"{topic}[{partition}]")
        done: dict = {}
        new = tuple.__new__  # ReadRecord(...) without its Python-level __new__: one per original of a backlog
        for _tp, batch in self._walk({(topic, partition): cursor}, done, park=True):
            first, last = batch[0].offset(), batch[-1].offset()
            whole = wanted.intersection(first, last - first + 1) == [(first, last - first + 1)]
            # Usually the whole batch is wanted (a backlog's contiguous STARTs): no test per record.
            for m in batch:
                off = m.offset()
                if whole or off in wanted:
                    found[off] = new(ReadRecord, (topic, partition, off, m.key(), m.value(), m.headers() or [],
                                                  m.timestamp()[1]))
        return read_result(wanted, found, done[(topic, partition)])

    def scan(self, starts: Mapping[Partition, int | None]) -> Iterator[tuple[Partition, list]]:
        """See :meth:`kmq.client.api.LogReader.scan`; records are :class:`~kmq.client.api.Record`\\ s."""
        now = time.monotonic()
        cursors = {(t, p): ScanCursor.to_end(off, now, self._timeout_s, what=f"{t}[{p}]")
                   for (t, p), off in starts.items()}
        for tp, batch in self._walk(cursors, {}, log_deleted):
            yield tp, [_record(m) for m in batch]

    def batches(self, topic: str, partition: int, start: int, stop: int,
                on_deleted: Callable[[Deleted], None]) -> Iterator[list]:
        """Records ``start..stop-1`` of one partition as lists of ``confluent_kafka.Message`` without
        errors (a Spark task's read); see :meth:`kmq.client.kafka_python.log_reader.LogReader.batches`."""
        cursor = ScanCursor.to_end(start, time.monotonic(), self._timeout_s, stop=stop, what=f"{topic}[{partition}]")
        done: dict = {}
        for _tp, batch in self._walk({(topic, partition): cursor}, done, on_deleted):
            yield batch
        check_planned_end(topic, partition, stop, done.get((topic, partition)))

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
        keys = {(k[0], k[1]): k for k in starts}
        cursors = {tp: ScanCursor.for_mark(starts[k], now, self._timeout_s, what=f"{tp[0]}[{tp[1]}]")
                   for tp, k in keys.items()}
        done: dict = {}
        for _ in self._walk(cursors, done, stalled=stalled):
            pass
        return LogEnds({keys[tp]: d.log_end for tp, d in done.items()},
                       {keys[tp]: why for tp, why in (stalled or {}).items()})

    def bounds(self, partitions: Iterable[Partition]) -> dict[Partition, tuple[int, int]]:
        """See :meth:`kmq.client.api.LogReader.bounds`."""
        tps = [(t, p) for t, p in partitions]
        ends = self.high_waters({tp: None for tp in tps})
        out = {}
        for tp in tps:
            low = self._log_start(*tp)
            out[tp] = (low, max(low, ends[tp]))
        return out

    def _walk(self, cursors: dict[Partition, ScanCursor], done: dict,
              on_deleted: Callable[[Deleted], None] | None = None,
              park: bool = False, stalled: dict | None = None) -> Iterator[tuple[Partition, list]]:
        """Drive ``cursors`` over fresh assignments; yield each partition's messages (errors taken out)
        cut to its scan; ``done`` gets each partition's final :class:`Done`. ``park``: a single
        partition's read that ends before the log end keeps its assignment for a read that continues it.
        ``stalled``: a partition the broker does not answer is put there with why and the walk goes on
        without it (None: the walk raises)."""
        w = _Walk(cursors, done, on_deleted, stalled)
        parked, self._parked = self._parked, None
        try:
            for tp, cur in cursors.items():
                self._act(w, tp, cur.start())
            if parked is not None and w.continues(parked):
                w.carried, w.queued = True, parked.queued
            else:
                self._assign(w.at, w.active, w.fresh)
            while w.active:
                yield from self._consumed(w, self._take(w))
            single = w.single
            if park and single is not None and w.may_park():
                # Read on by the next read if it starts here: at the first record taken but not used.
                self._parked = _Parked(single, w.last[0].offset() if w.last else w.at[single], w.last)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            raise (classify(self._kafka, err) if isinstance(err, KafkaError) else None) or LogReadError(
                f"reading {_names(cursors)} failed: {exc}") from exc
        finally:
            if self._parked is None:
                self._consumer.unassign()

    def _take(self, w: _Walk) -> list:
        """The next messages of the walk: those the last read took from the queue but did not use, else a consume."""
        if w.queued:
            msgs, w.queued = w.queued, []
            return msgs
        # consume(n, timeout) waits for n messages or the timeout: wait for one (a record or
        # an end-of-partition event), then take what is queued behind it, so a look-up of an
        # idle partition's end and the last chunk of a read do not wait out the timeout.
        msgs = self._consumer.consume(1, _POLL_S)
        if msgs and self._batch > 1:
            msgs += self._consumer.consume(self._batch - 1, 0)
        return msgs

    def _consumed(self, w: _Walk, msgs: list) -> Iterator[tuple[Partition, list]]:
        """Hand one consume's messages to each partition's cursor, yielding what is the scan's;
        assign anew when a cursor seeks (or the kept assignment proves nothing more)."""
        w.last = []
        now = w.now()
        by_tp, eof, out_of_range = _sort(msgs, w.single, w.cursors)
        w.events = bool(eof or out_of_range)
        renew = w.carried and (w.events or not msgs)
        if renew:
            # The kept assignment's fetches may predate this read: only its records count.
            w.carried, eof, out_of_range = False, {}, []
        seek = renew
        for tp in list(w.active):
            if tp in out_of_range:
                seek |= self._act(w, tp, w.out_of_range(tp, self._log_start(*tp), now))
            else:
                seek |= yield from self._polled(w, tp, by_tp.get(tp), eof.get(tp), bool(msgs), now)
        if seek and w.active:
            self._assign(w.at, w.active, w.fresh)
            w.carried = False

    def _polled(self, w: _Walk, tp: Partition, batch: list | None, eof: int | None, anything: bool,
                now: float) -> Generator[tuple[Partition, list], None, bool]:
        """``tp``'s part of a consume (``eof``: its end-of-partition offset; ``anything``: the consume
        brought messages): tell its cursor, yield its records cut to its scan, act on the answer.
        Returns True when ``tp`` seeks."""
        cur = w.cursors[tp]
        nxt = mark = None
        if batch:
            if not w.carried:
                w.fresh.add(tp)
            nxt = w.at[tp] = batch[-1].offset() + 1
        if eof is not None:
            w.fresh.add(tp)
            nxt = w.at[tp] = eof
            mark = eof  # the fetch that reached the end: its mark
        elif tp in w.fresh and cur.log_end is None:
            mark = self._cached_mark(tp)
        if nxt is None and mark is None and anything:
            return False  # another partition's turn: no news for this one
        action = cur.polled(nxt, mark, now)
        if batch and w.keep.get(tp):
            whole, batch = batch, cut(batch, cur.limit, _offset)
            w.last = whole[len(batch):]
            yield from w.hand_out(tp, batch)
        return self._act(w, tp, action)

    def _act(self, w: _Walk, tp: Partition, action: Any) -> bool:
        """Apply ``action``; True when the assignment must be made anew (a seek). A partition done
        stops fetching when others of the walk go on; a stalled one always."""
        if isinstance(action, Seek):
            w.keep[tp] = not action.probe
            w.at[tp] = ck.OFFSET_BEGINNING if action.offset is None else action.offset
            return True
        if w.finish(tp, action) and (w.pause or isinstance(action, Stalled)):
            try:
                self._consumer.pause([TopicPartition(*tp)])  # no more fetches for it (it stays assigned till the next seek)
            except KafkaException:
                pass  # not assigned yet (done before its first fetch): nothing to pause
        return False

    def _assign(self, at: dict[Partition, int], active: set[Partition], fresh: set[Partition]) -> None:
        # A new assignment: librdkafka drops the responses of the old one, but keeps their marks cached,
        # and a partition paused by an earlier read stays paused.
        tps = [TopicPartition(t, p, at[(t, p)]) for t, p in sorted(active)]
        self._consumer.resume(tps)
        self._consumer.assign(tps)
        fresh.clear()

    def _cached_mark(self, tp: Partition) -> int | None:
        try:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
        except (KafkaException, TypeError):
            return None
        return high if high >= 0 else None

    def _log_start(self, topic: str, partition: int) -> int:
        # Only the log start is asked for: some brokers answer the latest offset wrongly.
        low, _high = self._call(f"reading the log start of {topic}[{partition}]", self._consumer.get_watermark_offsets,
                                TopicPartition(topic, partition), self._timeout_s)
        return low

    # ------------------------------------------------------------ offsets and metadata
    def committed(self, group: str, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        """See :meth:`kmq.client.api.LogReader.committed`."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        if not tps:
            return {}
        got = self._call(f"reading the offsets of group {group}", self._group(group).committed, tps, self._timeout_s)
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in got}

    def commit(self, group: str, offsets: Mapping[Partition, int]) -> None:
        """See :meth:`kmq.client.api.LogReader.commit`."""
        if not offsets:
            return
        tps = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
        result = self._call(f"committing offsets of group {group}",
                            lambda: self._group(group).commit(offsets=tps, asynchronous=False))
        failed = [tp for tp in result or [] if tp.error is not None]
        if failed:
            raise LogReadError(f"committing offsets of group {group} failed: "
                               + "; ".join(f"{tp.topic}[{tp.partition}]: {tp.error.str()}" for tp in failed))

    def offsets_at(self, partitions: Iterable[Partition], timestamp_ms: int) -> dict[Partition, int | None]:
        """See :meth:`kmq.client.api.LogReader.offsets_at`."""
        tps = [TopicPartition(t, p, timestamp_ms) for t, p in partitions]
        if not tps:
            return {}
        got = self._call("looking up offsets by time", self._consumer.offsets_for_times, tps, self._timeout_s)
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in got}

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic``; 0 when it does not exist or this client may not see it."""
        md = self._call(f"reading the metadata of {topic}", self._consumer.list_topics, topic, self._timeout_s)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return 0
        return len(t.partitions)

    def _group(self, group: str) -> Any:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = construct(ck.Consumer, {**settings(self._kafka), **passthrough(self._kafka),
                                                              "group.id": group, "enable.auto.commit": False},
                                                self._kafka)
        return g

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            raise (classify(self._kafka, err) if isinstance(err, KafkaError) else None) or LogReadError(f"{what} failed: {exc}") from exc


class _Parked(NamedTuple):
    """A read's assignment kept for the next read of ``tp`` if it starts at ``position``: ``queued``
    are the records the read took from librdkafka's queue past its limit (they start there)."""

    tp: Partition
    position: int
    queued: list


class _Walk(Walk):
    """A confluent walk's read state: the scan's (:class:`~kmq.client.scan.Walk`) and what librdkafka's
    assignments add to it: where each partition's assignment reads, which assignments delivered (their
    cached marks count), and the kept assignment of the last read, when the walk reads on from it."""

    def __init__(self, cursors: dict[Partition, ScanCursor], done: dict,
                 on_deleted: Callable[[Deleted], None] | None, stalled: dict | None) -> None:
        super().__init__(cursors, done, on_deleted, stalled)
        self.at: dict[Partition, int] = {}  # where each partition's assignment reads: an offset or OFFSET_BEGINNING
        self.fresh: set[Partition] = set()  # partitions whose assignment delivered a record or an end-of-partition
        self.single = next(iter(cursors)) if len(cursors) == 1 else None
        # A partition done stops fetching while others go on; a single one ends the walk.
        self.pause = self.single is None
        self.queued: list = []  # messages the last read took from the queue but did not use
        self.carried = False  # reading on from the last read's assignment: records only (module docstring)
        self.last: list[Any] = []  # the last consume's records past the scan's limit
        self.events = False  # the last consume held an event

    def continues(self, parked: _Parked) -> bool:
        """Whether this walk starts where the read that kept ``parked`` stopped."""
        single = self.single
        return (single is not None and parked.tp == single and single in self.active
                and bool(self.keep.get(single)) and self.at.get(single) == parked.position)

    def may_park(self) -> bool:
        """Whether a read of one partition may keep its assignment for the next: it ended before the log
        end, with its assignment reading for the scan, and the last consume held no event."""
        single = self.single
        return (single is not None and not self.events and _before_the_end(self.done.get(single))
                and bool(self.keep.get(single)))


def _before_the_end(done: Any) -> bool:
    """A read that ended with everything it wanted read, not at the log end (more may follow)."""
    return isinstance(done, Done) and done.log_end is None


def _sort(msgs: list, single: Partition | None,
          cursors: Mapping[Partition, ScanCursor]) -> tuple[dict[Partition, list], dict[Partition, int], list[Partition]]:
    """A consume's messages by partition, its end-of-partition offsets and its out-of-range partitions.
    One ``error()`` call a message, no more: a single partition's records stay the consume's own list."""
    events = [m for m in msgs if m.error() is not None]
    records = [m for m in msgs if m.error() is None] if events else msgs
    eof: dict[Partition, int] = {}
    out_of_range: list[Partition] = []
    for m in events:
        err, tp = m.error(), (m.topic(), m.partition())
        if err.code() == KafkaError._PARTITION_EOF:
            eof[tp] = m.offset()
        elif err.code() == KafkaError._AUTO_OFFSET_RESET:
            out_of_range.append(tp)
        elif err.fatal() or not err.retriable():
            raise LogReadError(f"reading {_names(cursors)} failed: {err.str()}")
    if single is not None:
        return ({single: records} if records else {}), eof, out_of_range
    by_tp: dict[Partition, list] = {}
    for m in records:
        by_tp.setdefault((m.topic(), m.partition()), []).append(m)
    return by_tp, eof, out_of_range


def _record(m: Any) -> Record:
    return Record(m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers() or [], m.timestamp()[1])


def _offset(m: Any) -> int:
    return m.offset()


def _names(tps: Iterable[Partition]) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in tps)
