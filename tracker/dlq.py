"""Dead letters: list them, replay them to the queue (``kmq dlq list|replay``).

A replay moves dead letters back to their queue partition (from
``kmq-origin``) with the delivery count reset: ``kmq-delivery-count`` and the
``kmq-dlq-*`` headers are dropped, ``kmq-origin`` and the application's
headers are kept. The DLQ position is committed in a replay consumer group
(one per reason filter by default) after every acknowledged batch, so a
replay that is interrupted or run again does not repeat what it already
moved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

from kafka import TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from kmq.clients import broker_errors, consumer as make_consumer, producer as make_producer
from kmq.config import Config, QueueConfig
from kmq.errors import KmqError
from kmq.message import (
    HEADER_DELIVERY_COUNT,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TS,
    HEADER_ORIGIN,
    header_text,
)
from kmq.topics import require_aligned

__all__ = ["DeadLetter", "list_dead_letters", "replay", "ReplayResult", "replay_group", "REASONS"]

REASONS = ("timeout", "nack-limit", "rejected")
_DROPPED = {HEADER_DELIVERY_COUNT, HEADER_DLQ_REASON, HEADER_DLQ_ERROR, HEADER_DLQ_TS}
_BATCH = 500


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
    """
    if reason is not None and reason not in REASONS:
        raise KmqError(f"--reason must be one of {', '.join(REASONS)}, got {reason!r}")
    q = cfg.queue(queue)
    tps, queue_partitions = _dlq_partitions(cfg, q)
    group = group or replay_group(cfg, queue, reason)
    result = ReplayResult(group=group)
    if not tps:
        return result
    c = make_consumer(cfg.kafka, group_id=group, enable_auto_commit=False, fetch_max_wait_ms=50, max_poll_records=_BATCH)
    p = make_producer(cfg.kafka)
    pending: dict[TopicPartition, int] = {}
    futures = []

    def settle() -> None:
        p.flush(timeout=30)
        for f in futures:
            f.get(timeout=0)  # a failed send stops the replay before its position is committed
        futures.clear()
        if pending:
            c.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in pending.items()})
            pending.clear()

    try:
        with broker_errors(cfg.kafka):
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
                if (reason is None or dl.reason == reason) and (select is None or select(dl)):
                    if rate:
                        wait = started + result.replayed / rate - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)  # the rate limit itself
                    origin_p = dl.origin_partition
                    target_p = origin_p if origin_p is not None and origin_p < queue_partitions else None
                    headers = [(k, v) for k, v in dl.headers if k not in _DROPPED]
                    futures.append(p.send(q.name, key=rec.key, value=rec.value, headers=headers, partition=target_p))
                    result.replayed += 1
                else:
                    result.skipped += 1
                pending[tp] = rec.offset + 1
                if progress is not None:
                    progress(1)
                if len(futures) >= _BATCH:
                    settle()
            settle()
    except KafkaError as exc:
        raise KmqError(f"DLQ replay of {queue} stopped: {exc}; positions up to the last acknowledged batch are "
                       f"committed in group {group}, run it again to continue") from exc
    finally:
        c.close()
        p.close()
    return result


def _high_waters_for(cfg: Config, tps: list[TopicPartition]):
    from tracker.status import high_waters

    return high_waters(cfg, tps)
