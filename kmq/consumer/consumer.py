"""KmqConsumer: a queue consumer with individual acks (docs/protocol.md).

Threading: one
background *fetcher* thread owns the Kafka consumer (a
:class:`~kmq.client.GroupConsumerAdapter` on the client ``kafka.client``
names, kafka-python or confluent-kafka; neither is thread-safe) and runs
poll -> START (acknowledged by Kafka) -> commit -> hand-over, ahead of the
application. The application thread takes ready batches from a bounded
queue; acks and other settlements go into the writer's
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
from collections import defaultdict, deque
from typing import Any, Callable, Iterator

from kmq import client as client_api
from kmq.client import ClientCommitFailed
from kmq.config import Config
from kmq.core.errors import FetcherStalled, KmqError, MarkerWriteError
from kmq.consumer.flow import FlowControl, FlowLimits, Room
from kmq.consumer.leases import AutoRenewal, HeldLeases, auto_renewal
from kmq.consumer.fetch_batch import FetchBatch, first_offsets
from kmq.consumer.give_back import RETURNED, give_back, give_back_on_close
from kmq.consumer.handler_pool import run_handlers
from kmq.core.lease import LeaseKeeper, LeaseSchedule
from kmq.core.message import ABANDON, ACK, NACK, REJECT, KmqMessage
from kmq.consumer.ready_queue import ReadyQueue
from kmq.telemetry.metrics import ConsumerMetrics
from kmq.consumer.writer import CommitError, MarkerWriter, _ms

__all__ = ["KmqConsumer", "StageHook"]

log = logging.getLogger(__name__)



#: ``hook(stage, {partition: (first_offset, last_offset)})`` called by the fetcher
#: thread at "polled" (records fetched, nothing written), "started" (START
#: acknowledged, not committed) and "committed" (about to hand over). For tests
#: and diagnostics; it runs on the fetcher thread and blocks it.
StageHook = Callable[[str, dict], None]


class KmqConsumer:
    """Consume a queue with individual acknowledgements.

    ::

        with KmqConsumer(cfg, queue="orders") as consumer:
            for msg in consumer:          # START written + offsets committed
                handle(msg.value)
                msg.ack()

    :param cfg: the kmq configuration (group from ``consumer.group_id``).
    :param queue: queue name (default: the only configured queue).
    :param batch_size: default ``max_records`` of :meth:`poll` (and what :meth:`run` takes at a time).
    :param fetch_size: most records the fetcher takes per Kafka poll; one START per partition
        per fetch (default ``4 * batch_size``); flow control may ask for fewer.
        kafka-python's per-poll cost is high, so fetching in bigger steps than the
        application consumes keeps the overhead per message low.
    :param prefetch: no longer used (flow control, :mod:`kmq.consumer.flow`, bounds what is
        fetched ahead); accepted for compatibility.
    :param metrics: :class:`~kmq.telemetry.metrics.ConsumerMetrics` to record into.
    :param stage_hook: see :data:`StageHook` (tests, diagnostics).
    """

    #: Seconds without room (flow control) before the fetcher polls with all partitions paused:
    #: a rebalance needs every member to poll (kafka-python rejoins inside poll), so a member must
    #: not stop polling while its handlers are behind. Not on every blip: pausing parks buffered
    #: fetches (see :func:`kmq.client.kafka_python.watchdog.unstrand_records`).
    BACKPRESSURE_POLL = 0.5

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
    ) -> None:
        self.cfg = cfg
        self.writer = MarkerWriter(cfg, queue, metrics=metrics)
        self.queue = self.writer.queue
        self.metrics = self.writer.metrics
        self.batch_size = batch_size
        self.cap = cfg.consumer.max_in_flight_per_partition
        self.fetch_size = fetch_size or 4 * batch_size
        self._hook = stage_hook
        self._lock = self.writer.lock  # settle decisions, buffer, in-flight counts
        self._ready = ReadyQueue()  # committed batches waiting for user code, and the fetcher's error
        self._inflight: dict[int, int] = defaultdict(int)
        self._stop = threading.Event()
        self._stop_run = threading.Event()
        self._closed = False
        self._fetcher: threading.Thread | None = None
        self._revoked_parts: frozenset[int] = frozenset()
        self._commit_retry = False  # a commit failed and is retried: keep polling to finish a rebalance
        self._settled_counts = [0, 0]  # [messages, bytes] settled by user code since the last fold
        self._returned_counts = [0, 0]  # [messages, bytes] given back unprocessed since the last fold
        self._commit_timeout = self.cfg.kafka.session_timeout + self.cfg.kafka.connect_timeout
        # A START write gets an answer (ack or timeout error) within the producer's delivery timeout.
        self._start_answer_timeout = self.cfg.kafka.connect_timeout + 2.0
        #: Outstanding-message bounds and the measured rate (under self._lock).
        self.flow = FlowControl(FlowLimits(
            lease=self.queue.lease, max_messages=cfg.consumer.max_outstanding_messages,
            max_bytes=cfg.consumer.max_outstanding_bytes,
            # The floor: one full poll(max_records=batch_size) can always be served.
            min_messages=max(1, min(batch_size, cfg.consumer.max_outstanding_messages)),
        ), time.monotonic())
        try:
            self._kc = client_api.group_consumer(cfg.kafka, cfg.consumer.group_id, cfg.consumer.assignor,
                                                 self.fetch_size)
        except BaseException:
            self.writer.close()
            raise
        self._paused = False  # every assigned partition paused (no room for a while)
        #: Seconds without records, while partitions lag, before kafka-python's fetch state is unstuck.
        self._starve_after = max(1.0, cfg.consumer.fetch_stall_timeout / 2)
        self._held = HeldLeases(self.queue.name, self.queue.lease, self.writer.buffer, self._lock)
        self._schedule: LeaseSchedule | None = None
        self._keeper: LeaseKeeper | None = None
        self._renewal: AutoRenewal | None = None
        if cfg.consumer.auto_renew:
            self._schedule, self._keeper, self._renewal = auto_renewal(
                self.queue.name, self.queue.lease, cfg.consumer.max_lease, self.writer.flush_interval,
                self.writer.buffer, self._lock)

    # ------------------------------------------------------------ Settler (called under self._lock)
    def settled(self, msg: KmqMessage, outcome: str, arg: Any) -> None:
        p = msg.partition
        if outcome is ACK:
            self.writer.buffer.ack(p, msg.offset)
        elif outcome is NACK:
            self.writer.buffer.nack(p, msg.offset, _ms(arg))
        elif outcome is REJECT:
            self.writer.buffer.reject(p, msg.offset, arg)
        self._inflight[p] -= 1
        # Counted here, folded into the flow state by the fetcher (no clock read per message).
        c = self._returned_counts if outcome is ABANDON and arg == RETURNED else self._settled_counts
        c[0] += 1
        c[1] += msg._nbytes
        if self._schedule is not None:
            self._schedule.forget((p, msg.offset))

    def _fold_settlements(self, now: float) -> None:
        """Move the settlement counts into the flow state (under self._lock)."""
        if self._settled_counts[0]:
            self.flow.settled(self._settled_counts[0], self._settled_counts[1], now)
            self._settled_counts[:] = [0, 0]
        if self._returned_counts[0]:
            self.flow.returned(self._returned_counts[0], self._returned_counts[1], now)
            self._returned_counts[:] = [0, 0]

    def renewed(self, msg: KmqMessage, lease: float | None) -> None:
        lease = lease or self.queue.lease
        self.writer.buffer.renew(msg.partition, msg.offset, _ms(lease))
        if self._schedule is not None:
            self._schedule.renewed((msg.partition, msg.offset), time.monotonic(), lease)

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
        self._stop.set()
        self._stop_run.set()
        self._ready.wake()
        if self._fetcher is not None and self._fetcher is not threading.current_thread():
            if isinstance(self._ready.error, FetcherStalled):
                timeout = 1.0  # it is stuck inside kafka-python: do not wait for it
            self._fetcher.join(timeout if timeout is not None else self.cfg.kafka.session_timeout + 10)
        if self._fetcher is None:
            self._close_kafka_consumer()
        self._kc.unwatch()
        if self._keeper is not None:
            self._keeper.stop()
        with self._lock:
            unsettled = sum(n for n in self._inflight.values() if n > 0)
        if unsettled:
            log.info("%s: closing with %d unsettled message(s); the tracker redelivers them when their leases end",
                     self.queue.name, unsettled)
        self.writer.close(timeout)

    def stop(self) -> None:
        """Make :meth:`run` (and iteration) return after draining; thread- and signal-safe."""
        self._stop_run.set()
        self._ready.wake()

    def in_flight(self) -> dict[int, int]:
        """Unsettled messages per partition (handed over or ready to be)."""
        with self._lock:
            return {p: n for p, n in self._inflight.items() if n}

    # ------------------------------------------------------------ application side
    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[KmqMessage]:
        """Up to ``max_records`` (default ``batch_size``) messages whose START was
        acknowledged by Kafka and whose offsets were committed; ``[]`` after
        ``timeout`` seconds without any. Raises the
        fetcher's error (e.g. :class:`~kmq.core.errors.MarkerWriteError`) once ready
        messages are used up."""
        self._ensure_started()
        return self._ready.take(timeout, self.batch_size if max_records is None else max_records,
                                lambda: self._stop.is_set() or self._stop_run.is_set())

    def __iter__(self) -> Iterator[KmqMessage]:
        """Messages one by one until :meth:`stop` or :meth:`close`."""
        while not (self._stop_run.is_set() or self._closed):
            yield from self.poll(timeout=0.5)

    def run(self, handler: Callable[[KmqMessage], Any], workers: int = 1, poll_timeout: float = 0.5, *,
            reject_on: type[BaseException] | tuple[type[BaseException], ...] = ()) -> None:
        """Call ``handler(msg)`` on a pool of ``workers`` threads until :meth:`stop`.

        Out of order, no head-of-line blocking inside a partition. A message is
        taken from the consumer only when a worker is free to start it, so no
        lease runs in a pool queue. A handler that returns acks the message
        (unless it settled it itself); an exception of ``reject_on`` rejects it
        (DLQ, reason ``"Type: text"``), any other exception nacks it with the queue's
        backoff for its delivery count. On stop, running handlers finish; messages
        not yet taken are given back to the group by :meth:`close`."""
        run_handlers(self, handler, workers, poll_timeout, reject_on)

    @property
    def stopping(self) -> bool:
        """:meth:`stop` or :meth:`close` was called."""
        return self._stop_run.is_set() or self._closed

    def raise_error(self) -> None:
        """Raise the fetcher's error once no ready messages are left (for :mod:`kmq.consumer.handler_pool`)."""
        self._ready.raise_error()

    # ------------------------------------------------------------ fetcher thread
    def _fetch_loop(self) -> None:
        kc = self._kc
        pending: deque[FetchBatch] = deque()
        try:
            kc.subscribe([self.queue.name], self._assigned, self._revoked)
            gauge_at = 0.0
            blocked_since: float | None = None
            fed_at = time.monotonic()  # last poll that returned records (or had no room to)
            while not self._stop.is_set():
                self._advance(kc, pending)
                now = time.monotonic()
                self._held.renew_due(pending, self._ready, now)
                publish = now >= gauge_at
                with self._lock:
                    self._fold_settlements(now)
                    room = self.flow.room(now)
                    # kafka-python caps a poll in total, not per partition: ask for no more than the
                    # fullest partition has room for, so no partition passes its cap.
                    part_room = self.cap - max(self._inflight.values(), default=0)
                    # Fetch in steps of at least a quarter of the bound (or a whole fetch): many small
                    # fetches would each pay kafka-python's per-poll cost and a START of their own.
                    step = max(1, min(self.fetch_size, self.flow.limit(now) // 4, self.cap // 4))
                    if min(room.messages, part_room) < step and self.flow.outstanding > 0:
                        room = Room(0, room.bytes)
                    snapshot = dict(self._inflight) if publish else {}  # zeros kept: a drained partition shows 0
                if publish:
                    gauge_at = now + 0.5
                    for p, n in snapshot.items():
                        self.metrics.in_flight.labels(self.queue.name, str(p)).set(n)
                if room:
                    blocked_since = None
                elif blocked_since is None:
                    blocked_since = now
                if not room and not self._commit_retry and (pending or now - blocked_since < self.BACKPRESSURE_POLL):
                    # Handlers are behind: wait for settlements (or for a START/commit) without polling.
                    self._stop.wait(0.002)
                    continue
                # No room for a while: poll with every partition paused, so membership goes on.
                self._apply_pauses(kc, all_paused=not room)
                max_records = min(self.fetch_size, room.messages, part_room) if room else 1
                # Short timeouts while batches are between START and hand-over, so they move on soon.
                timeout_ms = 500 if self._commit_retry else 5 if pending else 100 if room else 50
                records = kc.fetch(timeout_ms / 1000, max_records, self._message)
                if records or not room:
                    fed_at = time.monotonic()
                elif time.monotonic() - fed_at > self._starve_after:
                    kc.recover_starved()  # e.g. kafka-python's lost fetch responses
                    fed_at = time.monotonic()
                batch = self._take(kc, records) if records else None
                if batch is not None:
                    pending.append(batch)
        except Exception as exc:
            error = client_api.client_error(self.cfg.kafka, exc, f"consuming {self.queue.name}")
            if error is None:  # a bug: surface it to the application instead of dying silently
                log.exception("fetcher of %s failed", self.queue.name)
            elif error is not exc:
                error.__cause__ = exc
            self._fail(error or exc)
        finally:
            self._give_back_unhanded(kc, pending)
            self._close_kafka_consumer()

    def _message(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: Any, timestamp: int) -> KmqMessage:
        """What the adapter builds for each fetched record (no intermediate record object)."""
        return KmqMessage(topic, partition, offset, key, value, headers, timestamp, self, self._lock)

    def _stalled(self, why: str) -> None:
        self._fail(FetcherStalled(f"{self.queue.name}: {why}"))

    def _fail(self, exc: BaseException) -> None:
        log.error("%s: %s", self.queue.name, exc)
        self._ready.fail(exc)  # before the stop: a waiting poll raises it rather than return []
        self._stop.set()

    def _close_kafka_consumer(self) -> None:
        try:
            self._kc.close()  # leaves the group (auto-commit is off: nothing else committed)
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.warning("closing the Kafka consumer of %s failed: %s", self.queue.name, exc)

    def _apply_pauses(self, kc: Any, all_paused: bool) -> None:
        """Pause every partition (long without room) or resume them all. While paused, each poll
        pauses the assignment again: partitions a rebalance added arrive unpaused."""
        if all_paused:
            assigned = kc.assignment()
            if assigned:
                kc.pause(assigned)
            self._paused = True
        elif self._paused:
            assigned = kc.assignment()
            if assigned:
                kc.resume(assigned)
            self._paused = False

    def _take(self, kc: Any, messages: list[KmqMessage]) -> "FetchBatch | None":
        """Count the fetched messages outstanding and send their STARTs (no wait)."""
        offsets: dict[int, list[int]] = {}
        nbytes = 0
        for m in messages:
            nbytes += m._nbytes
            offs = offsets.get(m.partition)
            if offs is None:
                offsets[m.partition] = [m.offset]
            else:
                offs.append(m.offset)
        spans = {p: (o[0], o[-1]) for p, o in offsets.items()}
        if self._hook:
            self._hook("polled", spans)
        member = kc.member_id()
        if member:
            self.writer.owner = member
        lock = self._lock
        with lock:
            for p, offs in offsets.items():
                self._inflight[p] += len(offs)
            self.flow.taken(len(messages), nbytes, time.monotonic())
        b = FetchBatch(messages, offsets, spans, time.perf_counter())
        try:
            b.futures = self.writer.send_starts(offsets)
        except MarkerWriteError as exc:
            self._retry_later(kc, deque([b]), exc)
            return None
        return b

    def _retry_later(self, kc: Any, batches: "deque[FetchBatch]", exc: BaseException) -> None:
        """START or commit failed (e.g. the broker is down): nothing of ``batches`` was handed
        over or committed. Seek each partition back to its first offset so the records are
        polled (and STARTed) again, instead of dying or waiting for a lease to run out."""
        first = first_offsets(m for b in batches for m in b.messages)
        for b in batches:
            give_back(b.messages)
        batches.clear()
        assigned = {p for t, p in kc.assignment() if t == self.queue.name}
        for p, off in first.items():
            if p in assigned:  # a revoked partition is polled again by its new owner
                try:
                    kc.seek(self.queue.name, p, off)
                except ClientCommitFailed as seek_exc:  # revoked meanwhile: same as above
                    log.info("%s: %s", self.queue.name, seek_exc)
        log.warning("%s: %s; partitions %s go back to offsets %s and are fetched again", self.queue.name,
                    exc, sorted(first), [first[p] for p in sorted(first)])
        if isinstance(exc, MarkerWriteError):
            # After a broker restart kafka-python's idempotent producer was seen to leave every later
            # send pending for ever; a new producer costs one connection and rules that out.
            self.writer.replace_producer(f"a START marker failed ({type(exc).__name__})")
        self._stop.wait(0.5)  # a broker outage: do not spin

    def _advance(self, kc: Any, pending: "deque[FetchBatch]") -> None:
        """Move finished steps along, oldest batch first: START acknowledged ->
        commit (acknowledged) -> hand over. Commits are sent one at a time, in order; batches
        whose STARTs were answered meanwhile share the next commit."""
        while pending:
            b = pending[0]
            if b.commit is None:
                # Later batches whose STARTs are answered too ride on this batch's commit.
                while len(pending) > 1 and pending[1].commit is None and pending[1].started():
                    b.absorb(pending[1])
                    del pending[1]
                if not b.started():
                    if time.perf_counter() - b.t0 < self._start_answer_timeout:
                        return
                    # kafka-python's producer can lose a batch across a broker restart: its future
                    # never completes. Past the write timeout, treat the START as failed.
                    self._retry_later(kc, pending, MarkerWriteError(
                        f"START marker for {self.queue.name} {b.spans} got no answer from Kafka within "
                        f"{self._start_answer_timeout:g}s"))
                    return
                try:
                    self.writer.wait_starts(b.futures, timeout=0)
                except MarkerWriteError as exc:
                    self._retry_later(kc, pending, exc)  # later batches too: they must not be committed past it
                    return
                self.metrics.marker_write_seconds.observe(time.perf_counter() - b.t0)
                if self._hook:
                    self._hook("started", b.spans)
                revoked = self._revoked_parts & set(b.offsets)
                if revoked:
                    # Not committed: the partition's new owner polls these again (its START takes over).
                    # The batch's other partitions are still ours and go on to the commit.
                    back = [m for m in b.messages if m.partition in revoked]
                    log.info("%s: partitions %s revoked before the commit; %d started message(s) given back to "
                             "the group", self.queue.name, sorted(revoked), len(back))
                    give_back(back)
                    b.messages = [m for m in b.messages if m.partition not in revoked]
                    b.offsets = {p: o for p, o in b.offsets.items() if p not in revoked}
                    b.spans = {p: sp for p, sp in b.spans.items() if p not in revoked}
                    if not b.messages:
                        pending.popleft()
                        continue
                b.commit = kc.commit_async({(self.queue.name, p): o[-1] + 1 for p, o in b.offsets.items()})
                b.commit_at = time.monotonic()
                b.commit_tries += 1
            if not b.commit.is_done:
                if time.monotonic() - b.commit_at < self._commit_timeout:
                    return
                # kafka-python can lose a response across a broker restart: the future never completes.
                exc: Any = f"no answer within {self._commit_timeout:g}s"
            elif b.commit.failed():
                exc = b.commit.exception
            else:
                exc = None
            if exc is not None:
                # Whether a failed commit was applied is not certain (a rebalance may have raced it), so
                # neither hand over nor seek back: commit again while the partitions are ours (polling
                # meanwhile, which completes a rebalance); revoked ones are given back above.
                if b.commit_tries == 1:
                    log.warning("%s: committing offsets %s failed (%s); retrying until it succeeds or the "
                                "partitions are revoked", self.queue.name, b.spans, exc)
                elif b.commit_tries % 50 == 0:
                    log.warning("%s: committing offsets %s still failing after %d tries (%s)", self.queue.name,
                                b.spans, b.commit_tries, exc)
                b.commit = None
                if b.commit_tries >= 40:
                    # Still failing (~20 s of retries): give the batches back and fetch them again
                    # rather than stall the partitions (a copy at worst if a failed commit did land).
                    self._commit_retry = False
                    self._retry_later(kc, pending, CommitError(f"committing offsets {b.spans} kept failing ({exc})"))
                    return
                self._commit_retry = True
                # No sleep: the fetcher polls with a longer timeout meanwhile (see _fetch_loop), which
                # is what lets kafka-python complete the rebalance the commit is waiting for.
                return
            self._commit_retry = False
            pending.popleft()
            if self._hook:
                self._hook("committed", b.spans)
            self._hand_over(b.messages, b.leased_at)

    def _hand_over(self, messages: list[KmqMessage], started_at: float) -> None:
        with self._lock:
            self.flow.handed(len(messages), time.monotonic())
            if self._schedule is not None:
                for m in messages:
                    if m._outcome is None:
                        self._schedule.track((m.partition, m.offset), started_at)
        self.writer._c_received.inc(len(messages))
        self._ready.put(messages, started_at)

    def _revoked(self, partitions: set[tuple[str, int]]) -> None:
        # Runs inside the fetcher's poll (on kafka-python's I/O thread): touch only thread-safe state.
        # Ready messages of revoked partitions are kept and handed over: they are committed, so no
        # one else gets them, and the tracker (not the group) owns their leases.
        mine = {p for t, p in partitions if t == self.queue.name}
        self._revoked_parts = frozenset(self._revoked_parts | mine)
        if mine:
            log.info("%s: partitions %s revoked", self.queue.name, sorted(mine))

    def _assigned(self, partitions: set[tuple[str, int]]) -> None:
        mine = {p for t, p in partitions if t == self.queue.name}
        self._revoked_parts = frozenset(self._revoked_parts - mine)
        log.info("%s: assigned partitions %s", self.queue.name, sorted(mine))

    def _give_back_unhanded(self, kc: Any, pending: "deque[FetchBatch]") -> None:
        """On close: never-handed messages go back to the group (:func:`kmq.consumer.give_back.give_back_on_close`)."""
        ready = self._ready.drain()
        held = [m for b in pending for m in b.messages]
        pending.clear()
        if give_back_on_close(kc, self.queue.name, ready, held, lambda: self._revoked_parts,
                              lambda: self._apply_pauses(kc, all_paused=True), self.cfg.kafka.session_timeout):
            self.writer.flush_buffer()
