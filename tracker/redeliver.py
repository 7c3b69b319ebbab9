"""Redelivery: read originals, re-produce them or dead-letter them, write CLOSED.

For the due items of one partition (handed out by
:meth:`tracker.lease_state.PartitionState.due`):

1. read the original records from the queue log, verifying every offset
   (:mod:`tracker.log_reader`); offsets no longer in the log are closed with
   ``Outcome.MISSING``;
2. per record, ask the pure state what to do (delivery count from the
   ``kmq-delivery-count`` header): redeliver to the same queue partition,
   dead-letter to the DLQ (partition = original partition mod DLQ
   partitions), or wait (backoff);
3. once Kafka acknowledged the copies, write one CLOSED marker per outcome
   (coalesced ranges) to the markers partition and close the offsets in the
   state. A failure leaves the offsets open and schedules a retry with a
   capped backoff: never dropped, never blocking the other partitions.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from kafka.errors import KafkaError

from kmq.config import QueueConfig
from kmq.message import (
    HEADER_DELIVERY_COUNT,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TS,
    HEADER_ORIGIN,
    delivery_count_of,
    origin_of,
)
from kmq.markers import Closed, Outcome, encode, encode_key
from kmq.metrics import TrackerMetrics
from kmq.ranges import OffsetRange, coalesce
from tracker.lease_state import Action, DueItem, PartitionState
from tracker.log_reader import LogReader, LogReadError

__all__ = [
    "Redeliverer",
    "RedeliveryReport",
    "HEADER_DELIVERY_COUNT",
    "HEADER_ORIGIN",
    "HEADER_DLQ_REASON",
    "HEADER_DLQ_ERROR",
    "HEADER_DLQ_TS",
    "KMQ_HEADERS",
    "retry_delay_s",
]

log = logging.getLogger(__name__)

KMQ_HEADERS = (HEADER_DELIVERY_COUNT, HEADER_ORIGIN, HEADER_DLQ_REASON, HEADER_DLQ_ERROR, HEADER_DLQ_TS)
_REPLACED = {HEADER_DELIVERY_COUNT, HEADER_DLQ_REASON, HEADER_DLQ_ERROR, HEADER_DLQ_TS}

# Most ranges one CLOSED marker may carry (u16 in the wire format).
_MAX_RANGES = 0xFFFF


def retry_delay_s(failures: int, initial: float = 0.5, cap: float = 30.0) -> float:
    """Delay before retrying a failed redelivery (exponential, capped)."""
    return min(cap, initial * 2 ** max(0, failures))


@dataclass
class RedeliveryReport:
    """What one call of :meth:`Redeliverer.process` did (offsets counts)."""

    redelivered: int = 0
    dead_lettered: int = 0
    missing: int = 0
    deferred: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Redeliverer:
    """Turns due items of one markers partition into copies, dead letters and CLOSED markers."""

    def __init__(self, producer, reader: LogReader, metrics: TrackerMetrics,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000), send_timeout_s: float = 30.0) -> None:
        self._producer = producer
        self._reader = reader
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._send_timeout_s = send_timeout_s
        self._dlq_partitions: dict[str, int] = {}

    def process(self, queue: QueueConfig, partition: int, state: PartitionState, items: list[DueItem]) -> RedeliveryReport:
        """Handle ``items`` completely: every offset ends closed, deferred or scheduled for retry."""
        report = RedeliveryReport()
        if not items:
            return report
        try:
            self._process(queue, partition, state, items, report)
        except (KafkaError, LogReadError, OSError) as exc:
            # Everything not yet closed goes back with a capped backoff.
            worst = max(i.failures for i in items)
            delay = retry_delay_s(worst)
            left = state.open_within(r for i in items for r in i.ranges)
            n = sum(r.count for r in left)
            state.retry(left, self._clock_ms() + int(delay * 1000))
            report.failed += n
            self._metrics.redelivery_failures.labels(queue.name).inc(n)
            log.warning(
                "redelivery of %d message(s) from %s[%d] failed (%s: %s); they stay open and are retried in %.1fs",
                n, queue.name, partition, type(exc).__name__, exc, delay,
            )
        return report

    # ------------------------------------------------------------ steps
    def _process(self, queue: QueueConfig, partition: int, state: PartitionState, items: list[DueItem],
                 report: RedeliveryReport) -> None:
        ranges = coalesce_ranges(r for i in items for r in i.ranges)
        result = self._reader.read(queue.name, partition, ranges)
        if result.missing:
            n = sum(r.count for r in result.missing)
            self._write_closed(queue, partition, result.missing, Outcome.MISSING)
            state.close(result.missing)
            report.missing += n
            self._metrics.missing_offsets.labels(queue.name).inc(n)
            log.warning(
                "%d offset(s) of %s[%d] are no longer in the queue log (retention?) and were closed as missing: %s",
                n, queue.name, partition, _show(result.missing),
            )
        now = self._clock_ms()
        sends = []  # (offset, outcome, reason, due_ms, future)
        deferred: dict[tuple[int, int], list[int]] = defaultdict(list)
        for item in items:
            for r in item.ranges:
                for off in r.offsets():
                    rec = result.records.get(off)
                    if rec is None:
                        continue
                    count = delivery_count_of(rec.headers)
                    plan = state.plan(item, count, now)
                    if plan.action is Action.WAIT:
                        deferred[(plan.until_ms, count)].append(off)
                        continue
                    if plan.action is Action.REDELIVER:
                        fut = self._send_copy(queue, partition, rec, count)
                        sends.append((off, Outcome.REDELIVERED, item.reason.value, item.due_ms, fut))
                    else:
                        fut = self._send_dlq(queue, partition, rec, count, plan.dlq_reason or "timeout", item.error, now)
                        sends.append((off, Outcome.DEAD_LETTERED, plan.dlq_reason or "timeout", item.due_ms, fut))
        for (until, count), offs in deferred.items():
            state.defer(coalesce(offs), until, count)
            report.deferred += len(offs)
        if not sends:
            return
        self._producer.flush(timeout=self._send_timeout_s)
        done: dict[Outcome, list[int]] = defaultdict(list)
        failed: list[int] = []
        first_error: BaseException | None = None
        for off, outcome, reason, due_ms, fut in sends:
            try:
                fut.get(timeout=0)
            except Exception as exc:  # noqa: BLE001 - any send failure means: retry later
                failed.append(off)
                first_error = first_error or exc
                continue
            done[outcome].append(off)
            if outcome is Outcome.REDELIVERED:
                self._metrics.redelivered.labels(queue.name, reason).inc()
                report.redelivered += 1
            else:
                self._metrics.dead_lettered.labels(queue.name, reason).inc()
                report.dead_lettered += 1
            report.reasons[reason] += 1
            self._metrics.redelivery_delay_seconds.observe(max(0.0, (now - due_ms) / 1000.0))
        # The copies are acknowledged: write CLOSED so a restarted tracker does not repeat them.
        for outcome, offs in done.items():
            closed = coalesce(offs)
            state.close(closed)
            try:
                self._write_closed(queue, partition, closed, outcome)
            except KafkaError as exc:
                # Not lost: the copies exist. A restart before the next commit may redeliver once more.
                log.warning("CLOSED marker for %s[%d] not written (%s); a tracker restart may redeliver %d "
                            "message(s) once more", queue.name, partition, exc, len(offs))
        if failed:
            worst = max(i.failures for i in items)
            delay = retry_delay_s(worst)
            state.retry(coalesce(failed), self._clock_ms() + int(delay * 1000))
            report.failed += len(failed)
            self._metrics.redelivery_failures.labels(queue.name).inc(len(failed))
            log.warning("%d redelivery send(s) for %s[%d] failed (%s); they stay open and are retried in %.1fs",
                        len(failed), queue.name, partition, first_error, delay)

    def _send_copy(self, queue: QueueConfig, partition: int, rec, count: int):
        headers = [(k, v) for k, v in (rec.headers or ()) if k not in _REPLACED and k != HEADER_ORIGIN]
        headers.append((HEADER_DELIVERY_COUNT, str(count + 1).encode()))
        headers.append((HEADER_ORIGIN, origin_of(rec.headers, queue.name, partition, rec.offset).encode()))
        return self._producer.send(queue.name, value=rec.value, key=rec.key, headers=headers, partition=partition)

    def _send_dlq(self, queue: QueueConfig, partition: int, rec, count: int, reason: str, error: str, now_ms: int):
        headers = [(k, v) for k, v in (rec.headers or ()) if k not in _REPLACED and k != HEADER_ORIGIN]
        headers.append((HEADER_DELIVERY_COUNT, str(count).encode()))
        headers.append((HEADER_ORIGIN, origin_of(rec.headers, queue.name, partition, rec.offset).encode()))
        headers.append((HEADER_DLQ_REASON, reason.encode()))
        if error:
            headers.append((HEADER_DLQ_ERROR, error.encode("utf-8")))
        headers.append((HEADER_DLQ_TS, str(now_ms).encode()))
        dlq_p = partition % self._dlq_partition_count(queue.dlq_topic)
        return self._producer.send(queue.dlq_topic, value=rec.value, key=rec.key, headers=headers, partition=dlq_p)

    def _dlq_partition_count(self, topic: str) -> int:
        n = self._dlq_partitions.get(topic)
        if n is None:
            parts = self._producer.partitions_for(topic)
            if not parts:
                raise LogReadError(f"DLQ topic {topic!r} has no partitions (missing? run `kmq topics create`)")
            n = self._dlq_partitions[topic] = len(parts)
        return n

    def _write_closed(self, queue: QueueConfig, partition: int, ranges: list[OffsetRange], outcome: Outcome) -> None:
        futures = []
        for i in range(0, len(ranges), _MAX_RANGES):
            value = encode(Closed(tuple(ranges[i:i + _MAX_RANGES]), outcome))
            futures.append(self._producer.send(queue.markers_topic, value=value, key=encode_key(partition),
                                               partition=partition))
        self._producer.flush(timeout=self._send_timeout_s)
        for f in futures:
            f.get(timeout=0)


def coalesce_ranges(ranges) -> list[OffsetRange]:
    out: list[OffsetRange] = []
    for r in sorted(ranges):
        if out and r.first <= out[-1].end:
            end = max(out[-1].end, r.end)
            out[-1] = OffsetRange(out[-1].first, end - out[-1].first)
        else:
            out.append(OffsetRange(r.first, r.count))
    return out


def _show(ranges: list[OffsetRange], limit: int = 5) -> str:
    parts = [f"{r.first}" if r.count == 1 else f"{r.first}-{r.last}" for r in ranges[:limit]]
    return ", ".join(parts) + (" ..." if len(ranges) > limit else "")
