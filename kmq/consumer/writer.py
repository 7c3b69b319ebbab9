"""Marker writing: START before the commit, buffered END/NACK/REJECT/RENEW.

:class:`MarkerWriter` is the KMQ consumer protocol (docs/protocol.md) as
helpers around a consumer the user already has: kafka-python's
``KafkaConsumer`` or confluent-kafka's ``Consumer`` (both through the client
seam, :mod:`kmq.client`)::

    writer = kmq.MarkerWriter(cfg, queue="orders", consumer=consumer)

    @kmq.marked(writer)                 # ack on return, nack on exception
    def handle(record): ...

    for tp, records in consumer.poll(timeout_ms=500).items():
        writer.start(records)           # START acknowledged by Kafka, then commit
        for r in records:
            handle(r)

:class:`~kmq.consumer.consumer.KmqConsumer` uses the same writer internally.
Settlements are buffered in an :class:`~kmq.consumer.ack_buffer.AckBuffer` and flushed
as coalesced ranges (one record per partition per type) every
``consumer.ack_flush_interval`` by a background thread, and on
:meth:`MarkerWriter.flush` / :meth:`MarkerWriter.close`. Getting them to Kafka
through broker outages (retries within ``consumer.marker_retry_budget``, a
stuck producer replaced) is :class:`~kmq.consumer.marker_sender.MarkerSender`'s job.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import socket
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Mapping, TypeVar

from kmq.core import settlement
from kmq.client import ClientCommitFailed, ConsumerAdapter, adapt_consumer, coordinates, headers_of, produce_errors
from kmq.consumer.ack_buffer import AckBuffer
from kmq.consumer.ack_waiters import AckWaiters
from kmq.config import Config, QueueConfig
from kmq.core.errors import BrokerUnavailable, KmqError, MarkerWriteError, MessageAlreadySettled, UnsupportedConsumer
from kmq.consumer.marker_sender import MarkerSender
from kmq.core.markers import Renew, Start, clip_owner, encode
from kmq.core.message import ACK, delivery_count_of, for_group
from kmq.core.outcome import HandlerOutcome, OutcomeRule, RejectOn, settle
from kmq.telemetry.metrics import ConsumerMetrics
from kmq.telemetry.tracing import current, delivery_tracing
from kmq.core.ranges import coalesce
from kmq.client.parts import KAFKA_CLIENTS, ClientFactory

__all__ = ["MarkerWriter", "marked", "CommitError", "default_owner"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class CommitError(KmqError):
    """The queue offsets could not be committed after START (e.g. a rebalance);
    the batch must not be processed by this consumer: the group delivers it again."""

    retriable = True


def default_owner(client_id: str) -> str:
    """Owner id written in START markers: ``client_id@host:pid``, cut to the marker's 255 utf-8 bytes."""
    return clip_owner(f"{client_id}@{socket.gethostname()}:{os.getpid()}")


def _ms(seconds: float) -> int:
    return max(0, int(round(seconds * 1000)))


def _pick_queue(cfg: Config, queue: str | None, group: str | None = None) -> QueueConfig:
    if queue is not None:
        return cfg.queue(queue, group)
    if len(cfg.queues) == 1 and group is None:
        return cfg.queues[0]
    if len({q.name for q in cfg.queues}) == 1:
        return cfg.queue(cfg.queues[0].name, group)
    raise ValueError(f"pass queue=...: the configuration has {len(cfg.queues)} queues")


def _check_consumer(consumer: Any) -> ConsumerAdapter | None:
    """The consumer's adapter; an asyncio or unknown consumer raises UnsupportedConsumer."""
    if consumer is None:
        return None
    if inspect.iscoroutinefunction(getattr(consumer, "commit", None)):
        raise UnsupportedConsumer(
            f"{type(consumer).__module__}.{type(consumer).__name__} is an asyncio consumer (its commit() is a "
            "coroutine); MarkerWriter drives a blocking kafka.KafkaConsumer and would never await the commit. "
            "Use kafka-python's KafkaConsumer or confluent-kafka's Consumer with MarkerWriter, or kmq.KmqConsumer; "
            "from asyncio code use kmq.aio.AsyncKmqConsumer (async for msg in consumer: ... await msg.ack())"
        )
    return adapt_consumer(consumer)


def _flatten(records: Any) -> list[Any]:
    """The records of a ``poll()`` result of either client: kafka-python's
    ``{TopicPartition: [records]}``, a list (kafka-python records, confluent
    ``consume()``), one confluent ``Message`` or None (``poll()``). Confluent
    error events (no record) are dropped with a log line."""
    if records is None:
        return []
    if isinstance(records, Mapping):
        return [r for rs in records.values() for r in rs]
    if callable(getattr(records, "error", None)):  # one confluent_kafka.Message
        records = [records]
    flat = []
    for r in records:
        err = r.error() if callable(getattr(r, "error", None)) else None
        if err is not None:
            log.warning("consumer error event, not a record: %s", err)
            continue
        flat.append(r)
    return flat


class MarkerWriter:
    """Writes a queue's markers; wraps an existing consumer (optional): kafka-python's
    ``KafkaConsumer`` or confluent-kafka's ``Consumer``.

    :param cfg: the kmq configuration.
    :param queue: queue name (default: the only configured queue).
    :param group: the queue's consumer group (``queues[].group``; ``default`` for the default group),
        needed only when the queue is configured for several.
    :param consumer: the user's consumer, used by :meth:`start` to commit (a blocking
        ``kafka.KafkaConsumer`` or ``confluent_kafka.Consumer``; an asyncio one such as aiokafka's raises
        :class:`~kmq.core.errors.UnsupportedConsumer`).
    :param metrics: :class:`~kmq.telemetry.metrics.ConsumerMetrics` (default: the process's shared consumer
        metrics in prometheus_client's default registry, :meth:`ConsumerMetrics.shared`).
    :param owner: owner id in START markers (default ``client_id@host:pid``).
    :param check_topics: refuse to start when the markers topic is missing or misaligned.
    :param clients: builds the marker producer and checks the topics
        (:class:`~kmq.client.parts.ClientFactory`; default: the configured cluster's clients).
    """

    def __init__(
        self,
        cfg: Config,
        queue: str | None = None,
        consumer: Any = None,
        *,
        metrics: ConsumerMetrics | None = None,
        owner: str | None = None,
        check_topics: bool = True,
        flush_interval: float | None = None,
        clients: ClientFactory = KAFKA_CLIENTS,
        group: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.queue: QueueConfig = _pick_queue(cfg, queue, group)
        self._adapter = _check_consumer(consumer)  # before any side effect (topic check, producer, thread)
        self.consumer = consumer
        self.metrics = metrics or ConsumerMetrics.shared()  # the application's default registry
        self.owner = owner or default_owner(cfg.kafka.client_id)
        self.flush_interval = cfg.consumer.ack_flush_interval if flush_interval is None else flush_interval
        self.lease_ms = _ms(self.queue.lease)
        self.start_timeout = cfg.kafka.connect_timeout + 5.0
        if check_topics:
            clients.require_aligned(cfg.kafka, self.queue)
        #: Futures of ``ack_with_response`` until their END is acknowledged (resolved per marker).
        self.waiters = AckWaiters()
        self._sender = MarkerSender(cfg, self.queue, retry_interval=max(1.0, self.flush_interval), metrics=self.metrics,
                                    waiters=self.waiters, clients=clients)
        self.retry_budget = self._sender.retry_budget
        #: Guards the buffer and every settle decision (shared with KmqMessage).
        self.lock = threading.Lock()
        self.buffer = AckBuffer()
        self._open: dict[int, set[int]] = defaultdict(set)  # for start()/ack() on raw records
        self._closed = False
        self._flush_lock = threading.Lock()
        #: Marker records sent by this writer (START included), for overhead figures.
        self.markers_sent = 0
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="kmq-marker-flusher", daemon=True)
        self._flusher.start()
        self._c_received = self.metrics.messages.labels(self.queue.name, "received")

    def count_received(self, n: int) -> None:
        """``n`` more messages of this queue were handed to the application
        (``kmq_consumer_messages_total{outcome="received"}``)."""
        self._c_received.inc(n)

    # ------------------------------------------------------------ START
    @property
    def owner(self) -> str:
        """Owner id written in START markers (:class:`~kmq.consumer.consumer.KmqConsumer` sets its group
        member id); set to any text, kept cut at a character boundary to the marker's 255 utf-8 bytes."""
        return self._owner

    @owner.setter
    def owner(self, value: str) -> None:
        self._owner = clip_owner(value)

    def send_starts(self, offsets: Mapping[int, Iterable[int]]) -> list[tuple[int, list[Any], Any]]:
        """Send one START per partition covering ``offsets``; returns
        ``[(partition, ranges, future)]`` for :meth:`wait_starts` (no wait here)."""
        futures = []
        try:
            for p, offs in offsets.items():
                ranges = coalesce(offs)
                if not ranges:
                    continue
                value = encode(Start(tuple(ranges), self.lease_ms, self.owner))
                futures.append((p, ranges, self._sender.send_awaited(p, value)))
        except (*produce_errors(), BrokerUnavailable) as exc:  # type: ignore[misc]  # mypy reads no starred tuple here
            raise self._start_error(futures or [(p, coalesce(o), None) for p, o in offsets.items()], exc) from exc
        finally:
            self.markers_sent += len(futures)
        return futures

    def _start_error(self, futures: list[Any], exc: BaseException) -> MarkerWriteError:
        what = ", ".join(f"{self.queue.name}[{p}] {r[0].first}..{r[-1].last}" for p, r, _ in futures if r) or self.queue.name
        return MarkerWriteError(
            f"START marker for {what} was not acknowledged by Kafka at {self.cfg.kafka.bootstrap_servers} "
            f"({type(exc).__name__}: {exc}); the batch was not handed to user code and its offsets were "
            f"not committed, so the consumer group will deliver it again"
        )

    def wait_starts(self, futures: list[tuple[int, list[Any], Any]], timeout: float | None = None) -> None:
        """Wait until Kafka acknowledged every START in ``futures``; :class:`MarkerWriteError` if not."""
        try:
            for _, _, fut in futures:
                fut.get(timeout=self.start_timeout if timeout is None else timeout)
        except produce_errors() as exc:
            raise self._start_error(futures, exc) from exc

    def write_starts(self, offsets: Mapping[int, Iterable[int]]) -> int:
        """Write one START per partition covering ``offsets`` and wait until Kafka
        acknowledged every one of them. Returns the number of marker records.

        Raises :class:`MarkerWriteError` (nothing may be committed then)."""
        t0 = time.perf_counter()
        futures = self.send_starts(offsets)
        self.wait_starts(futures)
        self.metrics.marker_write_seconds.observe(time.perf_counter() - t0)
        return len(futures)

    def hand_off(self, offsets: Mapping[int, Iterable[int]], timeout: float) -> set[int]:
        """Before messages are given back to the group: one RENEW per partition for ``offsets``
        with the hand-off lease (``consumer.handoff_lease``, at least the queue's lease), so their
        START does not time out while the group moves the partition to its next owner, whose START
        supersedes it. Buffered settlements go first (a lease-keeping RENEW sent after it would
        shorten it again). Returns within ``timeout`` seconds (a rebalance callback may run on the
        client's I/O thread, and a send can block while the producer has no metadata): the
        partitions whose RENEW Kafka acknowledged by then. Never raises for a Kafka error: the
        hand-off is best effort (without it a reassignment slower than the lease costs copies,
        not messages)."""
        ms = _ms(max(self.cfg.consumer.handoff_lease, self.queue.lease))
        done: set[int] = set()
        deadline = time.monotonic() + timeout

        def send_and_wait() -> None:
            self.flush_buffer()
            futures = []
            try:
                for p, offs in offsets.items():
                    ranges = coalesce(offs)
                    if ranges:
                        futures.append((p, self._sender.send_awaited(p, encode(Renew(tuple(ranges), ms)))))
            except (*produce_errors(), BrokerUnavailable) as exc:  # type: ignore[misc]  # mypy reads no starred tuple here
                log.warning("%s: hand-off RENEW not sent (%s)", self.queue.name, exc)
            self.markers_sent += len(futures)
            for p, fut in futures:
                try:
                    fut.get(timeout=max(0.0, deadline - time.monotonic()))
                    done.add(p)
                except produce_errors() as exc:
                    log.warning("%s[%d]: hand-off RENEW not acknowledged within %.1fs (%s); if the next owner "
                                "takes longer than the lease, its messages are also redelivered as copies",
                                self.queue.name, p, timeout, exc)

        sender = threading.Thread(target=send_and_wait, name=f"kmq-handoff-{self.queue.name}", daemon=True)
        sender.start()
        sender.join(timeout)
        if sender.is_alive():
            log.warning("%s: hand-off RENEW still being sent after %.1fs (the producer is blocked); giving the "
                        "messages back without waiting for it", self.queue.name, timeout)
        return set(done)

    def commit(self, consumer: Any, next_offsets: Mapping[int, int]) -> None:
        """Commit ``partition -> next offset`` of the queue topic synchronously (either client's consumer)."""
        adapter = adapt_consumer(consumer)
        try:
            adapter.commit({(self.queue.name, p): off for p, off in next_offsets.items()})
        except ClientCommitFailed as exc:
            if exc.rebalanced:
                raise CommitError(
                    f"committing {self.queue.name} offsets {dict(next_offsets)} failed ({exc}); the group rebalanced, "
                    "so this batch is not processed here and the group delivers it again"
                ) from exc
            raise CommitError(f"committing {self.queue.name} offsets failed: {exc}") from exc

    def start(self, records: Any, consumer: Any = None) -> list[Any]:
        """START + synchronous commit for ``records`` of the queue topic: a
        ``poll()`` result of kafka-python (``{TopicPartition: [records]}``) or of
        confluent-kafka (a ``Message`` or None), or a list of records (``consume()``).

        Returns the records (flat list, confluent error events dropped) once START
        was acknowledged by Kafka and the offsets were committed; only then process them.
        Copies made for another consumer group of the queue (``kmq-group``) are left out of
        what is returned and of the STARTs, and committed past (a :func:`marked` handler
        skips them too, so a loop over the polled records stays right)."""
        if consumer is None:
            adapter = self._adapter
        else:
            adapter = _check_consumer(consumer)
        if adapter is None:
            raise ValueError("MarkerWriter.start needs the consumer (pass consumer= here or to MarkerWriter)")
        flat = _flatten(records)
        by_part: dict[int, list[int]] = defaultdict(list)
        polled: dict[int, list[int]] = defaultdict(list)  # with the skipped copies: what the commit passes
        mine = []
        group = self.queue.group
        for r in flat:
            topic, partition, offset = coordinates(r)
            if topic != self.queue.name:
                raise ValueError(f"record of topic {topic!r} given to the writer of queue {self.queue.name!r}")
            polled[partition].append(offset)
            if for_group(headers_of(r), group, topic, partition, offset):
                by_part[partition].append(offset)
                mine.append(r)
        if not polled:
            return flat
        if len(mine) < len(flat):
            self.metrics.copies_skipped.labels(self.queue.label).inc(len(flat) - len(mine))
            flat = mine
        try:
            if by_part:
                self.write_starts(by_part)
            self.commit(adapter, {p: max(offs) + 1 for p, offs in polled.items()})
        except (MarkerWriteError, CommitError):
            # poll() already moved the position past the batch: without this, a caller that
            # catches the (retriable) error and polls on would commit past records that
            # have no START -- lost. Back at the batch, the next poll returns it again.
            self._rewind(adapter, polled)
            raise
        with self.lock:
            for p, offs in by_part.items():
                self._open[p].update(offs)
        self._c_received.inc(len(flat))
        return flat

    def _rewind(self, consumer: ConsumerAdapter, by_part: Mapping[int, list[int]]) -> None:
        """Seek ``consumer`` back to the first offset of the batch on each partition it still owns."""
        try:
            owned = consumer.assignment()
        except Exception:  # pragma: no cover - assignment() is local state
            owned = set()
        for p, offs in by_part.items():
            if (self.queue.name, p) not in owned:
                continue  # revoked: the group hands it to the new owner from the committed offset
            try:
                consumer.seek(self.queue.name, p, min(offs))
            except Exception as exc:  # not ours any more, or the client is closing
                log.warning("could not seek %s[%d] back to %d (%s); the group delivers the batch again "
                            "after the next rebalance", self.queue.name, p, min(offs), exc)
        log.info("%s: consumer positioned back at the failed batch %s; poll again to retry it",
                 self.queue.name, {p: min(o) for p, o in by_part.items()})

    # ------------------------------------------------------------ settling raw records
    def _take(self, record: Any, what: str) -> tuple[int, int]:
        _topic, p, off = coordinates(record)
        opened = self._open.get(p)
        if not opened or off not in opened:
            raise MessageAlreadySettled(
                f"{self.queue.name}/{p}/{off} is not in flight here (already settled, or not started with "
                f"writer.start); {what} ignored, no marker written"
            )
        return p, off

    def ack(self, record: Any) -> None:
        """Buffer an END for ``record`` (written with the next flush)."""
        with self.lock:
            p, off = self._take(record, "ack")
            self._open[p].discard(off)
            self.buffer.ack(p, off)

    def ack_with_response(self, record: Any) -> "Future[None]":
        """:meth:`ack`, and a future resolved when Kafka acknowledged the END covering ``record``
        (see :meth:`kmq.KmqMessage.ack_with_response`)."""
        fut: Future[None] = Future()
        with self.lock:
            p, off = self._take(record, "ack")
            self._open[p].discard(off)
            self.buffer.settle(p, off, ACK, fut)
        return fut

    def nack(self, record: Any, delay: float = 0.0) -> None:
        """Buffer a NACK: the tracker redelivers ``record`` after ``delay`` seconds.
        :class:`~kmq.core.errors.InvalidSettlement` (nothing recorded) for a delay the wire cannot carry."""
        ms = settlement.delay_ms(delay)
        with self.lock:
            p, off = self._take(record, "nack")
            self._open[p].discard(off)
            self.buffer.nack(p, off, ms)

    def reject(self, record: Any, reason: str = "") -> None:
        """Buffer a REJECT: the tracker dead-letters ``record`` with ``reason``.
        :class:`~kmq.core.errors.InvalidSettlement` (nothing recorded) for a reason over 65,535 utf-8 bytes."""
        text = settlement.reject_reason(reason)
        with self.lock:
            p, off = self._take(record, "reject")
            self._open[p].discard(off)
            self.buffer.reject(p, off, text)

    def renew(self, record: Any, lease: float | None = None) -> None:
        """Buffer a RENEW: new deadline = now + ``lease`` (default: the queue's lease).
        :class:`~kmq.core.errors.InvalidSettlement` (nothing recorded) for a lease the wire cannot carry."""
        ms = self.lease_ms if lease is None else settlement.lease_ms(lease)
        with self.lock:
            p, off = self._take(record, "renew")
            self.buffer.renew(p, off, ms)

    # ------------------------------------------------------------ flushing
    def flush_buffer(self) -> int:
        """Send everything buffered as coalesced markers (no wait). Returns records sent."""
        with self._flush_lock:
            with self.lock:
                drained = self.buffer.drain()
            if not drained:
                return 0
            if drained.waiting:  # before the sends: an answer may come back at once
                self.waiters.add(drained.waiting)
            for p, marker in drained.markers:
                self._sender.send(p, marker)
            self.markers_sent += len(drained.markers)
            for outcome, n in drained.counts.items():
                self.metrics.messages.labels(self.queue.name, outcome).inc(n)
            return len(drained.markers)

    def flush(self, timeout: float | None = None) -> None:
        """Send the buffered markers (and those waiting for a retry) and wait until Kafka
        acknowledged them, at most ``timeout`` seconds (default ``kafka.connect_timeout`` + 5s).

        Raises :class:`~kmq.core.errors.MarkerWriteError` (retriable) naming what is not written
        yet; those markers stay queued and are retried within ``consumer.marker_retry_budget``."""
        wait = self.start_timeout if timeout is None else timeout
        self.flush_buffer()
        missing = self._sender.wait(wait)
        if missing:
            raise self._sender.describe_missing(missing, wait)

    def _flush_loop(self) -> None:
        interval = max(self.flush_interval, 0.001)
        while not self._stop.wait(interval):
            try:
                self._sender.check_stall()
                self.flush_buffer()
                self.markers_sent += self._sender.resend_due()
            except Exception:  # keep flushing; the cause is logged
                log.exception("flushing markers of %s failed; retrying in %ss", self.queue.name, interval)

    @property
    def failed_writes(self) -> int:
        """Markers (END/NACK/REJECT/RENEW) given up: not acknowledged by Kafka within the retry budget."""
        return self._sender.failed_writes

    @property
    def retrying(self) -> int:
        """Messages whose settlement marker failed and is not written yet (waiting or being resent)."""
        return self._sender.retrying

    @property
    def producer_replacements(self) -> int:
        """How often a stuck Kafka producer was replaced (see :mod:`kmq.consumer.marker_sender`)."""
        return self._sender.producer_replacements

    def close(self, timeout: float | None = None) -> None:
        """Flush the buffered markers and those waiting for a retry, wait for them (at most
        ``timeout`` seconds, default ``kafka.connect_timeout`` + 5s), stop the flusher and
        close the producer. What Kafka did not acknowledge by then is logged as one error
        line (the tracker redelivers those messages when their leases end); close never
        waits out the retry budget."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._flusher.is_alive() and threading.current_thread() is not self._flusher:
            self._flusher.join(5)
        wait = self.start_timeout if timeout is None else timeout
        try:
            self.flush_buffer()
        finally:
            self._sender.close(wait)
            self.waiters.fail_all("the writer closed before Kafka acknowledged it")

    # ---------------------------------------- recovery (docs/protocol.md, "Consumer flow control, rebalances and outages")
    def replace_producer(self, why: str) -> bool:
        """Swap the marker producer for a new one (see :meth:`MarkerSender.replace`):
        for a producer that stopped answering after a broker restart. Pending
        settlement markers are sent again; returns False if no new producer could
        connect yet."""
        return self._sender.replace(why)

    def __enter__(self) -> "MarkerWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RecordSettlement:
    """One raw record settled through its writer: what :func:`kmq.core.outcome.settle` needs."""

    __slots__ = ("writer", "record")

    def __init__(self, writer: MarkerWriter, record: Any) -> None:
        self.writer = writer
        self.record = record

    # Read only for log lines (a failed handler): not computed on the ack path.
    topic = property(lambda self: coordinates(self.record)[0])
    partition = property(lambda self: coordinates(self.record)[1])
    offset = property(lambda self: coordinates(self.record)[2])
    headers = property(lambda self: headers_of(self.record))

    def ack(self) -> None:
        self.writer.ack(self.record)

    def nack(self, delay: float = 0.0) -> None:
        self.writer.nack(self.record, delay)

    def reject(self, reason: str = "") -> None:
        self.writer.reject(self.record, reason)


def marked(writer: MarkerWriter, reject_on: RejectOn = ()) -> Callable[[F], F]:
    """Decorate a per-record handler: ack on return, nack on exception (delay from
    the queue's backoff by delivery count), reject on an exception of ``reject_on``
    (the rule of :class:`~kmq.core.outcome.OutcomeRule`, as ``KmqConsumer.run``).

    The exception is logged and not re-raised, so the poll loop goes on. A
    handler that settled the record itself is left alone. When the application
    installed an OpenTelemetry tracer provider (before decorating), each call is a
    ``process <queue>`` span, current while the handler runs (its own spans are
    children) and ended with the settlement the decorator makes."""

    rule = OutcomeRule(writer.queue.backoff.delay, reject_on)
    tracing = delivery_tracing(writer.cfg.workers_group(writer.queue))

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(record: Any, *args: Any, **kwargs: Any) -> Any:
            if not for_group(headers_of(record), writer.queue.group, *coordinates(record)):
                return None  # another consumer group's copy: writer.start did not START it
            span = None if tracing is None else tracing.start(*coordinates(record), headers_of(record))
            try:
                if span is None:
                    result = fn(record, *args, **kwargs)
                else:  # the handler's own spans are children of the delivery's
                    with current(span):
                        result = fn(record, *args, **kwargs)
            except Exception as exc:
                outcome: HandlerOutcome | None = rule.failed(exc, delivery_count_of(headers_of(record)))
                result = None
            except BaseException:  # not a handler failure: the record is left to its lease
                if span is not None:
                    tracing.end(span, "unsettled")  # type: ignore[union-attr]
                raise
            else:
                outcome = rule.returned(settled=False)  # settled: the writer says so
            try:
                settle(_RecordSettlement(writer, record), outcome)
            finally:
                if span is not None:
                    tracing.end(span, outcome.action)  # type: ignore[union-attr]
            return result

        return wrapper  # type: ignore[return-value]

    return deco
