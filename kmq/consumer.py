"""KmqConsumer: a queue consumer with individual acks (KMQ-DESIGN section 4).

Threading (after the new Kafka consumer's design in shared/seeds/): one
background *fetcher* thread owns the kafka-python ``KafkaConsumer`` (which is
not thread-safe) and runs poll -> START (acknowledged by Kafka) -> synchronous
commit -> hand-over, one batch ahead of the application. The application
thread takes ready batches from a bounded queue; acks and other settlements go
into the writer's :class:`~kmq.ack_buffer.AckBuffer` and are flushed as
coalesced ranges by the writer's flusher thread. So the next batch's poll,
START and commit overlap with user processing of the current one.

The per-partition in-flight cap counts messages handed over (or ready to be)
and not settled: a partition at the cap is paused, records beyond the cap are
sought back, and the partition resumes when acks drain it. When the
application falls behind (ready batches pile up), the fetcher pauses every
partition but keeps polling, so heartbeats and rebalances go on. A rebalance drops
ready-but-not-handed batches of revoked partitions and NACKs them (delay 0),
so the tracker redelivers them at once to the new owner.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

from kafka import ConsumerRebalanceListener, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from kmq import clients
from kmq.config import Config
from kmq.errors import BrokerUnavailable, KmqError, MarkerWriteError, MessageAlreadySettled
from kmq.lease import LeaseKeeper, LeaseSchedule, default_margin
from kmq.message import ACK, NACK, REJECT, KmqMessage
from kmq.metrics import ConsumerMetrics
from kmq.writer import MarkerWriter, _ms

__all__ = ["KmqConsumer", "StageHook"]

log = logging.getLogger(__name__)

#: ``hook(stage, {partition: (first_offset, last_offset)})`` called by the fetcher
#: thread at "polled" (records fetched, nothing written), "started" (START
#: acknowledged, not committed) and "committed" (about to hand over). For tests
#: and diagnostics; it runs on the fetcher thread and blocks it.
StageHook = Callable[[str, dict], None]


def _member_id(kc: Any) -> str | None:
    gen = getattr(getattr(kc, "_coordinator", None), "_generation", None)
    member = getattr(gen, "member_id", None)
    return member or None


class _Pending:
    """A polled batch between START and hand-over (fetcher thread only)."""

    __slots__ = ("messages", "offsets", "spans", "t0", "sent_at", "futures", "commit")

    def __init__(self, messages: list[KmqMessage], offsets: dict[int, list[int]], spans: dict, t0: float) -> None:
        self.messages = messages
        self.offsets = offsets
        self.spans = spans
        self.t0 = t0
        self.sent_at = time.monotonic()  # START marker time, for the lease schedule
        self.futures: list = []
        self.commit: Any = None


class _Listener(ConsumerRebalanceListener):
    def __init__(self, owner: "KmqConsumer") -> None:
        self.owner = owner

    def on_partitions_revoked(self, revoked):  # fetcher thread, inside poll()
        self.owner._revoked({tp.partition for tp in revoked if tp.topic == self.owner.queue.name})

    def on_partitions_assigned(self, assigned):
        self.owner._revoked_parts = frozenset(self.owner._revoked_parts - {tp.partition for tp in assigned})
        log.info("%s: assigned partitions %s", self.owner.queue.name, sorted(tp.partition for tp in assigned))


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
    :param fetch_size: records the fetcher takes per Kafka poll; one START per partition per
        fetch (default ``4 * batch_size``, at most half of ``max_in_flight_per_partition``
        but at least ``batch_size``). kafka-python's per-poll cost is high, so fetching
        in bigger steps than the application consumes keeps the overhead per message low.
    :param prefetch: batches made ready ahead of the application (START + commit done).
    :param metrics: :class:`~kmq.metrics.ConsumerMetrics` to record into.
    :param stage_hook: see :data:`StageHook` (tests, diagnostics).
    """

    #: Seconds the application may stay behind before the fetcher polls with all partitions paused.
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
        # Default: 4 batches, but at most half the in-flight cap so fetches keep overlapping.
        self.fetch_size = fetch_size or max(batch_size, min(4 * batch_size, self.cap // 2))
        self.prefetch = max(1, prefetch)
        self._hook = stage_hook
        self._lock = self.writer.lock  # settle decisions, buffer, in-flight counts
        self._cond = threading.Condition()  # ready batches
        self._ready: deque[list[KmqMessage]] = deque()
        self._inflight: dict[int, int] = defaultdict(int)
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._stop_run = threading.Event()
        self._closed = False
        self._fetcher: threading.Thread | None = None
        self._revoked_parts: frozenset[int] = frozenset()
        self.pipeline = 2  # batches between poll and hand-over (START and commit in flight)
        self.exhausted_leases = 0
        try:
            self._kc = clients.consumer(
                cfg.kafka, group_id=cfg.consumer.group_id, enable_auto_commit=False, max_poll_records=self.fetch_size,
            )
        except BaseException:
            self.writer.close()
            raise
        self._schedule: LeaseSchedule | None = None
        self._keeper: LeaseKeeper | None = None
        if cfg.consumer.auto_renew:
            # A RENEW's deadline counts from its marker time, which is up to a flush
            # interval after the keeper decided it: keep that much of max_lease in hand.
            budget = max(self.queue.lease, cfg.consumer.max_lease - 2 * self.writer.flush_interval)
            self._schedule = LeaseSchedule(
                self.queue.lease, budget, default_margin(self.queue.lease, self.writer.flush_interval),
            )
            self._keeper = LeaseKeeper(self._schedule, self._lock, self._auto_renew, self._lease_exhausted,
                                       max_sleep=max(0.05, min(0.5, self.queue.lease / 4)))

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
        if self._schedule is not None:
            self._schedule.forget((p, msg.offset))

    def renewed(self, msg: KmqMessage, lease: float | None) -> None:
        lease = lease or self.queue.lease
        self.writer.buffer.renew(msg.partition, msg.offset, _ms(lease))
        if self._schedule is not None:
            self._schedule.renewed((msg.partition, msg.offset), time.monotonic(), lease)

    def _auto_renew(self, lease: float, keys: list) -> None:
        by_part: dict[int, list[int]] = defaultdict(list)
        for p, off in keys:
            by_part[p].append(off)
        for p, offs in by_part.items():
            self.writer.buffer.renew_many(p, offs, _ms(lease))

    def _lease_exhausted(self, keys: list) -> None:
        self.exhausted_leases += len(keys)
        first = min(keys)
        log.warning(
            "%d message(s) of %s (first %s/%d/%d) reached consumer.max_lease (%gs) without being settled; "
            "no more automatic renewals: the tracker will redeliver them when their current lease ends",
            len(keys), self.queue.name, self.queue.name, first[0], first[1], self.cfg.consumer.max_lease,
        )

    # ------------------------------------------------------------ lifecycle
    def _ensure_started(self) -> None:
        if self._closed:
            raise KmqError(f"the consumer of {self.queue.name} is closed")
        if self._fetcher is None:
            self._fetcher = threading.Thread(target=self._fetch_loop, name=f"kmq-fetcher-{self.queue.name}", daemon=True)
            self._fetcher.start()
            if self._keeper is not None:
                self._keeper.start()

    def __enter__(self) -> "KmqConsumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float | None = None) -> None:
        """Stop fetching, NACK ready-but-not-handed messages, leave the group and
        flush pending acks. Unsettled handed-over messages stay in flight: the
        tracker redelivers them when their leases end."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._stop_run.set()
        with self._cond:
            self._cond.notify_all()
        if self._fetcher is not None and self._fetcher is not threading.current_thread():
            self._fetcher.join(timeout if timeout is not None else self.cfg.kafka.session_timeout + 10)
        if self._fetcher is None:
            self._close_kafka_consumer()
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
        with self._cond:
            self._cond.notify_all()

    def in_flight(self) -> dict[int, int]:
        """Unsettled messages per partition (handed over or ready to be)."""
        with self._lock:
            return {p: n for p, n in self._inflight.items() if n}

    # ------------------------------------------------------------ application side
    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[KmqMessage]:
        """Up to ``max_records`` (default ``batch_size``) messages whose START was
        acknowledged by Kafka and whose offsets were committed; ``[]`` after
        ``timeout`` seconds without any. Raises the
        fetcher's error (e.g. :class:`~kmq.errors.MarkerWriteError`) once ready
        messages are used up."""
        self._ensure_started()
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._ready:
                if self._error is not None:
                    raise self._error
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set() or self._stop_run.is_set():
                    return []
                self._cond.wait(remaining)
            batch = self._ready.popleft()
            if max_records is None:
                max_records = self.batch_size
            if 0 < max_records < len(batch):
                self._ready.appendleft(batch[max_records:])
                batch = batch[:max_records]
            self._cond.notify_all()  # room for the fetcher
        return batch

    def __iter__(self) -> Iterator[KmqMessage]:
        """Messages one by one until :meth:`stop` or :meth:`close`."""
        while not (self._stop_run.is_set() or self._closed):
            yield from self.poll(timeout=0.5)

    def run(self, handler: Callable[[KmqMessage], Any], workers: int = 1, poll_timeout: float = 0.5) -> None:
        """Call ``handler(msg)`` on a pool of ``workers`` threads until :meth:`stop`.

        Out of order, no head-of-line blocking inside a partition. A handler
        that returns acks the message (unless it settled it itself); an
        exception nacks it with the queue's backoff for its delivery count.
        On stop, handlers already running finish and queued messages are
        nacked (delay 0) for immediate redelivery."""
        backoff = self.queue.backoff
        pending: set[KmqMessage] = set()
        plock = threading.Lock()

        def call(msg: KmqMessage) -> None:
            with plock:
                if msg not in pending or self._stop_run.is_set():
                    return  # stopping: not started handlers do not start; nacked below
                pending.discard(msg)
            try:
                handler(msg)
            except Exception as exc:
                delay = backoff.delay(msg.delivery_count)
                log.warning("handler failed on %s/%d/%d (%s: %s); nacked, redelivery in %.3gs",
                            msg.topic, msg.partition, msg.offset, type(exc).__name__, exc, delay)
                try:
                    msg.nack(delay)
                except MessageAlreadySettled:
                    pass
                return
            if msg._outcome is None:
                try:
                    msg.ack()
                except MessageAlreadySettled:
                    pass

        pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=f"kmq-worker-{self.queue.name}")
        try:
            while not (self._stop_run.is_set() or self._closed):
                for msg in self.poll(timeout=poll_timeout):
                    with plock:
                        pending.add(msg)
                    pool.submit(call, msg)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            with plock:
                left, pending = list(pending), set()
            for msg in left:
                try:
                    msg.nack(0.0)
                except MessageAlreadySettled:
                    pass
            if left:
                log.info("%s: stopped with %d queued message(s); nacked for immediate redelivery", self.queue.name, len(left))

    # ------------------------------------------------------------ fetcher thread
    def _fetch_loop(self) -> None:
        kc = self._kc
        pending: deque[_Pending] = deque()
        try:
            kc.subscribe([self.queue.name], listener=_Listener(self))
            gauge_at = 0.0
            full_since: float | None = None
            while not self._stop.is_set():
                self._advance(kc, pending)
                with self._cond:
                    queued = len(self._ready)
                full = queued >= self.prefetch or queued + len(pending) >= self.prefetch + self.pipeline
                now = time.monotonic()
                if now >= gauge_at:
                    gauge_at = now + 0.5
                    with self._lock:
                        snapshot = dict(self._inflight)  # zeros included, so a drained partition shows 0
                    for p, n in snapshot.items():
                        self.metrics.in_flight.labels(self.queue.name, str(p)).set(n)
                if not full:
                    full_since = None
                elif full_since is None:
                    full_since = now
                if full and now - full_since < self.BACKPRESSURE_POLL:
                    # The application is behind: wait for it (or for a commit) without polling.
                    with self._cond:
                        if len(self._ready) >= queued:
                            self._cond.wait(0.002 if pending else 0.02)
                    continue
                # Behind for a while: keep polling with every partition paused, so heartbeats
                # and rebalances go on (pausing drops buffered fetches, so not on every blip).
                self._apply_pauses(kc, full)
                # Short timeouts while batches are between START and hand-over, so they move on soon.
                timeout_ms = 5 if pending else 10 if full else 100
                records = kc.poll(timeout_ms=timeout_ms, max_records=self.fetch_size)
                batch = self._take(kc, records) if records else None
                if batch is not None:
                    pending.append(batch)
        except (KmqError, KafkaError) as exc:
            self._fail(exc)
        except Exception as exc:  # a bug: surface it to the application instead of dying silently
            log.exception("fetcher of %s failed", self.queue.name)
            self._fail(exc)
        finally:
            for b in pending:  # START may exist, nothing handed over: let the tracker redeliver now
                self._nack_all(b.messages)
            self._drop_ready(None, "the consumer is closing")
            self._close_kafka_consumer()

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, KafkaError) and not isinstance(exc, KmqError):
            wrapped = clients.classify(self.cfg.kafka, exc) or BrokerUnavailable(
                f"consuming {self.queue.name} failed: {type(exc).__name__}: {exc}")
            wrapped.__cause__ = exc
            exc = wrapped
        log.error("%s: %s", self.queue.name, exc)
        with self._cond:
            self._error = exc
            self._stop.set()
            self._cond.notify_all()

    def _close_kafka_consumer(self) -> None:
        try:
            self._kc.close()  # leaves the group (auto-commit is off: nothing else committed)
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.warning("closing the Kafka consumer of %s failed: %s", self.queue.name, exc)

    def _apply_pauses(self, kc: Any, all_paused: bool) -> None:
        """Pause partitions at the in-flight cap (or all, under backpressure); resume the rest."""
        paused = {tp for tp in kc.paused()}
        if all_paused:
            want = set(kc.assignment())
        else:
            with self._lock:
                full = {p for p, n in self._inflight.items() if n >= self.cap}
            if not full and not paused:
                return
            want = {tp for tp in kc.assignment() if tp.partition in full}
        if want - paused:
            kc.pause(*(want - paused))
        if paused - want:
            kc.resume(*(paused - want))

    def _take(self, kc: Any, records: dict) -> "_Pending | None":
        """Cap the polled records, count them in flight and send their STARTs (no wait)."""
        offsets: dict[int, list[int]] = {}
        kept: list = []
        with self._lock:
            room = {tp.partition: self.cap - self._inflight[tp.partition] for tp in records}
        for tp, recs in records.items():
            allowed = room[tp.partition]
            if allowed < len(recs):
                # Over the cap: take what fits, fetch the rest again after acks drain the partition.
                kc.seek(tp, recs[max(allowed, 0)].offset)
                recs = recs[: max(allowed, 0)]
            if recs:
                offsets[tp.partition] = [r.offset for r in recs]
                kept.append(recs)
        if not kept:
            return None
        spans = {p: (o[0], o[-1]) for p, o in offsets.items()}
        if self._hook:
            self._hook("polled", spans)
        member = _member_id(kc)
        if member:
            self.writer.owner = member[:255]
        lock = self._lock
        messages = [
            KmqMessage(r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp, self, lock)
            for recs in kept
            for r in recs
        ]
        with lock:
            for p, offs in offsets.items():
                self._inflight[p] += len(offs)
        b = _Pending(messages, offsets, spans, time.perf_counter())
        try:
            b.futures = self.writer.send_starts(offsets)
        except MarkerWriteError:
            self._forget(messages)
            raise
        return b

    def _forget(self, messages: list[KmqMessage]) -> None:
        """Messages never handed over and never to be: out of the in-flight count, no marker."""
        for m in messages:
            try:
                m.abandon()
            except MessageAlreadySettled:
                pass

    def _nack_all(self, messages: list[KmqMessage]) -> None:
        for m in messages:
            try:
                m.nack(0.0)
            except MessageAlreadySettled:
                pass

    def _advance(self, kc: Any, pending: "deque[_Pending]") -> None:
        """Move finished steps along, oldest batch first: START acknowledged ->
        commit (acknowledged) -> hand over. Commits are sent one at a time, in order."""
        while pending:
            b = pending[0]
            if b.commit is None:
                if not all(f.is_done for _, _, f in b.futures):
                    return
                try:
                    self.writer.wait_starts(b.futures, timeout=0)
                except MarkerWriteError:
                    pending.popleft()
                    self._forget(b.messages)  # not committed, not handed: the group delivers them again
                    raise
                self.metrics.marker_write_seconds.observe(time.perf_counter() - b.t0)
                if self._hook:
                    self._hook("started", b.spans)
                revoked = self._revoked_parts & set(b.offsets)
                if revoked:
                    pending.popleft()
                    log.info("%s: partitions %s revoked before the commit; %d started message(s) nacked for "
                             "redelivery", self.queue.name, sorted(revoked), len(b.messages))
                    self._nack_all(b.messages)
                    continue
                offsets = {
                    TopicPartition(self.queue.name, p): OffsetAndMetadata(o[-1] + 1, "", -1) for p, o in b.offsets.items()
                }
                b.commit = kc.commit_async(offsets)
            if not b.commit.is_done:
                return
            pending.popleft()
            if b.commit.failed():
                log.warning("%s: committing offsets %s failed (%s); %d started message(s) nacked for redelivery "
                            "instead of being handed over", self.queue.name, b.spans, b.commit.exception, len(b.messages))
                self._nack_all(b.messages)
                continue
            if self._hook:
                self._hook("committed", b.spans)
            self._hand_over(b.messages, b.sent_at)

    def _hand_over(self, messages: list[KmqMessage], started_at: float) -> None:
        if self._schedule is not None:
            now = started_at
            with self._lock:
                for m in messages:
                    if m._outcome is None:
                        self._schedule.track((m.partition, m.offset), now)
        self.writer._c_received.inc(len(messages))
        with self._cond:
            self._ready.append(messages)
            self._cond.notify_all()

    def _revoked(self, partitions: set[int]) -> None:
        # Runs on kafka-python's network thread: touch only thread-safe state.
        self._revoked_parts = frozenset(self._revoked_parts | partitions)
        if partitions:
            self._drop_ready(partitions, f"partitions {sorted(partitions)} were revoked")

    def _drop_ready(self, partitions: set[int] | None, why: str) -> None:
        """NACK (delay 0) ready-but-not-handed messages of ``partitions`` (None = all)."""
        dropped: list[KmqMessage] = []
        with self._cond:
            keep: deque[list[KmqMessage]] = deque()
            for batch in self._ready:
                if partitions is None:
                    dropped.extend(batch)
                    continue
                rest = [m for m in batch if m.partition not in partitions]
                dropped.extend(m for m in batch if m.partition in partitions)
                if rest:
                    keep.append(rest)
            self._ready = keep
            self._cond.notify_all()
        for m in dropped:
            try:
                m.nack(0.0)
            except MessageAlreadySettled:
                pass
        if dropped:
            log.info("%s: %s; %d prefetched message(s) nacked for immediate redelivery by the tracker",
                     self.queue.name, why, len(dropped))
            self.writer.flush_buffer()
