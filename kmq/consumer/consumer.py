"""KmqConsumer: a queue consumer with individual acks (docs/protocol.md).

Threading: one
background *fetcher* thread owns the Kafka consumer (a
:class:`~kmq.client.GroupConsumerAdapter` on the client ``kafka.client``
names, kafka-python or confluent-kafka; neither is thread-safe) and runs
poll -> START (acknowledged by Kafka) -> commit -> hand-over, ahead of the
application. What to do at each step is decided by the pure
:class:`~kmq.consumer.fetch_pipeline.FetchPipeline`; the fetcher thread
runs :class:`~kmq.consumer.fetcher.Fetcher`, which only feeds it events (a
poll, an answered START or commit, a rebalance, the time) and carries out its
actions. The application takes ready messages
from :class:`~kmq.consumer.ready_queue.ReadyQueue`; acks and other settlements go into the writer's
:class:`~kmq.consumer.ack_buffer.AckBuffer` and are flushed as coalesced ranges by the
writer's flusher thread. So the next batch's poll, START and commit overlap
with user processing of the current one.

Flow control (:mod:`kmq.consumer.flow`), rebalances that cost no delivery, giving
never-handed messages back on close and riding through broker outages are
described in docs/protocol.md ("Consumer flow control, rebalances and
outages"); client-specific workarounds live in the adapters (kafka-python's in
:mod:`kmq.client.kafka_python.consumer` and :mod:`kmq.client.kafka_python.watchdog`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterator, Mapping

from kmq import client as client_api
from kmq.client.parts import KAFKA_CLIENTS, ClientFactory
from kmq.config import Config
from kmq.config.process import untuned_collector_hint
from kmq.consumer.fetch_batch import FetchBatch
from kmq.consumer.fetch_pipeline import FetchPipeline, HandOver
from kmq.consumer.close_ready import give_back_ready, put_back_ahead
from kmq.consumer.fetcher import Fetcher, FetcherParts
from kmq.consumer.flow import FlowControl, FlowLimits
from kmq.consumer.scheduled import hold_back_scheduled
from kmq.consumer.settler import ConsumerSettler
from kmq.consumer.handler_pool import run_handlers
from kmq.consumer.key_hold import KeyHold
from kmq.consumer.key_recovery import KeyRecovery
from kmq.consumer.keyed_ready import KeyedReadyQueue
from kmq.consumer.lease_expiry import LeaseExpiry
from kmq.consumer.membership import Membership
from kmq.consumer.leases import AutoRenewal, HeldLeases, LateSettler, auto_renewal
from kmq.consumer.ready_queue import ReadyQueue
from kmq.consumer.take_ahead import MOST, TakeAhead
from kmq.consumer.writer import MarkerWriter
from kmq.core.errors import FetcherStalled, KmqError
from kmq.core.lease import LeaseKeeper, LeaseSchedule
from kmq.core.log_fields import message_fields
from kmq.core.message import ABANDON, KmqMessage, message_builder
from kmq.core.schedule import longest_delay_ms
from kmq.telemetry.metrics import ConsumerMetrics
from kmq.telemetry.tracing import delivery_tracing

__all__ = ["KmqConsumer", "StageHook", "FETCH_BATCHES"]

log = logging.getLogger(__name__)


#: The default ``fetch_size`` in ``batch_size``s: most records per Kafka poll and START. Measured
#: side by side against 4 (docs/benchmarks.md): confluent-kafka 5 % more messages a second for
#: 5 % less CPU, kafka-python the same rate for 4 % less CPU; flow control still asks for less
#: whenever the handlers' pace calls for it.
FETCH_BATCHES = 8

#: Seconds the fetcher, closing, waits for a take for iteration that is in progress (it ends at
#: once when the close wakes it; this bounds only a taker that cannot run meanwhile).
TAKE_WAIT = 1.0

#: Seconds between the fetcher's looks while the consumer is out of the group (the application
#: stopped taking, ``consumer.max_poll_interval``): how soon a take brings it back.
OUT_WAIT = 0.1

#: ``hook(stage, {partition: (first_offset, last_offset)})`` called by the fetcher
#: thread at "polled" (records fetched, nothing written), "started" (START
#: acknowledged, not committed) and "committed" (committed, about to hand over);
#: with ``consumer.hand_over: started``, "handed" (about to hand over, the commit
#: not answered yet) instead of "committed". For tests and diagnostics; it runs on
#: the fetcher thread and blocks it.
StageHook = Callable[[str, dict[int, tuple[int, int]]], None]


class KmqConsumer(ConsumerSettler):
    """Consume a queue with individual acknowledgements.

    ::

        with KmqConsumer(cfg, queue="orders") as consumer:
            for msg in consumer:          # START written + offsets committed
                handle(msg.value)
                msg.ack()

    :param cfg: the kmq configuration (group from ``consumer.group_id``).
    :param queue: queue name (default: the only configured queue).
    :param group: the queue's consumer group (``queues[].group``; ``default`` for the default group),
        needed only when the queue is configured for several. Each group gets every message; a copy
        made for another group is skipped (docs/protocol.md, "Consumer groups of one queue").
    :param batch_size: default ``max_records`` of :meth:`poll` (and what :meth:`run` takes at a time).
    :param fetch_size: most records the fetcher takes per Kafka poll; one START per partition
        per fetch (default ``8 * batch_size``, :data:`FETCH_BATCHES`); flow control may ask for fewer.
        kafka-python's per-poll cost is high, so fetching in bigger steps than the
        application consumes keeps the overhead per message low.
    :param prefetch: no longer used (flow control, :mod:`kmq.consumer.flow`, bounds what is
        fetched ahead); accepted for compatibility.
    :param metrics: :class:`~kmq.telemetry.metrics.ConsumerMetrics` to record into.
    :param stage_hook: see :data:`StageHook` (tests, diagnostics).
    :param clients: builds the Kafka clients (the group consumer, the marker producer, the readers
        of ``consumer.ordering: key``; :class:`~kmq.client.parts.ClientFactory`). Default: the
        clients ``kafka.client`` names, on the configured cluster. :mod:`kmq.testing` passes the
        simulated cluster's.
    :param writer: the queue's marker writer (default: a :class:`~kmq.consumer.writer.MarkerWriter`
        built from ``cfg``, ``queue``, ``metrics`` and ``clients``). Given, the consumer takes its
        queue and metrics from it and closes it on :meth:`close`, as it closes its own.
    """

    def __init__(
        self,
        cfg: Config,
        queue: str | None = None,
        *,
        batch_size: int = 500,
        fetch_size: int | None = None,
        prefetch: int = 2,
        metrics: ConsumerMetrics | None = None,
        stage_hook: StageHook | None = None,
        clients: ClientFactory = KAFKA_CLIENTS,
        group: str | None = None,
        writer: MarkerWriter | None = None,
    ) -> None:
        self.cfg = cfg
        self._clients = clients
        self.writer = writer or MarkerWriter(cfg, queue, metrics=metrics, clients=clients, group=group)
        self.queue = self.writer.queue
        self.metrics = self.writer.metrics
        self.batch_size = batch_size
        self.cap = cfg.consumer.max_in_flight_per_partition
        self.fetch_size = fetch_size or FETCH_BATCHES * batch_size
        self._lock = self.writer.lock  # settle decisions, buffer, in-flight counts
        #: What the client adapter builds for each fetched record (no intermediate record object).
        self._message = message_builder(self, self._lock)
        #: Committed batches waiting for user code, and the fetcher's error; with ``consumer.ordering: key``
        #: handed out one message per key at a time (:mod:`kmq.consumer.keyed_ready`).
        self._keyed: KeyedReadyQueue | None = KeyedReadyQueue() if cfg.consumer.ordering == "key" else None
        self._ready: KeyedReadyQueue | ReadyQueue = self._keyed or ReadyQueue()
        #: Ready messages taken for iteration (``for msg in consumer``, :mod:`kmq.consumer.aio`) a few at
        #: a time and handed on one by one; put back when closing. Public for :mod:`kmq.consumer.aio`,
        #: which takes from it too; not for applications.
        self.ahead = TakeAhead(self.take_chunk)
        self._inflight: dict[int, int] = defaultdict(int)
        self._stop = threading.Event()
        #: Set when a START or a commit is answered (and on stop): ends the fetcher's wait early.
        self._wake = threading.Event()
        self._closed = False
        #: :meth:`stop` or :meth:`close` was called (a plain flag: iteration and :mod:`kmq.consumer.aio`
        #: read it once per message; setting it is thread- and signal-safe).
        self.stopping = False
        self._fetcher: threading.Thread | None = None
        self._settled_counts = [0, 0]  # [messages, bytes] settled by user code since the last fold
        self._returned_counts = [0, 0]  # [messages, bytes] given back unprocessed since the last fold
        #: Takes by the application (poll, workers; iteration's are counted by TakeAhead): a bare
        #: count, no clock read per take; the fetcher tells a stalled application by it
        #: (:mod:`kmq.core.poll_interval`).
        self._takes = 0
        self._pipeline = FetchPipeline.for_kafka(
            cfg.kafka, self.queue.lease, hand_over_started=cfg.consumer.hand_over == "started", group=self.queue.group,
            # ordering: key: held messages have a bound of their own
            max_held=None if self._keyed is None else cfg.consumer.max_outstanding_messages)
        self._longest_delay_ms = longest_delay_ms(self.queue.markers_retention)  # scheduled messages
        self._gauge_at = 0.0  # next in-flight gauge update
        #: Outstanding-message bounds and the measured rate (under self._lock).
        self.flow = FlowControl(FlowLimits(
            lease=self.queue.lease, max_messages=cfg.consumer.max_outstanding_messages,
            max_bytes=cfg.consumer.max_outstanding_bytes,
            # The floor: one full poll(max_records=batch_size) can always be served.
            min_messages=max(1, min(batch_size, cfg.consumer.max_outstanding_messages)),
        ), time.monotonic())
        try:
            self._kc = self._open_kafka_consumer()
        except BaseException:
            self.writer.close()
            raise
        self._init_leases(cfg)
        #: ordering: key: what an earlier owner of an assigned partition left unsettled (kmq.consumer.key_recovery).
        self._recovery = None if self._keys is None else KeyRecovery(
            cfg, self.queue, self._keys.keyed, self.metrics, self._keys.copy_wait, lambda: clients.open_log_reader(cfg.kafka))
        #: A span per delivery when the application installed an OpenTelemetry tracer provider, else None.
        self._tracing = delivery_tracing(cfg.workers_group(self.queue))
        #: Plain acks (no response future) settled since the last fold, their bookkeeping not done yet
        #: (:meth:`_fold_acks`): an ack only appends here. Not with ``ordering: key`` or tracing, whose
        #: per-message work cannot wait.
        self._acked: list[KmqMessage] = []
        self._fold_later = self._keys is None and self._tracing is None
        self._acks.before_drain.append(self._fold_acks)  # every END is in the buffer before it is drained
        recovery = self._recovery
        #: The fetcher thread's step: the pipeline's I/O shell (kmq.consumer.fetcher).
        self._step = Fetcher(FetcherParts(
            self.queue.name, self.queue.label, self._pipeline, self.writer, self._ready, self._message,
            self._hand_over, self._fetched, self.metrics, self._wake, rest=self._stop.wait,
            stage_hook=stage_hook, on_assigned=None if recovery is None else recovery.assigned,
            # A rebalance callback waits this long for the hand-off RENEW (kafka-python runs it on the
            # client's I/O thread, which sends no heartbeat meanwhile).
            handoff_wait=min(2.0, cfg.kafka.session_timeout / 4),
            # Seconds without records, while partitions lag, before kafka-python's fetch state is unstuck.
            starve_after=max(1.0, cfg.consumer.fetch_stall_timeout / 2),
            commit_back_closing=self._keyed is None, session_timeout=cfg.kafka.session_timeout), self._kc)

    def _open_kafka_consumer(self) -> Any:
        """A new group consumer of this consumer's group (not subscribed yet)."""
        cfg = self.cfg
        overrides = {"metadata_max_age": cfg.kafka.metadata_max_age}
        if cfg.consumer.fetch_wait_ms is not None:
            overrides["fetch_wait"] = cfg.consumer.fetch_wait_ms / 1000
        return self._clients.group_consumer(cfg.kafka, cfg.workers_group(self.queue), cfg.consumer.assignor,
                                            self.fetch_size, **overrides)

    def _init_leases(self, cfg: Config) -> None:
        """Renewal of held messages, the end of handed ones' leases, ``consumer.auto_renew``."""
        #: The writer's settlement buffer, one object for its lifetime (read per settlement).
        self._acks = self.writer.buffer
        self._held = HeldLeases(self.queue.name, self.queue.lease, self._acks, self._lock)
        #: Handed-over messages until settled or past their lease (then they leave flow control).
        self._expiry = LeaseExpiry(self.queue.lease)
        self._extended = self._expiry.extended  # read per settlement: the dict itself, one lookup less
        #: ordering: key: settlements and ended leases for the key order; a key waits for a failed
        #: message's copy every delivery left, each a lease and the longest backoff, before it is released.
        self._keys = None if self._keyed is None else KeyHold(
            self._keyed, self.queue, self.metrics, self.queue.max_deliveries * (self.queue.lease + self.queue.backoff.max))
        self._late = LateSettler(self.queue.name, self.queue.lease, self._acks,
                                 _not_keyed if self._keys is None else self._keys.settled_late)
        self._expired_logged = False
        self._schedule: LeaseSchedule | None = None
        self._keeper: LeaseKeeper | None = None
        self._renewal: AutoRenewal | None = None
        #: The schedule's tracked messages, read per settlement: empty (no call) for the messages
        #: settled before their batch's look, most of a busy consumer's.
        self._tracked: Mapping[Any, Any] = {}
        if cfg.consumer.auto_renew:
            self._schedule, self._keeper, self._renewal = auto_renewal(
                self.queue.name, self.queue.lease, cfg.consumer.max_lease, self.writer.flush_interval,
                self._acks, self._lock, self._expiry)
            self._tracked = self._schedule.tracked

    @property
    def exhausted_leases(self) -> int:
        """Messages that reached ``consumer.max_lease`` unsettled (automatic renewals stopped)."""
        return self._renewal.exhausted if self._renewal is not None else 0

    # ------------------------------------------------------------ lifecycle
    def _ensure_started(self) -> None:
        if self._closed:
            raise KmqError(f"the consumer of {self.queue.name} is closed")
        if self._fetcher is None:
            self._fetcher = threading.Thread(target=self._fetch_loop, name=f"kmq-fetcher-{self.queue.name}", daemon=True)
            self._fetcher.start()
            self._kc.watch(self.cfg.consumer.fetch_stall_timeout, self._stalled, self.queue.name)
            hint = untuned_collector_hint()
            if hint is not None:
                log.info("%s: %s", self.queue.name, hint)
            if self._keeper is not None:
                self._keeper.start()

    def __enter__(self) -> "KmqConsumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float | None = None) -> None:
        """Stop fetching, give never-handed messages back to the group (their
        offsets are committed back, so the next owner polls them again), leave
        the group and flush pending acks. Unsettled handed-over messages stay in
        flight: the tracker redelivers them when their leases end."""
        if self._closed:
            return
        self._closed = True
        self.stopping = True
        self._put_back_ahead()
        self._stop.set()
        self._wake.set()
        self._ready.wake()
        if self._fetcher is not None and self._fetcher is not threading.current_thread():
            if isinstance(self._ready.error, FetcherStalled):
                timeout = 1.0  # it is stuck inside kafka-python: do not wait for it
            self._fetcher.join(timeout if timeout is not None else self.cfg.kafka.session_timeout + 10)
        if self._fetcher is None:
            self._close_kafka_consumer()
        if self._recovery is not None:
            self._recovery.close()
        self._kc.unwatch()
        if self._keeper is not None:
            self._keeper.stop()
        with self._lock:
            self._fold_acks()
            unsettled = sum(n for n in self._inflight.values() if n > 0)
        if unsettled:
            log.info("%s: closing with %d unsettled message(s); the tracker redelivers them when their leases end",
                     self.queue.name, unsettled)
        if self._tracing is not None:
            with self._lock:
                self._tracing.close()
        self.writer.close(timeout)

    def _put_back_ahead(self) -> None:
        """Closing: messages taken ahead for iteration and never handed out go back into the ready
        queue before the fetcher stops, and it gives them back to the group with the rest (same
        delivery count). Where they cannot go back (``ordering: key``: their keys were let go; a
        fetcher already gone: nothing gives them back) they are nacked "not a delivery": the
        tracker redelivers them now, with the delivery count they had."""
        put_back_ahead(self.ahead, self._ready, self.queue.name,
                       fetching=self._fetcher is not None and self._fetcher.is_alive())

    def stop(self) -> None:
        """Make :meth:`run` (and iteration) return after draining; thread- and signal-safe."""
        self.stopping = True
        self._ready.wake()

    def in_flight(self) -> dict[int, int]:
        """Unsettled messages per partition (handed over or ready to be)."""
        with self._lock:
            self._fold_acks()
            return {p: n for p, n in self._inflight.items() if n}

    # ------------------------------------------------------------ application side
    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[KmqMessage]:
        """Up to ``max_records`` (default ``batch_size``) messages whose START was
        acknowledged by Kafka and whose offsets were committed; ``[]`` after
        ``timeout`` seconds without any. Raises the
        fetcher's error (e.g. :class:`~kmq.core.errors.MarkerWriteError`) once ready
        messages are used up."""
        self._ensure_started()
        self._takes += 1
        n = self.batch_size if max_records is None else max_records
        if self.ahead:  # an iteration left messages taken ahead: they come first
            held = self.ahead.take(n if n > 0 else MOST)
            if held:
                return held
        return self._ready.take(timeout, n, self._stopped)

    def take_chunk(self, timeout: float, max_records: int) -> tuple[list[KmqMessage], float, int]:
        """Ready messages of one batch with what putting them back needs (:mod:`kmq.consumer.take_ahead`);
        what a taker does not hand on goes to ``self.ahead.keep``. Waits at most ``timeout`` seconds.
        For :mod:`kmq.consumer.aio`'s poll thread; applications call :meth:`poll`."""
        self._ensure_started()
        self._takes += 1
        return self._ready.take_chunk(timeout, max_records, self._stopped)

    def _stopped(self) -> bool:
        return self.stopping or self._stop.is_set()

    def __iter__(self) -> Iterator[KmqMessage]:
        """Messages one by one until :meth:`stop` or :meth:`close`.

        While the loop keeps up with a backlog, messages are taken from the ready queue a few at a
        time (:mod:`kmq.consumer.take_ahead`), else one at a time. Leaving the loop early
        (``break``, an exception) strands nothing: what it took ahead comes first to the next
        :meth:`poll` or loop, and :meth:`close` gives it back to the group with the rest."""
        self._ensure_started()
        ahead = self.ahead
        while not self.stopping:
            msg = ahead.next(0.5)  # raises the fetcher's error once nothing is ready
            if msg is not None:
                yield msg

    def run(self, handler: Callable[[KmqMessage], Any], workers: int = 1, poll_timeout: float = 0.5, *,
            reject_on: type[BaseException] | tuple[type[BaseException], ...] = ()) -> None:
        """Call ``handler(msg)`` on a pool of ``workers`` threads until :meth:`stop`.

        Out of order, no head-of-line blocking inside a partition; with ``consumer.ordering: key``
        one message per key at a time, in offset order (docs/protocol.md). A message is
        taken from the consumer only when a worker is free to start it, so no
        lease runs in a pool queue. A handler that returns acks the message
        (unless it settled it itself); an exception of ``reject_on`` rejects it
        (DLQ, reason ``"Type: text"``), any other exception nacks it with the queue's
        backoff for its delivery count. On stop, running handlers finish; messages
        not yet taken are given back to the group by :meth:`close`."""
        run_handlers(self, handler, workers, poll_timeout, reject_on)

    def raise_error(self) -> None:
        """Raise the fetcher's error once no ready messages are left (for :mod:`kmq.consumer.handler_pool`)."""
        self._ready.raise_error()

    # ------------------------------------------------------------ fetcher thread: runs the fetcher step
    def _fetch_loop(self) -> None:
        """Run the fetcher step (:mod:`kmq.consumer.fetcher`) until the stop, with each turn's lease
        work: this thread is the only one that touches the Kafka consumer."""
        step = self._step
        member = Membership(self.cfg, self.queue.name, self.metrics, step, self._open_watched,
                            lambda: self._give_back_unhanded(final=False), self._close_kafka_consumer, time.monotonic())
        try:
            step.subscribe()
            while not self._stop.is_set():
                self._wake.clear()  # before reading the answers: one that comes after sets it again
                now = time.monotonic()
                if step.consumer is not None:
                    step.answers(now)
                    self._held.renew_due(self._pipeline.pending, self._ready, now)
                self._expire_leases(now)
                if not member.look(now, self._takes + self.ahead.takes, self._ready.ready):
                    self._room(now)  # out of the group (the application stopped taking): settlements, gauges
                    self._wake.wait(OUT_WAIT)
                    continue
                # A fresh reading: carrying out the answers above may have handed batches over (at a
                # later time than `now`), and flow control counts busy time from then.
                wait = step.poll(*self._room(time.monotonic()))
                if wait:
                    self._wake.wait(wait)
        except Exception as exc:
            self._fetch_failed(exc)
        finally:
            if step.consumer is None:
                step.nack_left_behind()
            else:
                try:
                    self._give_back_unhanded()
                finally:  # whatever happened there: leave the group now, not after max.poll.interval
                    self._close_kafka_consumer()

    def _open_watched(self) -> Any:
        """A new group consumer (joining again after a stall, :mod:`kmq.consumer.membership`), watched."""
        kc = self._kc = self._open_kafka_consumer()
        try:
            kc.watch(self.cfg.consumer.fetch_stall_timeout, self._stalled, self.queue.name)
        except BaseException:
            self._close_kafka_consumer()
            raise
        return kc

    def _give_back_unhanded(self, final: bool = True) -> None:
        """On close (or, not ``final``, on leaving the group while the application stalls): never-handed
        messages go back to the group (:meth:`kmq.consumer.fetcher.Fetcher.give_back_unhanded`)."""
        give_back_ready(self._step, self.ahead, self._ready, self.queue.name, final, TAKE_WAIT)

    # ------------------------------------------------------------ the fetcher step's parts
    def _fetched(self, b: FetchBatch) -> None:
        """A new batch: outstanding from now (before its STARTs go)."""
        with self._lock:
            for p, offs in b.offsets.items():
                self._inflight[p] += len(offs)
            self.flow.taken(len(b.messages), b.nbytes, b.fetched_at)

    def _hand_over(self, action: HandOver) -> None:
        b = action.batch
        # Scheduled messages not due yet go back to the tracker until their time (kmq.consumer.scheduled).
        messages = hold_back_scheduled(action.messages, action.scheduled, self._longest_delay_ms, self.queue.name,
                                       self._count_outcome)
        if not messages:
            return
        with self._lock:
            now = time.monotonic()
            self.flow.handed(len(messages), now)
            schedule = self._schedule
            if schedule is not None:
                # Tracked for renewal only if still unsettled 10 ms after user code took them
                # (_expire_leases tells the schedule): most messages of a busy consumer are
                # settled by then and cost the schedule nothing. The keeper's look tracks them
                # meanwhile if they wait longer, so no renewal is missed. (ordering: key's takes
                # are records of their own, not the batch: 10 ms after the hand-over there.)
                schedule.track_soon(messages, b.leased_at, now,  # type: ignore[arg-type]  # list invariance
                                    until_taken=self._keyed is None)
                schedule.look(now)
        self.writer.count_received(len(messages))
        if self._tracing is not None:
            self._tracing.handed(messages)
        self._ready.put(messages, b.leased_at, b.gen)

    def _count_outcome(self, outcome: str, n: int) -> None:
        self.writer.metrics.messages.labels(self.queue.name, outcome).inc(n)

    def _room(self, now: float) -> tuple[int, int]:
        """Records the next poll may ask for (flow control, the per-partition cap) and the messages
        held back for their key (the pipeline bounds those); publishes the in-flight gauge twice a second."""
        held = self._keyed.held if self._keyed is not None else 0
        with self._lock:
            self._fold_settlements(now)
            part_room = self.cap - max(self._inflight.values(), default=0)
            self.flow.held = held
            room = self.flow.fetchable(now, part_room, self.fetch_size, self.cap)
            snapshot = dict(self._inflight) if now >= self._gauge_at else None  # zeros kept: a drained partition shows 0
        if snapshot is not None:
            self._gauge_at = now + 0.5
            for p, n in snapshot.items():
                self.metrics.in_flight.labels(self.queue.name, str(p)).set(n)
            if self._keys is not None:
                self._keys.look(now)
        return room, held

    def _expire_leases(self, now: float) -> None:
        """Messages whose lease ended in user code unsettled leave flow control and the in-flight
        count (:mod:`kmq.consumer.lease_expiry`); settling them later still writes the marker."""
        expiry = self._expiry
        taken = self._ready.taken()
        for msgs, first, end, leased_at in taken:
            expiry.handed(msgs, first, end, leased_at, now)
        if taken and self._schedule is not None:
            # A batch's grace starts at the take of its last message (poll(max_records) and
            # iteration take a batch in parts); until then the keeper's look covers it.
            whole = [t[0] for t in taken if t[2] == len(t[0])]
            if whole:
                with self._lock:
                    self._schedule.taken(whole, now)
        expiry.look(now)  # outside the lock: settlements go on meanwhile
        if not expiry.due(now):
            return
        with self._lock:
            expired = expiry.expired(now)
            nbytes = 0
            for m in expired:
                m.settle_through(self._late)  # its settlement is written, nothing counted twice
                self._inflight[m.partition] -= 1
                if self._schedule is not None:
                    # Left to the tracker now: a RENEW from consumer.auto_renew would keep it from
                    # redelivering (after an abandon, until max_lease), so none is written any more.
                    self._schedule.untrack(m)
                nbytes += m._nbytes
                if self._keys is not None:  # its key waits for the copy (or is released at its last delivery)
                    self._keys.settled(m, ABANDON, None)
            if expired:
                self.flow.expired(len(expired), nbytes, now)
        if expired:
            self.metrics.lease_expired.labels(self.queue.name).inc(len(expired))
            if self._tracing is not None:
                self._tracing.timed_out(expired)
            log.log(logging.DEBUG if self._expired_logged else logging.WARNING,
                    "%s: %d handed-over message(s) (first %s/%d/%d) reached the end of their lease unsettled: they "
                    "no longer hold room in flow control and the tracker redelivers them; settle every message "
                    "(ack, nack, reject) or renew it", self.queue.name, len(expired), self.queue.name,
                    expired[0].partition, expired[0].offset,
                    extra=message_fields(expired[0], outcome="timeout", count=len(expired)))
            self._expired_logged = True

    def _stalled(self, why: str) -> None:
        self._fail(FetcherStalled(f"{self.queue.name}: {why}"))

    def _fetch_failed(self, exc: Exception) -> None:
        """The fetch loop (thread or event-loop driver) stopped on ``exc``: surface it to the application,
        kmq's error as it is (the adapters' fetch and subscribe raise only kmq's errors), anything else
        as the bug it is, logged with its traceback."""
        if not isinstance(exc, KmqError):
            # A client call the adapters do not translate (pause, resume, a position...) still reaches
            # the application as kmq's error for a client failure, never as the client's own class.
            error = client_api.client_error(self.cfg.kafka, exc, f"consuming {self.queue.name}")
            if error is None:  # a bug: surface it to the application instead of dying silently
                log.exception("the fetch loop of %s failed", self.queue.name)
            else:
                error.__cause__ = exc
                exc = error
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        log.error("%s: %s", self.queue.name, exc)
        self._ready.fail(exc)  # before the stop: a waiting poll raises it rather than return []
        self._stop.set()
        self._wake.set()

    def _close_kafka_consumer(self) -> None:
        try:
            self._kc.close()  # leaves the group (auto-commit is off: nothing else committed)
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.warning("closing the Kafka consumer of %s failed: %s", self.queue.name, exc)


def _not_keyed(msg: KmqMessage, outcome: str) -> None:
    """A late settlement without ``ordering: key``: nothing to release."""
