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
    qtps = [(q.name, p) for p in range(queue_partitions)]
    reader = open_log_reader(cfg.kafka, timeout_s)
    p = None if dry_run else producer(cfg.kafka, max_request_size=cfg.tracker.max_request_size,
                                      compression=q.compression)
    pending: dict[Partition, int] = {}  # DLQ position after the last record handled
    sent: list[tuple[Partition, int, Any]] = []  # (DLQ partition, DLQ offset, future) of the open batch
    marks: dict[Partition, int] = {}  # queue watermark: after our last acknowledged copy

    def settle() -> None:
        """Commit what is acknowledged: per DLQ partition up to its first failed copy, never past it."""
        if p is None:  # a dry run writes nothing
            pending.clear()
            return
        try:
            p.flush(timeout=30)
        except produce_errors():
            pass  # unfinished sends fail below, one by one
        failed: dict[Partition, tuple[int, BaseException]] = {}
        for tp, off, fut in sent:
            try:
                _topic, copy_partition, copy_offset = delivered_at(fut.get(timeout=0))
            except Exception as exc:  # noqa: BLE001 - decided per record
                if tp not in failed or off < failed[tp][0]:
                    failed[tp] = (off, exc)
                continue
            qtp = (q.name, copy_partition)
            marks[qtp] = max(marks.get(qtp, 0), copy_offset + 1)
        sent.clear()
        offsets = {tp: min(off, failed[tp][0]) if tp in failed else off for tp, off in pending.items()}
        offsets.update(marks)
        reader.commit(group, offsets)
        pending.clear()
        if failed:
            (topic, partition), (off, err) = min(failed.items(), key=lambda kv: kv[1][0])
            raise KmqError(f"DLQ replay of {queue} stopped at {topic}[{partition}] offset {off}: "
                           f"{type(err).__name__}: {err}; everything before it is committed in group {group}, "
                           f"run it again to continue (nothing is copied twice)")

    try:
        done = _already_copied(reader, group, q, qtps)
        # Watermarks before the first copy of this run: a crash in its first batch is recovered too.
        marks.update({qtp: end for qtp, (_start, end) in reader.bounds(qtps).items()})
        if p is not None:
            reader.commit(group, marks)
        committed = reader.committed(group, tps)
        if size_hint is not None:
            bounds = reader.bounds(tps)
            size_hint(sum(max(0, end - (c if (c := committed[tp]) is not None else start))
                          for tp, (start, end) in bounds.items()))
        started = time.monotonic()
        for tp, records in reader.scan(committed):
            for rec in records:
                if limit is not None and result.replayed >= limit:
                    break
                dl = _dead_letter(tp, rec)
                if (tp[1], rec.offset) in done:
                    result.already += 1
                elif (reason is None or dl.reason == reason) and (select is None or select(dl)):
                    if rate and p is not None:
                        wait = started + result.replayed / rate - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)  # the rate limit itself
                    problem = _unreplayable(dl)
                    if problem is None and p is not None:
                        problem = _send_one(p, q, dl, queue_partitions, sent, tp)
                    if problem is None:
                        result.replayed += 1
                        if p is None:
                            result.planned.append(PlannedCopy(tp[1], rec.offset, dl.reason,
                                                              _target_partition(dl, queue_partitions), dl.key))
                    else:
                        result.unreplayable.append(f"{tp[1]}:{rec.offset} {problem}")
                else:
                    result.skipped += 1
                pending[tp] = rec.offset + 1
                if progress is not None:
                    progress(1)
                if len(sent) >= _BATCH:
                    settle()
            if limit is not None and result.replayed >= limit:
                break
        settle()
    except (LogReadError, *produce_errors()) as exc:  # type: ignore[misc]  # mypy reads no starred tuple here
        raise KmqError(f"DLQ replay of {queue} stopped: {exc}; positions up to the last acknowledged batch are "
                       f"committed in group {group}, run it again to continue") from exc
    finally:
        reader.close()
        if p is not None:
            close_producer(p)
    return result


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
