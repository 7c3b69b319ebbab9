"""Dead letters: list them, replay them to the queue (``kmq dlq list|replay``).

A replay moves dead letters back to their queue partition (from
``kmq-origin``) with the delivery count reset: ``kmq-delivery-count`` and the
``kmq-dlq-*`` headers are dropped, ``kmq-origin`` and the application's
headers are kept. The DLQ position is committed in a replay consumer group
(one per reason filter by default) after every acknowledged batch, so a
replay that is interrupted or run again does not repeat what it already
moved.

A *reference* dead letter (``kmq-dlq-reference``, written by the tracker when
the DLQ refused the record itself, e.g. too large) carries no payload: it is
listed, and a replay leaves it in the DLQ and names where the record is in
the queue log, to be re-produced from there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from kmq.client import (
    LogReader,
    LogReadError,
    Partition,
    close_producer,
    delivered_at,
    open_log_reader,
    produce_errors,
    producer,
    refused_record_errors,
)
from kmq.client.topics import require_aligned
from kmq.config import Config, QueueConfig
from kmq.core.copies import HEADER_DLQ_SIZE, producible_headers, reference_of
from kmq.core.errors import KmqError
from kmq.core.message import (
    HEADER_DELIVERY_COUNT,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TS,
    HEADER_GROUP,
    HEADER_ORIGIN,
    header_text,
    parse_origin,
)

__all__ = ["DeadLetter", "list_dead_letters", "replay", "ReplayResult", "PlannedCopy", "replay_group", "REASONS",
           "HEADER_REPLAY_OF"]

REASONS = ("timeout", "nack-limit", "rejected", "undeliverable")
_DROPPED = {HEADER_DELIVERY_COUNT, HEADER_DLQ_REASON, HEADER_DLQ_ERROR, HEADER_DLQ_TS, HEADER_GROUP}
_BATCH = 500
# On every replayed copy: the dead letter it was made from (``dlq-topic/partition/offset``).
HEADER_REPLAY_OF = "kmq-replay-of"


@dataclass(frozen=True)
class DeadLetter:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int

    def header(self, name: str) -> str | None:
        return header_text(self.headers, name)

    @property
    def reason(self) -> str | None:
        return self.header(HEADER_DLQ_REASON)

    @property
    def reference(self) -> str | None:
        """``topic/partition/offset`` of the record a reference dead letter names (its payload is not
        in the DLQ); None for a dead letter that carries its payload."""
        return reference_of(self.headers)

    def reference_note(self) -> str | None:
        """One line for a reference dead letter: where the record is, its size; None otherwise."""
        if self.reference is None:
            return None
        size = self.header(HEADER_DLQ_SIZE)
        return (f"reference: the payload is not in the DLQ; the record is at {self.reference} in the queue log"
                + (f" ({size} bytes)" if size else ""))

    @property
    def origin_partition(self) -> int | None:
        origin = self.header(HEADER_ORIGIN)
        if not origin:
            return None
        try:
            return int(origin.rsplit("/", 2)[1])
        except (IndexError, ValueError):
            return None


def replay_group(cfg: Config, queue: str, reason: str | None) -> str:
    """Default replay group: one per queue (its :attr:`~kmq.config.QueueConfig.label` for a named consumer
    group) and reason filter, so filtered replays do not skip each other."""
    return f"{cfg.tracker.group_id}-dlq-replay-{queue}" + (f"-{reason}" if reason else "")


def _dlq_partitions(cfg: Config, q: QueueConfig) -> tuple[list[Partition], int]:
    layout = require_aligned(cfg.kafka, q)
    return [(q.dlq_topic, p) for p in range(layout.dlq_partitions or 0)], layout.queue_partitions or 0


def _dead_letter(tp: Partition, rec: Any) -> DeadLetter:
    return DeadLetter(tp[1], rec.offset, rec.key, rec.value, tuple(rec.headers or ()), rec.timestamp)


def list_dead_letters(cfg: Config, queue: str, timeout_s: float = 10.0,
                      group: str | None = None) -> Iterator[DeadLetter]:
    """Every dead letter of ``queue`` (of its consumer ``group``) now in the DLQ (read-only, no group).
    ``timeout_s``: how long the read waits for an answer from the broker."""
    q = cfg.queue(queue, group)
    tps, _ = _dlq_partitions(cfg, q)
    if not tps:
        return
    reader = open_log_reader(cfg.kafka, timeout_s)
    try:
        for tp, records in reader.scan({tp: None for tp in tps}):
            for rec in records:
                yield _dead_letter(tp, rec)
    finally:
        reader.close()


@dataclass(frozen=True)
class PlannedCopy:
    """A dead letter a dry run would replay: its DLQ position, its reason and the queue partition
    its copy would go to (None: the producer's partitioner picks one)."""

    partition: int
    offset: int
    reason: str | None
    target_partition: int | None
    key: bytes | None


@dataclass
class ReplayResult:
    replayed: int = 0  # with dry_run: the number that would be replayed
    skipped: int = 0
    group: str = ""
    already: int = 0  # sent by an earlier, interrupted run: not sent again
    unreplayable: list[str] = field(default_factory=list)  # "partition:offset cause" left in the DLQ
    dry_run: bool = False
    planned: list[PlannedCopy] = field(default_factory=list)  # with dry_run: what a replay would copy


def replay(cfg: Config, queue: str, *, limit: int | None = None, rate: float | None = None, reason: str | None = None,
           group: str | None = None, progress: Callable[[int], None] | None = None,
           size_hint: Callable[[int], None] | None = None, timeout_s: float = 10.0,
           select: Callable[[DeadLetter], bool] | None = None, dry_run: bool = False,
           queue_group: str | None = None) -> ReplayResult:
    """Move dead letters of ``queue`` back to it; see the module docstring.

    ``rate`` caps replayed messages per second; ``progress(n)`` is called with
    the number of records handled since the last call; ``size_hint(total)``
    once with the number of DLQ records to look at. ``select`` narrows the
    replay further (the console's redrive of chosen dead letters): records it
    refuses count as skipped, like another ``reason``.

    Each copy carries ``kmq-replay-of`` (``dlq-topic/partition/offset``). The
    replay group commits, with the DLQ positions of every acknowledged batch,
    a watermark per queue partition (the offset after its last copy); a run
    after a crash or a failed batch reads the queue from the watermarks and
    skips dead letters whose copy is already there, so nothing is copied twice.
    A dead letter that cannot be produced (a tombstone, larger than the
    producer's request size) is left in the DLQ and reported, never a crash.

    ``dry_run``: read only: the result says what a replay would copy (:attr:`ReplayResult.planned`,
    each one's target partition) and leave; nothing is produced and nothing is committed. A record
    the broker would refuse (larger than the producer's request size) shows up only in a real run.

    ``queue_group``: the queue's consumer group whose DLQ is replayed (needed when the queue is
    configured for several). A named group's copies carry its ``kmq-group``, so the other groups'
    workers skip them; the default group's carry none.
    """
    if reason is not None and reason not in REASONS:
        raise KmqError(f"--reason must be one of {', '.join(REASONS)}, got {reason!r}")
    q = cfg.queue(queue, queue_group)
    tps, queue_partitions = _dlq_partitions(cfg, q)
    group = group or replay_group(cfg, q.label, reason)
    result = ReplayResult(group=group, dry_run=dry_run)
    if not tps:
        return result
    reader = open_log_reader(cfg.kafka, timeout_s)
    p = None if dry_run else producer(cfg.kafka, max_request_size=cfg.tracker.max_request_size,
                                      compression=q.compression)
    run = _ReplayRun(queue, q, group, reader, p, queue_partitions, result,
                     _Choice(reason, select, limit, rate), progress)
    try:
        run.copy_all(run.start(tps, size_hint))
    except (LogReadError, *produce_errors()) as exc:  # type: ignore[misc]  # mypy reads no starred tuple here
        raise KmqError(f"DLQ replay of {queue} stopped: {exc}; positions up to the last acknowledged batch are "
                       f"committed in group {group}, run it again to continue") from exc
    finally:
        reader.close()
        if p is not None:
            close_producer(p)
    return result


@dataclass(frozen=True)
class _Choice:
    """Which dead letters a replay copies, how many and how fast."""

    reason: str | None
    select: Callable[[DeadLetter], bool] | None
    limit: int | None
    rate: float | None

    def wants(self, dl: DeadLetter) -> bool:
        return (self.reason is None or dl.reason == self.reason) and (self.select is None or self.select(dl))


class _ReplayRun:
    """One replay: the DLQ records it reads, the copies it sends, and the positions it commits
    once those copies are acknowledged."""

    def __init__(self, queue: str, q: QueueConfig, group: str, reader: LogReader, p: Any, queue_partitions: int,
                 result: ReplayResult, choice: _Choice, progress: Callable[[int], None] | None) -> None:
        self.queue = queue  # as the caller named it, for errors
        self.q = q
        self.group = group
        self.reader = reader
        self.p = p  # None: a dry run, which writes nothing
        self.queue_partitions = queue_partitions
        self.result = result
        self.choice = choice
        self.progress = progress
        self.pending: dict[Partition, int] = {}  # DLQ position after the last record handled
        self.sent: list[tuple[Partition, int, Any]] = []  # (DLQ partition, DLQ offset, future) of the open batch
        self.marks: dict[Partition, int] = {}  # queue watermark: after our last acknowledged copy
        self.done: set[tuple[int, int]] = set()  # copied by an earlier, interrupted run
        self.started = time.monotonic()

    def start(self, tps: list[Partition], size_hint: Callable[[int], None] | None) -> dict[Partition, int | None]:
        """Recover what an earlier run copied and commit the watermarks; the DLQ positions to read from."""
        qtps = [(self.q.name, p) for p in range(self.queue_partitions)]
        self.done = _already_copied(self.reader, self.group, self.q, qtps)
        # Watermarks before the first copy of this run: a crash in its first batch is recovered too.
        self.marks.update({qtp: end for qtp, (_start, end) in self.reader.bounds(qtps).items()})
        if self.p is not None:
            self.reader.commit(self.group, self.marks)
        committed = self.reader.committed(self.group, tps)
        if size_hint is not None:
            bounds = self.reader.bounds(tps)
            size_hint(sum(max(0, end - (c if (c := committed[tp]) is not None else start))
                          for tp, (start, end) in bounds.items()))
        self.started = time.monotonic()
        return committed

    def copy_all(self, committed: dict[Partition, int | None]) -> None:
        """Read the DLQ from ``committed`` to its end (or the limit), copying and committing in batches."""
        for tp, records in self.reader.scan(committed):
            for rec in records:
                if self._at_limit():
                    break
                self._handle(tp, rec)
                if len(self.sent) >= _BATCH:
                    self.settle()
            if self._at_limit():
                break
        self.settle()

    def _at_limit(self) -> bool:
        return self.choice.limit is not None and self.result.replayed >= self.choice.limit

    def _handle(self, tp: Partition, rec: Any) -> None:
        dl = _dead_letter(tp, rec)
        if (tp[1], rec.offset) in self.done:
            self.result.already += 1
        elif self.choice.wants(dl):
            self._copy(tp, dl)
        else:
            self.result.skipped += 1
        self.pending[tp] = rec.offset + 1
        if self.progress is not None:
            self.progress(1)

    def _copy(self, tp: Partition, dl: DeadLetter) -> None:
        """Send ``dl``'s copy (a dry run plans it), or report why it stays in the DLQ."""
        if self.choice.rate and self.p is not None:
            wait = self.started + self.result.replayed / self.choice.rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the rate limit itself
        problem = _unreplayable(dl)
        if problem is None and self.p is not None:
            problem = _send_one(self.p, self.q, dl, self.queue_partitions, self.sent, tp)
        if problem is not None:
            self.result.unreplayable.append(f"{tp[1]}:{dl.offset} {problem}")
            return
        self.result.replayed += 1
        if self.p is None:
            self.result.planned.append(PlannedCopy(tp[1], dl.offset, dl.reason,
                                                   _target_partition(dl, self.queue_partitions), dl.key))

    def settle(self) -> None:
        """Commit what is acknowledged: per DLQ partition up to its first failed copy, never past it."""
        if self.p is None:  # a dry run writes nothing
            self.pending.clear()
            return
        try:
            self.p.flush(timeout=30)
        except produce_errors():
            pass  # unfinished sends fail below, one by one
        failed = self._collect_sent()
        offsets = {tp: min(off, failed[tp][0]) if tp in failed else off for tp, off in self.pending.items()}
        offsets.update(self.marks)
        self.reader.commit(self.group, offsets)
        self.pending.clear()
        if failed:
            (topic, partition), (off, exc) = min(failed.items(), key=lambda kv: kv[1][0])
            raise KmqError(f"DLQ replay of {self.queue} stopped at {topic}[{partition}] offset {off}: "
                           f"{type(exc).__name__}: {exc}; everything before it is committed in group {self.group}, "
                           f"run it again to continue (nothing is copied twice)")

    def _collect_sent(self) -> dict[Partition, tuple[int, BaseException]]:
        """Move the queue watermarks past the acknowledged copies of the open batch; per DLQ
        partition, the first copy that failed (offset, error)."""
        failed: dict[Partition, tuple[int, BaseException]] = {}
        for tp, off, fut in self.sent:
            try:
                _topic, copy_partition, copy_offset = delivered_at(fut.get(timeout=0))
            except Exception as exc:  # noqa: BLE001 - decided per record
                if tp not in failed or off < failed[tp][0]:
                    failed[tp] = (off, exc)
                continue
            qtp = (self.q.name, copy_partition)
            self.marks[qtp] = max(self.marks.get(qtp, 0), copy_offset + 1)
        self.sent.clear()
        return failed


def _unreplayable(dl: DeadLetter) -> str | None:
    """Why ``dl`` cannot be replayed from the DLQ at all, or None."""
    if dl.reference is not None:
        return (f"a reference dead letter cannot be replayed from the DLQ (its payload was too large for it, or "
                f"refused): re-produce the record from the queue log at {dl.reference} "
                f"(origin {dl.header(HEADER_ORIGIN)}) before retention deletes it")
    if dl.key is None and dl.value is None:
        return "tombstone (null key and value): kafka-python cannot produce one"
    return None


def _target_partition(dl: DeadLetter, queue_partitions: int) -> int | None:
    """The queue partition of ``dl``'s copy: its origin's, when the queue still has it."""
    origin_p = dl.origin_partition
    return origin_p if origin_p is not None and 0 <= origin_p < queue_partitions else None


def _send_one(p, q: QueueConfig, dl: DeadLetter, queue_partitions: int, sent: list, tp: Partition) -> str | None:
    """Start the copy of one dead letter (replayable: :func:`_unreplayable`); why the producer
    refused it, or None."""
    target_p = _target_partition(dl, queue_partitions)
    headers = producible_headers([(k, v) for k, v in dl.headers if k not in _DROPPED and k != HEADER_REPLAY_OF])
    headers.append((HEADER_REPLAY_OF, f"{tp[0]}/{tp[1]}/{dl.offset}".encode()))
    # A replay's delivery count is reset: kmq-group (default included) keeps it the group's own.
    headers.append((HEADER_GROUP, q.group_name.encode()))
    try:
        fut = p.send(q.name, key=dl.key, value=dl.value, headers=headers, partition=target_p)
    except refused_record_errors() as exc:
        return f"{type(exc).__name__}: {exc}"
    sent.append((tp, dl.offset, fut))
    return None


def _already_copied(reader: LogReader, group: str, q: QueueConfig, qtps: list[Partition]) -> set[tuple[int, int]]:
    """(DLQ partition, offset) of copies an earlier run produced after its last commit.

    Reads each queue partition from the replay group's watermark to its end (only after an
    interrupted run is there anything to read)."""
    marks = {tp: m for tp, m in reader.committed(group, qtps).items() if m is not None}
    done: set[tuple[int, int]] = set()
    for _tp, records in reader.scan(marks):
        for rec in records:
            # kmq-replay-of has kmq-origin's format: one parser for both.
            parsed = parse_origin(header_text(rec.headers, HEADER_REPLAY_OF) or "")
            if parsed is not None and parsed[0] == q.dlq_topic:
                done.add(parsed[1:])
    return done
