"""Redelivery: read originals, re-produce them or dead-letter them, write CLOSED.

For the due items of one partition (handed out by
:meth:`kmq.core.lease_state.PartitionState.due`):

1. read the original records from the queue log, verifying every offset
   (:class:`kmq.client.LogReader`); offsets no longer in the log, or at or past
   its end, are closed with ``Outcome.MISSING``;
2. per record, ask the pure state what to do (delivery count from the
   ``kmq-delivery-count`` header): redeliver to the same queue partition,
   dead-letter to the DLQ (partition = original partition mod DLQ
   partitions), or wait (backoff);
3. once Kafka acknowledged the copies, write one CLOSED marker per outcome
   (coalesced ranges) to the markers partition and close the offsets in the
   state.

Failures are per record (:mod:`kmq.core.copies` decides): a record whose copy
cannot be made is dead-lettered, one the DLQ refuses too is closed as
undeliverable; a transient failure leaves only that record's offsets open
with a capped backoff. One record never stops the service, never blocks the
records behind it, and what was already copied is closed, not copied again.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from kafka.errors import (
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)

from kmq.client import LogReader, LogReadError, refused_record_errors
from kmq.config import QueueConfig
from kmq.core.errors import DeadLetterTopicUnavailable
from kmq.core.message import (
    HEADER_DELIVERY_COUNT,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TS,
    HEADER_ORIGIN,
    delivery_count_of,
    origin_of,
)
from kmq.core.markers import MAX_U32, Closed, Outcome, encode, encode_key
from kmq.telemetry.metrics import TrackerMetrics
from kmq.core.ranges import OffsetRange, RangeSet, coalesce
from kmq.core.copies import REASON_UNDELIVERABLE, Fallback, Step, copy_problem, fallback, producible_headers
from kmq.core.lease_state import Action, DueItem, PartitionState

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
# A missing or forbidden DLQ topic is looked up again at most this often (no lookup storm, no blocking).
_DLQ_RECHECK_S = 10.0
# Errors that fail again for the same record however often it is retried.
_PERMANENT = refused_record_errors()


def retry_delay_s(failures: int, initial: float = 0.5, cap: float = 30.0) -> float:
    """Delay before retrying a failed redelivery (exponential, capped)."""
    return min(cap, initial * 2 ** min(max(0, failures), 32))


def failure_cause(step: Step, exc: BaseException) -> str:
    """Short metric label for a failed send (``kmq_tracker_record_failures_total{cause}``)."""
    if isinstance(exc, (MessageSizeTooLargeError, RecordListTooLargeError)):
        return "too_large"
    if isinstance(exc, DeadLetterTopicUnavailable) or (
            step is Step.DEAD_LETTER and isinstance(exc, UnknownTopicOrPartitionError)):
        return "dlq_missing"
    if isinstance(exc, TopicAuthorizationFailedError):
        return "dlq_forbidden" if step is Step.DEAD_LETTER else "forbidden"
    if isinstance(exc, _PERMANENT):
        return "invalid_record"
    return "send_failed"


@dataclass
class RedeliveryReport:
    """What one call of :meth:`Redeliverer.process` did (offsets counts)."""

    redelivered: int = 0
    dead_lettered: int = 0
    missing: int = 0
    undeliverable: int = 0
    deferred: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    causes: dict[str, int] = field(default_factory=lambda: defaultdict(int))


@dataclass
class _Send:
    """One record on its way to the queue or the DLQ."""

    offset: int
    rec: object
    count: int
    item: DueItem
    step: Step
    reason: str  # redelivery reason or kmq-dlq-reason
    error: str  # kmq-dlq-error text
    future: object = None
    failure: BaseException | None = None


class Redeliverer:
    """Turns due items of one markers partition into copies, dead letters and CLOSED markers."""

    def __init__(self, producer, reader: LogReader, metrics: TrackerMetrics,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000), send_timeout_s: float = 30.0,
                 max_request_size: int = 1_048_576) -> None:
        self._producer = producer
        # CLOSED markers must fit the producer's request size too: 12 bytes a range, plus headroom.
        self._max_ranges = max(1, min(_MAX_RANGES, (max_request_size - 512) // 12))
        self._reader = reader
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._send_timeout_s = send_timeout_s
        self._dlq_partitions: dict[str, int] = {}
        self._dlq_down: dict[str, tuple[float, str]] = {}  # topic -> (recheck at, monotonic; why)

    def process(self, queue: QueueConfig, partition: int, state: PartitionState, items: list[DueItem]) -> RedeliveryReport:
        """Handle ``items`` completely: every offset ends closed, deferred or scheduled for retry."""
        report = RedeliveryReport()
        if not items:
            return report
        try:
            self._process(queue, partition, state, items, report)
        except (KafkaError, LogReadError, OSError) as exc:
            # Reading the log or writing CLOSED failed: everything not yet closed goes back with a capped backoff.
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
        missing = RangeSet(result.missing)
        if result.log_end is not None:
            # Offsets at or past the end of the queue log were never written: close all of them at
            # once, also the parts of a huge START that due() has not handed out yet.
            for r in state.open_from(result.log_end):
                missing.add(r.first, r.count)
        if missing:
            gone = state.open_within(missing)
            n = sum(r.count for r in gone)
            if n:
                self._write_closed(queue, partition, gone, Outcome.MISSING)
                state.close(gone)
                report.missing += n
                self._metrics.missing_offsets.labels(queue.name).inc(n)
                log.warning(
                    "%d offset(s) of %s[%d] are not in the queue log (deleted by retention, or never written) and "
                    "were closed as missing: %s", n, queue.name, partition, _show(gone),
                )
        now = self._clock_ms()
        sends: list[_Send] = []
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
                    problem = copy_problem(rec.key, rec.value)
                    if plan.action is Action.REDELIVER and problem is None:
                        sends.append(_Send(off, rec, count, item, Step.COPY, item.reason.value, ""))
                    elif plan.action is Action.REDELIVER:
                        sends.append(_Send(off, rec, count, item, Step.DEAD_LETTER, REASON_UNDELIVERABLE, problem))
                    else:
                        sends.append(_Send(off, rec, count, item, Step.DEAD_LETTER, plan.dlq_reason or "timeout",
                                           item.error))
        for (until, count), offs in deferred.items():
            state.defer(coalesce(offs), until, count)
            report.deferred += len(offs)
        if not sends:
            return
        self._send_all(queue, partition, sends, now)
        done: dict[Outcome, list[int]] = defaultdict(list)
        retry: list[_Send] = []
        second: list[_Send] = []
        for s in sends:
            if s.failure is None:
                self._count_done(queue, s, now, report, done)
            else:
                self._count_failure(queue, partition, s, report, done, retry, second)
        if second:
            # Copies refused for good: dead-letter these records instead (same step, same rules).
            self._send_all(queue, partition, second, now)
            for s in second:
                if s.failure is None:
                    self._count_done(queue, s, now, report, done)
                else:
                    self._count_failure(queue, partition, s, report, done, retry, [])
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
        if retry:
            worst = max(s.item.failures for s in retry)
            delay = retry_delay_s(worst)
            state.retry(coalesce(s.offset for s in retry), self._clock_ms() + int(delay * 1000))
            report.failed += len(retry)
            self._metrics.redelivery_failures.labels(queue.name).inc(len(retry))
            first = retry[0]
            log.warning("%d redelivery send(s) for %s[%d] failed (first: offset %d, %s: %s); they stay open and are "
                        "retried in %.1fs", len(retry), queue.name, partition, first.offset,
                        type(first.failure).__name__, first.failure, delay)

    def _send_all(self, queue: QueueConfig, partition: int, sends: list[_Send], now: int) -> None:
        """Start every send, flush once, then record each one's own result in ``failure``."""
        for s in sends:
            try:
                if s.step is Step.COPY:
                    s.future = self._send_copy(queue, partition, s.rec, s.count)
                else:
                    s.future = self._send_dlq(queue, partition, s.rec, s.count, s.reason, s.error, now)
            except Exception as exc:  # noqa: BLE001 - refused before it left: this record only
                s.failure = exc
        if any(s.future is not None for s in sends):
            try:
                self._producer.flush(timeout=self._send_timeout_s)
            except KafkaError as exc:
                # Unfinished sends fail below, each on its own; finished ones still count.
                log.warning("flushing redeliveries of %s[%d] timed out (%s)", queue.name, partition, exc)
        for s in sends:
            if s.future is None:
                continue
            try:
                s.future.get(timeout=0)
            except Exception as exc:  # noqa: BLE001 - any send failure: decided per record below
                s.failure = exc

    def _count_done(self, queue: QueueConfig, s: _Send, now: int, report: RedeliveryReport,
                    done: dict[Outcome, list[int]]) -> None:
        if s.step is Step.COPY:
            done[Outcome.REDELIVERED].append(s.offset)
            self._metrics.redelivered.labels(queue.name, s.reason).inc()
            report.redelivered += 1
        else:
            done[Outcome.DEAD_LETTERED].append(s.offset)
            self._metrics.dead_lettered.labels(queue.name, s.reason).inc()
            report.dead_lettered += 1
            if s.reason == REASON_UNDELIVERABLE:
                log.warning("%s offset %d dead-lettered as undeliverable: %s", queue.name, s.offset, s.error)
        report.reasons[s.reason] += 1
        self._metrics.redelivery_delay_seconds.observe(max(0.0, (now - s.item.due_ms) / 1000.0))

    def _count_failure(self, queue: QueueConfig, partition: int, s: _Send, report: RedeliveryReport,
                       done: dict[Outcome, list[int]], retry: list[_Send], second: list[_Send]) -> None:
        exc = s.failure
        assert exc is not None
        cause = failure_cause(s.step, exc)
        self._metrics.record_failures.labels(queue.name, cause).inc()
        report.causes[cause] += 1
        if isinstance(exc, (TopicAuthorizationFailedError, UnknownTopicOrPartitionError)) and s.step is Step.DEAD_LETTER:
            self._dlq_unavailable(queue.dlq_topic, f"{type(exc).__name__}: {exc}")
        move = fallback(s.step, isinstance(exc, _PERMANENT))
        text = f"{type(exc).__name__}: {exc}"
        if move is Fallback.DEAD_LETTER:
            second.append(_Send(s.offset, s.rec, s.count, s.item, Step.DEAD_LETTER, REASON_UNDELIVERABLE,
                                f"copy to the queue refused: {text}"[:2000]))
        elif move is Fallback.UNDELIVERABLE:
            done[Outcome.UNDELIVERABLE].append(s.offset)
            report.undeliverable += 1
            self._metrics.undeliverable.labels(queue.name, cause).inc()
            log.error("%s[%d] offset %d is undeliverable: neither the queue nor the DLQ %s accepts it (%s); closed "
                      "with outcome 4, it will not be redelivered. Read it from the queue log at that offset if it "
                      "still matters", queue.name, partition, s.offset, queue.dlq_topic, text)
        else:
            retry.append(s)

    def _send_copy(self, queue: QueueConfig, partition: int, rec, count: int):
        headers = producible_headers([(k, v) for k, v in rec.headers or () if k not in _REPLACED and k != HEADER_ORIGIN])
        headers.append((HEADER_DELIVERY_COUNT, str(count + 1).encode()))
        headers.append((HEADER_ORIGIN, origin_of(rec.headers, queue.name, partition, rec.offset).encode()))
        return self._producer.send(queue.name, value=rec.value, key=rec.key, headers=headers, partition=partition)

    def _send_dlq(self, queue: QueueConfig, partition: int, rec, count: int, reason: str, error: str, now_ms: int):
        dlq_p = partition % self._dlq_partition_count(queue.dlq_topic)
        headers = producible_headers([(k, v) for k, v in rec.headers or () if k not in _REPLACED and k != HEADER_ORIGIN])
        headers.append((HEADER_DELIVERY_COUNT, str(count).encode()))
        headers.append((HEADER_ORIGIN, origin_of(rec.headers, queue.name, partition, rec.offset).encode()))
        headers.append((HEADER_DLQ_REASON, reason.encode()))
        if error:
            headers.append((HEADER_DLQ_ERROR, error.encode("utf-8", "replace")))
        headers.append((HEADER_DLQ_TS, str(now_ms).encode()))
        value = rec.value
        if rec.key is None and value is None:
            value = b""  # a tombstone: kafka-python cannot produce one (see kmq.core.copies)
        return self._producer.send(queue.dlq_topic, value=value, key=rec.key, headers=headers, partition=dlq_p)

    def _dlq_partition_count(self, topic: str) -> int:
        n = self._dlq_partitions.get(topic)
        if n is not None:
            return n
        down = self._dlq_down.get(topic)
        if down is not None and time.monotonic() < down[0]:
            raise DeadLetterTopicUnavailable(down[1])
        n = self._reader.partition_count(topic)
        if not n:
            why = (f"DLQ topic {topic!r} does not exist or this tracker may not see it: dead letters wait (offsets "
                   f"stay open) until `kmq topics create` makes it or an ACL grants Describe and Write")
            self._dlq_unavailable(topic, why)
            raise DeadLetterTopicUnavailable(why)
        self._dlq_down.pop(topic, None)
        self._dlq_partitions[topic] = n
        return n

    def _dlq_unavailable(self, topic: str, why: str) -> None:
        first = topic not in self._dlq_down
        self._dlq_down[topic] = (time.monotonic() + _DLQ_RECHECK_S, why)
        self._dlq_partitions.pop(topic, None)
        if first:
            log.error("%s", why)

    def _write_closed(self, queue: QueueConfig, partition: int, ranges: list[OffsetRange], outcome: Outcome) -> None:
        futures = []
        for group in _closed_groups(ranges, self._max_ranges):
            value = encode(Closed(tuple(group), outcome))
            futures.append(self._producer.send(queue.markers_topic, value=value, key=encode_key(partition),
                                               partition=partition))
        self._producer.flush(timeout=self._send_timeout_s)
        for f in futures:
            f.get(timeout=0)


def _closed_groups(ranges: list[OffsetRange], max_ranges: int = _MAX_RANGES) -> list[list[OffsetRange]]:
    """Ranges of CLOSED markers that fit the wire format: counts within u32 (coalesced STARTs can be
    longer), at most u16 ranges a marker, and no two adjacent pieces in one marker (they would merge)."""
    groups: list[list[OffsetRange]] = [[]]
    for r in ranges:
        first, left = r.first, r.count
        while left:
            n = min(left, MAX_U32)
            cur = groups[-1]
            if len(cur) >= max_ranges or (cur and cur[-1].end == first):
                cur = []
                groups.append(cur)
            cur.append(OffsetRange(first, n))
            first, left = first + n, left - n
    return [g for g in groups if g]


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
