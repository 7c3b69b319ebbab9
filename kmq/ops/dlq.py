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
from typing import Callable, Iterator

from kafka import TopicPartition
from kafka.errors import KafkaError, MessageSizeTooLargeError
from kafka.structs import OffsetAndMetadata

from kmq.client.kafka_python.clients import broker_errors, consumer as make_consumer, producer as make_producer
from kmq.config import Config, QueueConfig
from kmq.core.errors import KmqError
from kmq.ops.status import high_waters
from kmq.core.message import (
    HEADER_DELIVERY_COUNT,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TS,
    HEADER_ORIGIN,
    header_text,
    parse_origin,
)
from kmq.client.topics import require_aligned
from kmq.core.copies import HEADER_DLQ_SIZE, producible_headers, reference_of

__all__ = ["DeadLetter", "list_dead_letters", "replay", "ReplayResult", "replay_group", "REASONS", "HEADER_REPLAY_OF"]

REASONS = ("timeout", "nack-limit", "rejected", "undeliverable")
_DROPPED = {HEADER_DELIVERY_COUNT, HEADER_DLQ_REASON, HEADER_DLQ_ERROR, HEADER_DLQ_TS}
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
    """Default replay group: one per queue and reason filter, so filtered replays do not skip each other."""
    return f"{cfg.tracker.group_id}-dlq-replay-{queue}" + (f"-{reason}" if reason else "")


def _read(consumer, tps: list[TopicPartition], timeout_s: float) -> Iterator:
    """Records of ``tps`` from the current positions up to the high-water marks seen at the first fetch."""
    target: dict[TopicPartition, int] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        got = False
        for tp, recs in consumer.poll(timeout_ms=200, max_records=_BATCH).items():
            for rec in recs:
                if tp in target and rec.offset >= target[tp]:
                    break
                got = True
                deadline = time.monotonic() + timeout_s
                yield tp, rec
        for tp in tps:
            if tp not in target and consumer.highwater(tp) is not None:
                target[tp] = consumer.highwater(tp)
        if len(target) == len(tps) and all(consumer.position(tp) >= target[tp] for tp in tps):
            return
        if not got and time.monotonic() > deadline:
            raise KmqError("timed out reading the DLQ: is the broker healthy?")


def _dlq_partitions(cfg: Config, q: QueueConfig) -> tuple[list[TopicPartition], int]:
    layout = require_aligned(cfg.kafka, q)
    return [TopicPartition(q.dlq_topic, p) for p in range(layout.dlq_partitions or 0)], layout.queue_partitions or 0


def list_dead_letters(cfg: Config, queue: str, timeout_s: float = 10.0) -> Iterator[DeadLetter]:
    """Every dead letter of ``queue`` now in the DLQ (read-only, no group)."""
    q = cfg.queue(queue)
    tps, _ = _dlq_partitions(cfg, q)
    if not tps:
        return
    c = make_consumer(cfg.kafka, enable_auto_commit=False, fetch_max_wait_ms=50)
    try:
        with broker_errors(cfg.kafka):
            c.assign(tps)
            c.seek_to_beginning(*tps)
            for tp, rec in _read(c, tps, timeout_s):
                yield DeadLetter(tp.partition, rec.offset, rec.key, rec.value, tuple(rec.headers or ()), rec.timestamp)
    finally:
        c.close()


@dataclass
class ReplayResult:
    replayed: int = 0
    skipped: int = 0
    group: str = ""
    already: int = 0  # sent by an earlier, interrupted run: not sent again
    unreplayable: list[str] = field(default_factory=list)  # "partition:offset cause" left in the DLQ


def replay(cfg: Config, queue: str, *, limit: int | None = None, rate: float | None = None, reason: str | None = None,
           group: str | None = None, progress: Callable[[int], None] | None = None,
           size_hint: Callable[[int], None] | None = None, timeout_s: float = 10.0,
           select: Callable[[DeadLetter], bool] | None = None) -> ReplayResult:
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
    """
    if reason is not None and reason not in REASONS:
        raise KmqError(f"--reason must be one of {', '.join(REASONS)}, got {reason!r}")
    q = cfg.queue(queue)
    tps, queue_partitions = _dlq_partitions(cfg, q)
    group = group or replay_group(cfg, queue, reason)
    result = ReplayResult(group=group)
    if not tps:
        return result
    qtps = [TopicPartition(q.name, p) for p in range(queue_partitions)]
    c = make_consumer(cfg.kafka, group_id=group, enable_auto_commit=False, fetch_max_wait_ms=50, max_poll_records=_BATCH)
    p = make_producer(cfg.kafka, max_request_size=cfg.tracker.max_request_size)
    pending: dict[TopicPartition, int] = {}  # DLQ position after the last record handled
    sent: list[tuple[TopicPartition, int, object]] = []  # (DLQ tp, DLQ offset, future) of the open batch
    marks: dict[TopicPartition, int] = {}  # queue watermark: after our last acknowledged copy

    def settle() -> None:
        """Commit what is acknowledged: per DLQ partition up to its first failed copy, never past it."""
        try:
            p.flush(timeout=30)
        except KafkaError:
            pass  # unfinished sends fail below, one by one
        failed: dict[TopicPartition, tuple[int, BaseException]] = {}
        for tp, off, fut in sent:
            try:
                meta = fut.get(timeout=0)
            except Exception as exc:  # noqa: BLE001 - decided per record
                if tp not in failed or off < failed[tp][0]:
                    failed[tp] = (off, exc)
                continue
            qtp = TopicPartition(q.name, meta.partition)
            marks[qtp] = max(marks.get(qtp, 0), meta.offset + 1)
        sent.clear()
        offsets = {tp: OffsetAndMetadata(min(off, failed[tp][0]) if tp in failed else off, "", -1)
                   for tp, off in pending.items()}
        offsets.update({qtp: OffsetAndMetadata(m, "", -1) for qtp, m in marks.items()})
        if offsets:
            c.commit(offsets)
        pending.clear()
        if failed:
            tp, (off, exc) = min(failed.items(), key=lambda kv: kv[1][0])
            raise KmqError(f"DLQ replay of {queue} stopped at {tp.topic}[{tp.partition}] offset {off}: "
                           f"{type(exc).__name__}: {exc}; everything before it is committed in group {group}, "
                           f"run it again to continue (nothing is copied twice)")

    try:
        with broker_errors(cfg.kafka):
            done = _already_copied(cfg, c, q, qtps, timeout_s)
            # Watermarks before the first copy of this run: a crash in its first batch is recovered too.
            hws_q, _ = _high_waters_for(cfg, qtps)
            marks.update(hws_q)
            c.commit({qtp: OffsetAndMetadata(m, "", -1) for qtp, m in marks.items()})
            c.assign(tps)
            for tp in tps:
                off = c.committed(tp)
                if off is None:
                    c.seek_to_beginning(tp)
                else:
                    c.seek(tp, off)
            if size_hint is not None:
                hws, _ = _high_waters_for(cfg, tps)
                size_hint(sum(max(0, hws[tp] - c.position(tp)) for tp in tps))
            started = time.monotonic()
            for tp, rec in _read(c, tps, timeout_s):
                if limit is not None and result.replayed >= limit:
                    break
                dl = DeadLetter(tp.partition, rec.offset, rec.key, rec.value, tuple(rec.headers or ()), rec.timestamp)
                if (tp.partition, rec.offset) in done:
                    result.already += 1
                elif (reason is None or dl.reason == reason) and (select is None or select(dl)):
                    if rate:
                        wait = started + result.replayed / rate - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)  # the rate limit itself
                    problem = _send_one(p, q, dl, queue_partitions, sent, tp)
                    if problem is None:
                        result.replayed += 1
                    else:
                        result.unreplayable.append(f"{tp.partition}:{rec.offset} {problem}")
                else:
                    result.skipped += 1
                pending[tp] = rec.offset + 1
                if progress is not None:
                    progress(1)
                if len(sent) >= _BATCH:
                    settle()
            settle()
    except KafkaError as exc:
        raise KmqError(f"DLQ replay of {queue} stopped: {exc}; positions up to the last acknowledged batch are "
                       f"committed in group {group}, run it again to continue") from exc
    finally:
        c.close()
        p.close()
    return result


def _send_one(p, q: QueueConfig, dl: DeadLetter, queue_partitions: int, sent: list, tp: TopicPartition) -> str | None:
    """Start the copy of one dead letter; the reason it cannot be produced, or None."""
    if dl.reference is not None:
        return (f"a reference dead letter cannot be replayed from the DLQ (its payload was too large for it, or "
                f"refused): re-produce the record from the queue log at {dl.reference} "
                f"(origin {dl.header(HEADER_ORIGIN)}) before retention deletes it")
    if dl.key is None and dl.value is None:
        return "tombstone (null key and value): kafka-python cannot produce one"
    origin_p = dl.origin_partition
    target_p = origin_p if origin_p is not None and 0 <= origin_p < queue_partitions else None
    headers = producible_headers([(k, v) for k, v in dl.headers if k not in _DROPPED and k != HEADER_REPLAY_OF])
    headers.append((HEADER_REPLAY_OF, f"{tp.topic}/{tp.partition}/{dl.offset}".encode()))
    try:
        fut = p.send(q.name, key=dl.key, value=dl.value, headers=headers, partition=target_p)
    except (TypeError, ValueError, AssertionError, MessageSizeTooLargeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    sent.append((tp, dl.offset, fut))
    return None


def _already_copied(cfg: Config, c, q: QueueConfig, qtps: list[TopicPartition], timeout_s: float) -> set[tuple[int, int]]:
    """(DLQ partition, offset) of copies an earlier run produced after its last commit.

    Reads each queue partition from the replay group's watermark to its end (only after an
    interrupted run is there anything to read)."""
    marks = {tp: c.committed(tp) for tp in qtps}
    marks = {tp: m for tp, m in marks.items() if m is not None}
    if not marks:
        return set()
    done: set[tuple[int, int]] = set()
    c.assign(list(marks))
    for tp, m in marks.items():
        c.seek(tp, m)
    for _tp, rec in _read(c, list(marks), timeout_s):
        # kmq-replay-of has kmq-origin's format: one parser for both.
        parsed = parse_origin(header_text(rec.headers, HEADER_REPLAY_OF) or "")
        if parsed is not None and parsed[0] == q.dlq_topic:
            done.add(parsed[1:])
    c.unsubscribe()
    return done


def _high_waters_for(cfg: Config, tps: list[TopicPartition]):
    return high_waters(cfg, tps)
