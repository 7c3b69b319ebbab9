"""How a redelivery run is counted and logged: :class:`RedeliveryReport`, the metrics and the log lines.

:class:`tracker.redeliver.Redeliverer` carries out the actions of
:class:`~kmq.core.redelivery_run.RedeliveryRun`; what the run reports
(settled sends, deferred, unread, held back, retried offsets) is counted and
logged here. The lines keep the redeliverer's logger name, ``tracker.redeliver``
(``logging.debug`` names it for the one line per copy).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from kmq.config import QueueConfig
from kmq.core.copies import REASON_UNDELIVERABLE, Step, copy_count, record_size
from kmq.core.log_fields import log_fields
from kmq.core.ranges import OffsetRange
from kmq.core.redelivery_plan import Send, SendResult, Settled
from kmq.core.redelivery_run import Deferred, HeldPastEnd, RetriedAll, SendsRetried, Unread
from kmq.telemetry.metrics import TrackerMetrics, observe_many

__all__ = ["RedeliveryReport", "account", "missing", "notice"]

log = logging.getLogger("tracker.redeliver")

_COPY = Step.COPY  # an enum member looked up through its class costs a few hundred ns each time
_REFERENCE = Step.REFERENCE


@dataclass
class RedeliveryReport:
    """What one call of :meth:`Redeliverer.process` did (offset counts)."""

    redelivered: int = 0
    dead_lettered: int = 0
    missing: int = 0
    past_end: int = 0  # held back: at or past the end of the queue log as read (not yet)
    undeliverable: int = 0
    deferred: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    causes: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def copies(self) -> int:
        """Records produced (copies and dead letters with their payload)."""
        return self.redelivered + self.dead_lettered


def missing(metrics: TrackerMetrics, queue: QueueConfig, partition: int, gone: list[OffsetRange],
            report: RedeliveryReport) -> None:
    """Count and log offsets closed as missing (their CLOSED markers acknowledged)."""
    n = sum(r.count for r in gone)
    report.missing += n
    metrics.missing_offsets.labels(queue.label).inc(n)
    log.warning("%d offset(s) of %s[%d] are not in the queue log (deleted by retention, or never written) "
                "and were closed as missing: %s", n, queue.name, partition, _show(gone))


def notice(metrics: TrackerMetrics, queue: QueueConfig, partition: int, action: Any, report: RedeliveryReport,
           now_ms: int) -> None:
    """Count and log a notice of the run (``now_ms``: the time now)."""
    kind, m = type(action), metrics
    if kind is Deferred:
        report.deferred += action.count
    elif kind is Unread:
        n = sum(r.count for r in action.ranges)
        report.failed += n
        log.warning("%d offset(s) of %s[%d] were neither read nor reported missing by the log reader; "
                    "they stay open and are retried", n, queue.name, partition)
    elif kind is HeldPastEnd:
        # A consumer fetched them, so they exist: the read is behind (a new leader's high-water mark
        # lagging after a leader change), not proof of anything.
        held, at, now = action.held, action.at_ms, action.now_ms
        n = sum(r.count for r in held)
        report.past_end += n
        m.past_log_end.labels(queue.label).inc(n)
        log.warning("%s[%d]: the queue log read ended at offset %d, below %d due offset(s) that START markers "
                    "name (%s); they are not closed: read again in %.1fs (kmq_tracker_offsets_past_log_end_total). "
                    "If this goes on, see docs/operations.md (KmqQueueLogBehindStarts)", queue.name, partition,
                    action.log_end, n, _show(held), (at - now) / 1000.0)
    elif kind is SendsRetried:
        report.failed += action.count
        m.redelivery_failures.labels(queue.label).inc(action.count)
        log.warning("%d redelivery send(s) for %s[%d] failed (first: %s); they stay open and are retried in "
                    "%.1fs", action.count, queue.name, partition, action.first,
                    max(0.0, (action.at_ms - now_ms) / 1000.0))
    elif kind is RetriedAll:
        exc, n = action.error, sum(r.count for r in action.ranges)
        report.failed += n
        m.redelivery_failures.labels(queue.label).inc(n)
        log.warning("redelivery of %d message(s) from %s[%d] failed (%s: %s); they stay open and are retried in "
                    "%.1fs", n, queue.name, partition, type(exc).__name__, exc, (action.at_ms - action.now_ms) / 1000.0)


def account(metrics: TrackerMetrics, queue: QueueConfig, partition: int, records: Mapping[int, Any], sends: list[Send],
            results: Sequence[SendResult], settled: Settled, now: int, report: RedeliveryReport) -> None:
    """Metrics, report and log lines for one round of sends (counters added to once per label set)."""
    m = metrics
    produced: dict[tuple[Step, str], int] = defaultdict(int)
    delays: dict[int, int] = defaultdict(int)  # due time -> sends produced (one observe per due time)
    debug = log.isEnabledFor(logging.DEBUG)
    copy, reference = _COPY, _REFERENCE
    for s, res in zip(sends, results):
        if res.cause is not None:
            m.record_failures.labels(queue.label, res.cause).inc()
            report.causes[res.cause] += 1
            if res.permanent and s.step is Step.DEAD_LETTER:  # the payload is in neither topic
                m.undeliverable.labels(queue.label, res.cause).inc()
            continue
        delays[s.due_ms] += 1
        step = s.step
        if step is not reference:
            produced[(step, s.reason)] += 1
            if step is copy:
                if debug:  # one line per copy: its fields only when shown
                    log.debug("%s[%d] offset %d redelivered (%s, delivery %d)", queue.name, partition, s.offset,
                              s.reason, copy_count(s.count, s.reason),
                              extra=log_fields(queue.name, partition, s.offset, headers=records[s.offset].headers,
                                               outcome="redeliver", reason=s.reason))
                continue
            fields = log_fields(queue.name, partition, s.offset, headers=records[s.offset].headers,
                                outcome="dead_letter", reason=s.reason)
            if s.reason == REASON_UNDELIVERABLE:
                log.warning("%s offset %d dead-lettered as undeliverable: %s", queue.name, s.offset, s.error,
                            extra=fields)
            else:
                log.info("%s[%d] offset %d dead-lettered to %s (%s after %d deliveries)", queue.name,
                         partition, s.offset, queue.dlq_topic, s.reason, s.count, extra=fields)
        else:
            report.reasons[s.reason] += 1
            report.undeliverable += 1
            rec = records[s.offset]
            log.error("%s[%d] offset %d (%d bytes) is undeliverable: neither the queue nor the DLQ %s accepts "
                      "it (%s). Closed with outcome 4; a reference dead letter without the payload names it "
                      "(kmq-dlq-reference %s/%d/%d): redrive it from the queue log before retention deletes "
                      "it, and raise tracker.max_request_size and the topics' max.message.bytes if such "
                      "records are legitimate", queue.name, partition, s.offset,
                      record_size(rec.key, rec.value, rec.headers), queue.dlq_topic, s.error, queue.name,
                      partition, s.offset, extra=log_fields(queue.name, partition, s.offset, headers=rec.headers,
                                                            outcome="undeliverable"))
    for due_ms, n in delays.items():
        observe_many(m.redelivery_delay_seconds, max(0.0, (now - due_ms) / 1000.0), n)
    for (step, reason), n in produced.items():
        report.reasons[reason] += n
        if step is Step.COPY:
            m.redelivered.labels(queue.label, reason).inc(n)
            report.redelivered += n
        else:
            m.dead_lettered.labels(queue.label, reason).inc(n)
            report.dead_lettered += n
    for s in settled.unreferenced:
        report.undeliverable += 1
        log.error("%s[%d] offset %d is undeliverable and the DLQ %s refused even a reference to it (%s); closed "
                  "with outcome 4. Read it from the queue log at that offset if it still matters",
                  queue.name, partition, s.offset, queue.dlq_topic, s.error)


def _show(ranges: list[OffsetRange], limit: int = 5) -> str:
    parts = [f"{r.first}" if r.count == 1 else f"{r.first}-{r.last}" for r in ranges[:limit]]
    return ", ".join(parts) + (" ..." if len(ranges) > limit else "")
