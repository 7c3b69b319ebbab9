"""Redelivery: the I/O shell of :class:`~kmq.core.redelivery_run.RedeliveryRun`.

For the due items of one partition (handed out by
:meth:`kmq.core.lease_state.PartitionState.due`) the run decides, without
I/O, and this shell carries out its actions in order:

1. read the original records from the queue log, every offset verified
   (offsets deleted below the log start are closed as ``MISSING``; offsets at
   or past the end the read ran into are *not yet* there: held back with a
   capped backoff and read again, never closed);
2. :func:`~kmq.core.redelivery_plan.plan` decides per record: wait (backoff),
   copy to the same queue partition, or dead-letter to the DLQ (partition =
   original partition mod DLQ partitions);
3. produce the sends, wait once for the producer's verdict on each; then
   :func:`~kmq.core.redelivery_plan.settle` decides what follows: close, a
   fallback (a refused copy is dead-lettered, a refused dead letter becomes a
   reference dead letter without the payload), or a retry with a capped backoff;
4. once Kafka acknowledged the copies, write one CLOSED marker per outcome
   (coalesced ranges) and close the offsets in the state.

What the run reports is counted and logged by :mod:`tracker.redelivery_log`.

**A send is judged only once the producer has decided it.** The tracker's
producer gives up on a record after its delivery timeout
(:func:`delivery_timeout_s`), and the tracker waits a little longer than that
(:func:`send_wait_s`): so a send judged failed is no longer held by the
producer, which cannot deliver it after the tracker has retried it (a copy
more for every retry while the broker was slow). A producer that leaves a
send undecided past its own timeout is closed (what it holds fails) and
replaced before the retry. The one case left is inherent to Kafka: a request
the broker received but answered after the producer gave up may still be
appended; its copy then exists twice with the same ``kmq-origin``.

**A producer in a fatal state is replaced.** A confluent-kafka producer that
reported a fatal error (:func:`kmq.client.producer_fatal`: an idempotence
guarantee it can no longer keep) sends nothing more, so retrying on it would
fail for ever. It is closed and a new one made (logged, and counted in
``kmq_tracker_producer_replacements_total{reason="fatal"}``); the sends it did
not acknowledge are retried on the new one, and a CLOSED marker it did not
acknowledge is sent again on it at once. Nothing is closed for a copy the
old producer did not acknowledge: after a fatal error a record no delivery
report names counts as failed (a duplicate at worst, see
:mod:`kmq.client.confluent.fatal`).

One record never stops the service, never blocks the records behind it, and
what was already copied is closed, not copied again.

**The cyclic garbage collector waits during a large step.** A crash-sized
backlog makes several objects per copy (the original read, its send, the
copy's headers), almost none of them in a reference cycle and all freed by
reference counting; with the collector running, its collections of these
young objects and its full passes over everything they keep alive (a round
holds up to :data:`_ROUND_BYTES` of originals) took about a third of the
tracker's time. A step of at least :data:`_GC_PAUSE_OFFSETS` offsets pauses
automatic collection for its duration (process-wide: other threads of the
process allocate without it meanwhile) and restores it after, exception or
not; a process that disabled it itself keeps it disabled.
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from kmq import client as client_api
from kmq.client.parts import KAFKA_CLIENTS, ClientFactory
from kmq.config import Config, KafkaConfig, QueueConfig, TrackerConfig
from kmq.core.copies import (
    Step,
    copy_count,
    copy_headers,
    copy_headers_for,
    copy_request_size,
    dead_letter_headers,
    record_size,
    reference_headers,
    refused_with_its_batch,
    smallest_record_limit,
)
from kmq.core.errors import DeadLetterTopicUnavailable
from kmq.core.lease_state import DueItem, PartitionState, Reason
from kmq.core.markers import Closed, Outcome, encode, encode_key
from kmq.core.message import origin_of
from kmq.core.ranges import OffsetRange
from kmq.core.redelivery_plan import SENT, Send, SendResult, closed_chunks, closed_ranges_limit
from kmq.core.redelivery_run import (
    CloseMissing,
    RetriedAll,
    CLOCK,
    OK,
    Failed,
    Judge,
    Judged,
    Read,
    ReadResult,
    RedeliveryRun,
    SettledRound,
    Started,
    StartSends,
    WriteClosed,
)
from kmq.client import LogReader, LogReadError
from kmq.telemetry.metrics import TrackerMetrics
from kmq.telemetry.tracing import redelivery_tracing
from tracker import redelivery_log
from tracker.redelivery_log import RedeliveryReport

__all__ = ["Redeliverer", "RedeliveryReport", "copy_producer", "copy_request_size_for", "delivery_timeout_s",
           "send_wait_s", "failure_cause"]

log = logging.getLogger(__name__)

# A missing or forbidden DLQ topic is looked up again at most this often (no lookup storm, no blocking).
_DLQ_RECHECK_S = 10.0
# A reference dead letter keeps the record's key only up to this size (the key may be what is too large).
_REFERENCE_KEY_MAX = 1024
# The tracker waits this much longer for a send than its producer tries to deliver it.
_WAIT_MARGIN_S = 5.0
# Most offsets read at once: the next chunk is read while the sends of the one before are on their way.
_READ_CHUNK = 25_000
# About this many bytes of originals a read brings (chunks are sized by the records seen so far in
# the queue; before any, by the largest record the producer takes), and at most this many are held
# for sends not judged yet: past it, the sends started are judged (flush, settle, CLOSED) first.
_CHUNK_BYTES = 8 * 1024 * 1024
_ROUND_BYTES = 32 * 1024 * 1024
# A step of this many offsets or more runs with the cyclic garbage collector paused (module docstring).
_GC_PAUSE_OFFSETS = 5_000
_COPY = Step.COPY  # an enum member looked up through its class costs a few hundred ns each time
_RELEASE = Reason.RELEASE.value


@contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Automatic cyclic garbage collection off for the block when ``pause`` (and it is on)."""
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def delivery_timeout_s(kafka: KafkaConfig) -> float:
    """How long the tracker's producer tries to deliver one record (``delivery_timeout_ms``):
    two request timeouts (``kafka.connect_timeout``) plus a second, at least 30 s."""
    return max(30.0, 2 * kafka.connect_timeout + 1.0)


def send_wait_s(kafka: KafkaConfig) -> float:
    """How long the tracker waits for its producer's verdict on a send: past its delivery timeout."""
    return delivery_timeout_s(kafka) + _WAIT_MARGIN_S


def copy_producer(kafka: KafkaConfig, max_request_size: int, compression: str = "none",
                  clients: ClientFactory = KAFKA_CLIENTS) -> Any:
    """The producer of copies, dead letters and CLOSED markers on ``kafka.client``: idempotent,
    acks=all, records up to ``max_request_size`` bytes, giving up on a record within
    :func:`delivery_timeout_s` (below the tracker's wait, see the module docstring), compressing
    with ``compression`` (a ``queues[].compression`` value); built by ``clients``."""
    return clients.producer(kafka, settle_on_flush=True, max_request_size=max_request_size,
                            request_timeout=kafka.connect_timeout, delivery_timeout=delivery_timeout_s(kafka),
                            compression=compression)


def copy_request_size_for(cfg: Config, clients: ClientFactory = KAFKA_CLIENTS) -> tuple[int, int]:
    """The largest record the tracker's producer sends: what the queues' and DLQs' topics accept
    (``max.message.bytes``), never below ``tracker.max_request_size``; and the smallest of those
    limits (:func:`~kmq.core.copies.smallest_record_limit`). Where the broker does not say, the log
    names the setting that decides."""
    configured = cfg.tracker.max_request_size
    limits = clients.max_message_bytes(cfg.kafka, [t for q in cfg.queues for t in (q.name, q.dlq_topic)])
    size, unknown = copy_request_size(configured, limits)
    smallest = smallest_record_limit(configured, limits)
    if unknown:
        # Only an operator who has not sized it is warned: a set value is the answer already.
        level = logging.WARNING if configured == TrackerConfig().max_request_size else logging.INFO
        log.log(level, "the broker did not report max.message.bytes of %s, so the tracker copies records of up to "
                "tracker.max_request_size = %d bytes there. If these topics accept larger records, set "
                "tracker.max_request_size (KMQ_TRACKER__MAX_REQUEST_SIZE) to at least their max.message.bytes: "
                "a larger record is not redelivered, only named by a reference dead letter in the DLQ",
                ", ".join(unknown), configured)
    log.info("the tracker produces records of up to %d bytes", size)
    return size, smallest


def failure_cause(step: Step, exc: BaseException) -> str:
    """Short metric label for a failed send (``kmq_tracker_record_failures_total{cause}``)."""
    to_dlq = step is not Step.COPY
    kind = client_api.send_failure(exc).kind
    if isinstance(exc, DeadLetterTopicUnavailable) or (to_dlq and kind == "unknown_topic"):
        return "dlq_missing"
    if kind == "forbidden":
        return "dlq_forbidden" if to_dlq else "forbidden"
    return {"too_large": "too_large", "invalid": "invalid_record"}.get(kind, "send_failed")


def _result_of(step: Step, exc: BaseException) -> SendResult:
    permanent = client_api.send_failure(exc).permanent
    return SendResult(failure_cause(step, exc), permanent, f"{type(exc).__name__}: {exc}")


@dataclass
class _Started:
    """Sends started together (one chunk's, or a round's fallbacks), not judged yet."""

    sends: list[Send]
    records: Mapping[int, Any]  # the originals by offset, at least the sends' (a refused copy is dead-lettered from it)
    now_ms: int  # when they were started (the redelivery delay metric)
    batch: Any  # the producer's SendBatch of the records that left (None: none did)
    producer: Any  # the producer they were given to
    at: list[int]  # index in ``sends`` of each record of ``batch``
    refused: dict[int, SendResult]  # index in ``sends`` -> result, for records refused before they left


class Redeliverer:
    """Turns due items of one markers partition into copies, dead letters and CLOSED markers.

    A queue's records are written with its ``compression``, one producer per codec (a client
    compresses everything it produces with one codec): ``producer`` writes with ``compression``,
    and ``new_producer(codec)`` makes the producer of another codec on first use, and the
    replacement for a producer that left a send undecided past its delivery timeout. Without
    ``new_producer``, ``producer`` serves every queue and is kept."""

    def __init__(self, producer: Any, reader: LogReader, metrics: TrackerMetrics,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000), send_timeout_s: float = 35.0,
                 max_request_size: int = 1_048_576, new_producer: Callable[[str], Any] | None = None,
                 compression: str = "none", smallest_limit: int | None = None) -> None:
        self._producer = producer  # the producer of the queue being served (of codec ``_codec``)
        self._codec = compression
        self._producers = {compression: producer}
        self._new_producer = new_producer
        self._max_ranges = closed_ranges_limit(max_request_size)  # CLOSED markers must fit the producer too
        self._max_request_size = max_request_size
        # Below this a record refused as too large was refused with its batch (refused_with_its_batch).
        self._smallest_limit = max_request_size if smallest_limit is None else smallest_limit
        self._record_bytes: dict[str, float] = {}  # queue -> average size of the originals read last
        self._reader = reader
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._send_timeout_s = send_timeout_s
        self._dlq_partitions: dict[str, int] = {}
        self._dlq_down: dict[str, tuple[float, str]] = {}  # topic -> (recheck at, monotonic; why)
        #: A span per copy and dead letter when an OpenTelemetry tracer provider is installed, else None.
        self._tracing = redelivery_tracing()

    def close(self) -> None:
        for producer in self._producers.values():
            client_api.close_producer(producer)

    def process(self, queue: QueueConfig, partition: int, state: PartitionState, items: list[DueItem]) -> RedeliveryReport:
        """Handle ``items`` completely: every offset ends closed, deferred or scheduled for retry
        (the order and every decision: :class:`~kmq.core.redelivery_run.RedeliveryRun`)."""
        report = RedeliveryReport()
        if not items:
            return report
        self._use(queue.compression)
        run = RedeliveryRun(state, items, self._record_bytes.get(queue.name, self._max_request_size),
                            chunk_bytes=_CHUNK_BYTES, read_chunk=_READ_CHUNK, round_bytes=_ROUND_BYTES)
        try:
            with _collector_paused(sum(it.offset_count for it in items) >= _GC_PAUSE_OFFSETS):
                action = run.start()
                while action is not None:
                    action = run.send(self._carry_out(queue, partition, action, report))
        finally:
            self._record_bytes[queue.name] = run.record_bytes
            # Chunk after chunk of this partition was read on from one assignment. It is kept while
            # more of the partition is due now (a backlog larger than a step): the next step reads
            # on from it instead of from a fresh assignment (a broker round trip and a cold fetch,
            # a fifth of a 50,000-offset step). Otherwise librdkafka stops fetching ahead for it.
            upcoming = state.next_due_ms()
            if upcoming is None or upcoming > self._clock_ms():
                self._reader.release()
        return report

    # ------------------------------------------------------------ carrying out the run's actions
    def _carry_out(self, queue: QueueConfig, partition: int, action: Any, report: RedeliveryReport) -> Any:
        """Do ``action`` and return the run's event for it; a read or produce error is the run's
        :class:`~kmq.core.redelivery_run.Failed` (it decides what is retried)."""
        try:
            if action is CLOCK:
                return self._clock_ms()
            kind = type(action)
            if kind is Read:
                read = self._reader.read(queue.name, partition, action.ranges)
                size = sum([len(r.value or b"") + len(r.key or b"") for r in read.records.values()])
                return ReadResult(read.records, read.missing, read.log_end, size, self._clock_ms())
            if kind is StartSends:
                return Started(self._start_all(queue, partition, action.records, action.sends, action.now_ms))
            if kind is Judge:
                self._flush(f"{action.what} of {queue.name}[{partition}]")
                return Judged([self._judge(queue, started) for started in action.handles])
            if kind is SettledRound:
                redelivery_log.account(self._metrics, queue, partition, action.records, action.sends, action.results,
                                       action.settled, action.started_ms, report)
            elif kind is WriteClosed:
                self._write_outcome(queue, partition, action.ranges, action.outcome)
            elif kind is CloseMissing:
                self._write_closed(queue, partition, action.ranges, Outcome.MISSING)
                redelivery_log.missing(self._metrics, queue, partition, action.ranges, report)
            else:
                redelivery_log.notice(self._metrics, queue, partition, action, report, self._clock_ms())
                if kind is RetriedAll:
                    self._replace_unusable(action.error)
            return OK
        except (LogReadError, OSError, *client_api.produce_errors()) as exc:  # type: ignore[misc]  # mypy reads no starred tuple here
            return Failed(exc)

    def _write_outcome(self, queue: QueueConfig, partition: int, ranges: list[OffsetRange], outcome: Outcome) -> None:
        """The copies are acknowledged (and closed in the state): write CLOSED so a restarted tracker
        does not repeat them."""
        try:
            self._write_closed(queue, partition, ranges, outcome)
        except client_api.produce_errors() as exc:
            # Not lost: the copies exist. A restart before the next commit may redeliver once more.
            log.warning("CLOSED marker for %s[%d] not written (%s); a tracker restart may redeliver %d "
                        "message(s) once more", queue.name, partition, exc, sum(r.count for r in ranges))

    # ------------------------------------------------------------ producing
    def _start_all(self, queue: QueueConfig, partition: int, records: Mapping[int, Any], sends: list[Send],
                   now: int) -> "_Started":
        """Start every send without waiting (one batch to the producer); a record refused before it
        left is judged at once, the others after the next flush (:meth:`_judge`)."""
        out: list[client_api.OutRecord] = []
        at: list[int] = []  # index in ``sends`` of each record in ``out``
        refused: dict[int, SendResult] = {}
        # A backlog is copies, one per offset: their records are built inline here (names looked up
        # once, not per record; copy_count's rule inline, a call per offset costs 8% of a step); dead
        # letters, references and traced copies go through _out_record.
        fast = self._tracing is None
        name, group, copy, add, mark = queue.name, queue.group, _COPY, out.append, at.append
        out_record, new = client_api.OutRecord, tuple.__new__  # OutRecord(...) without its Python-level __new__
        for i, s in enumerate(sends):
            try:
                rec = records[s.offset]
                if fast and s.step is copy:
                    add(new(out_record, (name, partition, rec.key, rec.value,
                                         copy_headers_for(rec.headers, name, partition, rec.offset, s.count,
                                                          group, counted=s.reason != _RELEASE))))
                else:
                    add(self._out_record(queue, partition, rec, s, now))
                mark(i)
            except Exception as exc:  # noqa: BLE001 - refused before it left: this record only
                refused[i] = self._failed(queue, s.step, exc)
        batch = client_api.send_many(self._producer, out) if out else None
        # ``records`` as it is (a chunk's read, or a round's originals): sends are looked up in it
        return _Started(sends, records, now, batch, self._producer, at, refused)

    def _judge(self, queue: QueueConfig, started: "_Started") -> list[SendResult]:
        """Each send's result once the producer was flushed: acknowledged, failed, or undecided past
        the producer's delivery timeout (then the producer is replaced, failing what it holds); a
        producer that reported a fatal error, or whose id the broker refused, is replaced too."""
        results: list[SendResult | None] = [started.refused.get(i) for i in range(len(started.sends))]
        undecided = fenced = 0
        fatal = client_api.producer_fatal(started.producer)  # also when it refused sends before they left
        batch = started.batch
        for j, i in enumerate(started.at):
            verdict = batch.verdict(j)
            if verdict is None:
                results[i] = SENT
            elif verdict is client_api.UNDECIDED:
                undecided += 1
                results[i] = SendResult("send_failed", False, f"the producer did not decide within "
                                                              f"{self._send_timeout_s:g}s")
            else:  # any send failure: decided per record by settle()
                results[i] = (self._batch_refusal(started, i, verdict)
                              or self._failed(queue, started.sends[i].step, verdict))
                fenced += isinstance(verdict, client_api.producer_state_errors())
                if fatal is None and isinstance(verdict, client_api.ProducerFatal):
                    fatal = verdict
        if started.producer is not self._producer:
            return results  # type: ignore[return-value]  # replaced already, judging an earlier batch of the round
        if fatal is not None:
            self._replace_producer(f"it reported a fatal error ({fatal})", "fatal")
        elif undecided:
            # Closing it fails what it holds, so none of them can be delivered after its retry.
            self._replace_producer(f"it left {undecided} send(s) undecided past its delivery timeout", "undecided")
        elif fenced:
            self._replace_producer(f"the broker refused its producer id for {fenced} send(s)", "refused_id")
        return results  # type: ignore[return-value]

    def _batch_refusal(self, started: "_Started", i: int, verdict: BaseException) -> SendResult | None:
        """A retriable result for send ``i`` (a copy, dead letter or reference) refused as too large
        while it is under every topic's limit (:func:`~kmq.core.copies.refused_with_its_batch`): a broker refuses a
        whole batch for one record over the limit, and a client may pass that answer on to records
        sent beside it (seen: kafka-python after splitting such a batch). Judged "for good", a
        record that fits would be dead-lettered as a reference, or closed undeliverable with no
        copy anywhere. Else None: judged as any failure."""
        if client_api.send_failure(verdict).kind != "too_large":
            return None
        s = started.sends[i]
        rec = started.records.get(s.offset)
        if rec is None:
            return None
        # A reference carries no payload: its headers are far under any limit.
        size = 0 if s.step is Step.REFERENCE else record_size(rec.key, rec.value, rec.headers)
        if not refused_with_its_batch(size, self._smallest_limit):
            return None
        return SendResult("too_large", False, f"{type(verdict).__name__}: {verdict} (the record is under every "
                                              f"topic's limit: refused with its batch; sent again)")

    def _failed(self, queue: QueueConfig, step: Step, exc: BaseException) -> SendResult:
        if step is not Step.COPY and client_api.send_failure(exc).kind in ("unknown_topic", "forbidden"):
            self._dlq_unavailable(queue.dlq_topic, f"{type(exc).__name__}: {exc}")
        return _result_of(step, exc)

    def _out_record(self, queue: QueueConfig, partition: int, rec: Any, s: Send, now_ms: int) -> client_api.OutRecord:
        """The record to produce for ``s`` (the original record ``rec``): a copy, a dead letter or a reference."""
        origin = origin_of(rec.headers, queue.name, partition, rec.offset)
        if s.step is Step.COPY:
            count = copy_count(s.count, s.reason)  # the copy's own: written as it is
            headers = copy_headers(rec.headers, origin, count, queue.group,  # the origin is needed below too
                                   counted=False)
            if self._tracing is not None:
                headers = self._tracing.traced(headers, "redeliver", queue.name, partition, origin, count,
                                               rec.headers)
            return client_api.OutRecord(queue.name, partition, rec.key, rec.value, headers)
        dlq_p = partition % self._dlq_partition_count(queue.dlq_topic)
        if s.step is Step.DEAD_LETTER:
            headers = dead_letter_headers(rec.headers, origin, s.count, s.reason, s.error, now_ms)
            if self._tracing is not None:
                headers = self._tracing.traced(headers, "dead_letter", queue.dlq_topic, dlq_p, origin, s.count,
                                               rec.headers)
            value = b"" if rec.key is None and rec.value is None else rec.value  # kafka-python: no tombstone
            return client_api.OutRecord(queue.dlq_topic, dlq_p, rec.key, value, headers)
        headers = reference_headers(origin, f"{queue.name}/{partition}/{rec.offset}",
                                    record_size(rec.key, rec.value, rec.headers), s.count, s.reason, s.error, now_ms)
        key = rec.key if rec.key is not None and len(rec.key) <= _REFERENCE_KEY_MAX else None
        return client_api.OutRecord(queue.dlq_topic, dlq_p, key, b"", headers)

    def _flush(self, what: str) -> None:
        try:
            self._producer.flush(timeout=self._send_timeout_s)
        except client_api.produce_errors() as exc:
            # Unfinished sends are judged below, each on its own; finished ones still count.
            log.warning("flushing %s did not complete (%s)", what, exc)

    def _use(self, codec: str) -> None:
        """Send with the producer of ``codec`` from now on (made on its first use)."""
        if codec == self._codec or self._new_producer is None:
            return
        if codec not in self._producers:
            self._producers[codec] = self._new_producer(codec)
        self._producer, self._codec = self._producers[codec], codec

    def _replace_producer(self, why: str, reason: str) -> None:
        """Close the producer (what it still holds fails for good) and continue on a new one;
        ``reason``: the label of ``kmq_tracker_producer_replacements_total``."""
        if self._new_producer is None:
            log.warning("the tracker's producer is unusable (%s) and cannot be replaced here", why)
            return
        log.warning("replacing the tracker's producer: %s; what it did not acknowledge is sent again on the new "
                    "one (kmq_tracker_producer_replacements_total)", why)
        self._metrics.producer_replacements.labels(reason).inc()
        old, self._producer = self._producer, self._new_producer(self._codec)
        self._producers[self._codec] = self._producer
        client_api.close_producer(old)

    def _replace_unusable(self, exc: BaseException) -> None:
        """A step failed with ``exc``: replace the producer if it cannot send any more (fatal, or
        its producer id refused)."""
        fatal = client_api.producer_fatal(self._producer)
        if fatal is not None or isinstance(exc, client_api.ProducerFatal):
            self._replace_producer(f"it reported a fatal error ({fatal or exc})", "fatal")
        elif isinstance(exc, client_api.producer_state_errors()):
            self._replace_producer(f"its producer id was refused ({type(exc).__name__})", "refused_id")

    def _write_closed(self, queue: QueueConfig, partition: int, ranges: list[OffsetRange], outcome: Outcome) -> None:
        """Write the CLOSED markers of ``ranges`` and wait for Kafka's acknowledgement. A producer
        that turns out fatal meanwhile is replaced and they are sent once more on the new one (a
        CLOSED marker twice closes nothing twice)."""
        for attempt in (1, 2):
            producer = self._producer
            try:
                futures = [producer.send(queue.markers_topic, value=encode(Closed(tuple(group), outcome)),
                                         key=encode_key(partition), partition=partition)
                           for group in closed_chunks(ranges, self._max_ranges)]
            except client_api.ProducerFatal as exc:
                if attempt == 1 and self._new_producer is not None:
                    self._replace_producer(f"it reported a fatal error ({exc})", "fatal")
                    continue
                raise
            self._flush(f"CLOSED markers of {queue.name}[{partition}]")
            fatal = client_api.producer_fatal(producer)
            if fatal is not None and attempt == 1 and self._new_producer is not None:
                self._replace_producer(f"it reported a fatal error ({fatal})", "fatal")
                continue  # what it acknowledged is not known for sure: all of them again
            if not all(f.is_done for f in futures):
                self._replace_producer("it left a CLOSED marker undecided past its delivery timeout", "undecided")
                raise client_api.ProduceFailed(f"CLOSED marker for {queue.name}[{partition}] not acknowledged")
            for f in futures:
                f.get(timeout=0)
            return

    # ------------------------------------------------------------ DLQ topic
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

