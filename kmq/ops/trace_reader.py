"""Read what ``kmq trace`` and the console's trace view need from Kafka.

The Kafka edge of :mod:`kmq.core.trace`. Every copy of a message sits in its
origin's queue partition p and every marker about it in markers partition p,
so a trace reads (in this order, each once, from a bounded start up to the
high-water mark seen at its first fetch):

* queue partition p from the origin's offset (``--key``: every partition);
* markers partition p from the tracker group's committed offset, which is
  the oldest START that still has open offsets: enough for anything in
  flight, cheap because a tracker commits as it goes (the log start while
  the tracker group has committed nothing, as a new tracker would). With ``since`` it
  starts at the offsets of ``now - since`` instead (``offsets_for_times``)
  and also drops older records as it reads, so a broker that answers that
  look-up with an earlier offset costs more reading, never a wrong trace;
* the DLQ partition ``p mod dlq_partitions`` (from the start, or ``since``).

Cost: records read = (queue high-water - start) + (markers high-water -
start) + DLQ records, at the consumer's fetch speed; only the records of the
traced message are kept. No consumer group is joined and nothing is
committed: a trace never disturbs the tracker or the workers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from kmq.client import LogReadError, Partition, open_log_reader
from kmq.client.topics import require_aligned
from kmq.config import Config, QueueConfig
from kmq.core.errors import TraceError
from kmq.core.markers import Start, decode_record
from kmq.core.message import for_group, origin_of
from kmq.core.trace import Trace, TraceBuilder, parse_origin

__all__ = ["trace", "Progress", "MAX_KEY_MATCHES"]

# --key can match many messages (keys are not unique); the newest ones are the useful ones.
MAX_KEY_MATCHES = 20

# progress(topic, partition, records read so far, records to read in this partition)
Progress = Callable[[str, int, int, int], None]


@dataclass(frozen=True)
class _Window:
    """Where each read starts and why (reported in the trace's ``scan``)."""

    markers_from: dict[int, int]
    markers_source: str


def trace(cfg: Config, queue: str, *, origin: str | None = None, key: str | None = None,
          partition: int | None = None, offset: int | None = None, since_s: float | None = None,
          tracker_group: str | None = None, workers_group: str | None = None, now_ms: int | None = None,
          progress: Progress | None = None, timeout_s: float = 30.0, group: str | None = None) -> list[Trace]:
    """Timelines of the message(s) selected by exactly one of ``origin``, ``key`` or
    ``partition`` + ``offset``; see the module docstring for what is read."""
    chosen = sum(x is not None for x in (origin, key, offset if partition is not None else None))
    if chosen != 1 or (partition is None) != (offset is None):
        raise TraceError("name exactly one message: ORIGIN (topic/partition/offset), --key K, "
                         "or --partition P --offset O")
    q = cfg.queue(queue, group)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    since_ms = None if since_s is None else now_ms - int(since_s * 1000)
    layout = require_aligned(cfg.kafka, q)
    n = layout.queue_partitions or 0
    reader = _Reader(cfg, q, since_ms, progress, timeout_s)
    try:
        return _trace(reader, cfg, q, n, layout.dlq_partitions or 0, origin, key, partition, offset,
                      tracker_group or cfg.tracker.group_id, workers_group or cfg.workers_group(q), now_ms)
    except LogReadError as exc:
        raise LogReadError(f"reading the history of {queue} failed: {exc}") from exc
    finally:
        reader.close()


def _trace(r: "_Reader", cfg: Config, q: QueueConfig, n: int, dlq_n: int, origin, key, partition, offset,
           tracker_group: str, workers_group: str, now_ms: int) -> list[Trace]:
    origin, partition, offset = _target(r, q, n, origin, partition, offset)
    partitions = range(n) if key is not None else [partition]
    markers_tps = [(q.markers_topic, p) for p in partitions]
    window = _markers_window(r, tracker_group, markers_tps)
    builders = _builders(r, q, partitions, origin, offset, key, window)
    by_partition: dict[int, list[TraceBuilder]] = {}
    for b in builders.values():
        by_partition.setdefault(b.partition, []).append(b)
    for p, bs in sorted(by_partition.items()):
        r.feed_markers(p, window.markers_from.get(p), bs)
    for dp in sorted({p % dlq_n for p in by_partition} if dlq_n else ()):
        r.feed_dlq(dp, [b for bs in by_partition.values() for b in bs])
    workers = r.committed(workers_group, [(q.name, p) for p in by_partition])
    out = [replace(b.result(now_ms, workers.get((q.name, b.partition))), scan=_scan_notes(r, window, b))
           for b in builders.values()]
    return sorted(out, key=lambda t: parse_origin(t.origin)[1:])


def _target(r: "_Reader", q: QueueConfig, n: int, origin, partition, offset) -> tuple:
    """(origin, partition, offset) of the message traced: from its origin, or from a position in the
    queue (a copy names its first delivery: traced from there). A key search keeps them as given."""
    if partition is not None and not 0 <= partition < n:
        raise TraceError(f"{q.name} has partitions 0..{n - 1}, not {partition}")
    if origin is not None:
        topic, partition, offset = parse_origin(origin)
        if topic != q.name or partition >= n:
            raise TraceError(f"origin {origin} is not a message of queue {q.name} (partitions 0..{n - 1})")
    elif partition is not None:
        origin = r.origin_at(partition, offset)
        offset = parse_origin(origin)[2]  # a copy names its first delivery: read from there
    return origin, partition, offset


def _markers_window(r: "_Reader", tracker_group: str, markers_tps: list[Partition]) -> "_Window":
    """Where the markers are read from: ``since``, else the tracker's committed offsets."""
    committed = r.committed(tracker_group, markers_tps)
    if r.since_ms is not None:
        return _Window(r.offsets_at(markers_tps), "since")
    return _Window({tp[1]: committed[tp] for tp in markers_tps if committed[tp] is not None},  # type: ignore[misc]
                   "tracker committed offset")


def _builders(r: "_Reader", q: QueueConfig, partitions, origin, offset, key,
              window: "_Window") -> dict[str, TraceBuilder]:
    """A builder per message traced, fed from the queue: the one at ``origin``, or the newest
    ``MAX_KEY_MATCHES`` with ``key``."""
    builders: dict[str, TraceBuilder] = {}
    for p in partitions:
        if key is None:
            builders[origin] = TraceBuilder(q.name, origin)
            r.feed_queue(p, max(offset, r.offset_at(q.name, p)), builders, None)
        else:
            start = r.offset_at(q.name, p) if r.since_ms is not None else r.oldest_started(p, window)
            r.feed_queue(p, start, builders, key.encode("utf-8"))
    if len(builders) > MAX_KEY_MATCHES:  # keep the newest messages with this key
        newest = sorted(builders, key=lambda o: parse_origin(o)[2])[-MAX_KEY_MATCHES:]
        builders = {o: builders[o] for o in newest}
    return builders


def _scan_notes(r: "_Reader", window: "_Window", b: TraceBuilder) -> dict:
    """What a trace says about the read behind it."""
    return {"since_ms": r.since_ms, "markers_from": window.markers_from.get(b.partition),
            "markers_from_source": window.markers_source if b.partition in window.markers_from else "log start",
            "records_read": r.records_read, "bad_markers": b.bad_markers}


class _Reader:
    """One :class:`~kmq.client.api.LogReader`, reading one partition at a time."""

    def __init__(self, cfg: Config, q: QueueConfig, since_ms: int | None, progress: Progress | None,
                 timeout_s: float) -> None:
        self.cfg, self.q, self.since_ms, self.progress = cfg, q, since_ms, progress
        self.records_read = 0
        self.reader = open_log_reader(cfg.kafka, timeout_s)

    def close(self) -> None:
        self.reader.close()

    def committed(self, group: str, tps: list[Partition]) -> dict[Partition, int | None]:
        return self.reader.committed(group, tps)

    def offsets_at(self, tps: list[Partition]) -> dict[int, int]:
        """First offset at or after ``since`` per partition (the log end when there is none)."""
        assert self.since_ms is not None  # callers check
        found = self.reader.offsets_at(tps, self.since_ms)
        return {tp[1]: (off if off is not None else self._end(tp)) for tp, off in found.items()}

    def offset_at(self, topic: str, p: int) -> int:
        return 0 if self.since_ms is None else self.offsets_at([(topic, p)])[p]

    def _end(self, tp: Partition) -> int:
        return self.reader.high_waters({tp: None})[tp]

    def _scan(self, tp: Partition, start: int | None) -> Iterator:
        """Records of ``tp`` from ``start`` (None: log start) to the end of its log as the read found it."""
        total = None
        if self.progress is not None:
            first, end = self.reader.bounds([tp])[tp]
            total = max(0, end - (first if start is None else max(first, start)))
        done = 0
        try:
            for _tp, records in self.reader.scan({tp: start}):
                done += len(records)
                for rec in records:
                    if self.since_ms is None or rec.timestamp >= self.since_ms:
                        yield rec
                if total is not None:
                    self.progress(tp[0], tp[1], done, max(total, done))  # type: ignore[misc]  # total: with a progress
        finally:
            self.records_read += done

    def origin_at(self, p: int, offset: int) -> str:
        tp = (self.q.name, p)
        since, self.since_ms = self.since_ms, None  # the named record itself, whatever its age
        try:
            for rec in self._scan(tp, offset):
                if rec.offset != offset:
                    break
                return origin_of(rec.headers, self.q.name, p, offset)
        finally:
            self.since_ms = since
        raise TraceError(f"no record at {self.q.name} partition {p} offset {offset} "
                         "(past the end of the log, or already deleted by retention)")

    def oldest_started(self, p: int, window: _Window) -> int | None:
        """Smallest queue offset a START names in the scanned markers (``--key`` without ``--since``)."""
        lowest = None
        for rec in self._scan((self.q.markers_topic, p), window.markers_from.get(p)):
            m = decode_record(rec.key, rec.value, p)
            if isinstance(m, Start):
                lowest = m.ranges[0].first if lowest is None else min(lowest, m.ranges[0].first)
        return lowest if lowest is not None else self._end((self.q.name, p))

    def feed_queue(self, p: int, start: int | None, builders: dict[str, TraceBuilder], key: bytes | None) -> None:
        for rec in self._scan((self.q.name, p), start):
            if not for_group(rec.headers, self.q.group, self.q.name, p, rec.offset):
                continue  # another consumer group's copy: not a delivery of this group
            o = origin_of(rec.headers, self.q.name, p, rec.offset)
            if key is not None and rec.key == key and o not in builders:
                builders[o] = TraceBuilder(self.q.name, o)
            b = builders.get(o)
            if b is not None:
                b.add_queue_record(p, rec.offset, rec.timestamp, rec.key, rec.headers)

    def feed_markers(self, p: int, start: int | None, builders: list[TraceBuilder]) -> None:
        # Each builder decodes (and checks the key: a marker keyed for another partition is a bad one).
        for rec in self._scan((self.q.markers_topic, p), start):
            for b in builders:
                b.add_marker_record(rec.offset, rec.timestamp, rec.key, rec.value)

    def feed_dlq(self, dp: int, builders: list[TraceBuilder]) -> None:
        tp = (self.q.dlq_topic, dp)
        start = self.offsets_at([tp])[dp] if self.since_ms is not None else None
        for rec in self._scan(tp, start):
            for b in builders:
                if b.add_dlq_record(dp, rec.offset, rec.timestamp, rec.headers):
                    break
