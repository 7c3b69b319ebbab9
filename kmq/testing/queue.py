""":class:`TestQueue`: one kmq queue on an in-memory cluster, with its tracker, on a virtual clock.

The consumers a test gets from it are kmq's own (:class:`~kmq.consumer.consumer.KmqConsumer`,
:class:`~kmq.consumer.aio.AsyncKmqConsumer`, :class:`~kmq.share.ShareConsumer`) and the
tracker is :class:`tracker.service.Tracker`, built over the simulated cluster's clients
(:class:`~kmq.testing.clients.SimClients`, passed in through their ``clients=``
parameter): START before hand-over, the marker writer, the handler outcome rule of
``run()``, the tracker's redelivery, backoff and dead-lettering all run as in
production. What a test reads back (``acked``, ``nacked``, ``dead_letters``, ...) is
decoded from the topics they wrote (:mod:`kmq.testing.results`).

Time: the consumers' threads run in real time (milliseconds here); the cluster's
clock, which stamps the markers and on which the tracker judges leases, delays and
backoff, moves only in :meth:`TestQueue.advance` and in ``run(..., for_seconds=)`` /
:meth:`TestQueue.run_until_settled`, straight to the tracker's next due time.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import zlib
from typing import Any, Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry

from kmq.config import Config, QueueConfig
from kmq.consumer.aio import AsyncKmqConsumer
from kmq.consumer.consumer import KmqConsumer
from kmq.core.errors import KmqError
from kmq.core.markers import End, Nack, Reject
from kmq.core.message import KmqMessage, delivery_count_of
from kmq.dev.sim import SimCluster
from kmq.dev.sim.clock import to_us
from kmq.share import ShareConsumer
from kmq.testing.clients import SharedCluster, SimClients
from kmq.testing.results import DeadLetter, Delivered, Nacked, QueueView, Rejected
from tracker.service import Tracker

__all__ = ["TestQueue", "TestQueueError"]

log = logging.getLogger(__name__)

#: Longest single move of the virtual clock: consumers poll between moves, so the group never sees
#: a member silent for longer than this (its max.poll.interval is 300 s).
_MAX_JUMP_S = 10.0
#: Real seconds an open consumer gets to poll once after the clock moved.
_POLL_WAIT_S = 0.5
#: With ``consumer.ordering: key``, real seconds held messages must stand still before run() takes them
#: for waiting on a copy (a key released meanwhile is handed out within milliseconds).
_HELD_STILL_S = 0.1
_BOOTSTRAP = "kmq-testing:9092"  # never dialled: every client is the simulated cluster's


class TestQueueError(KmqError):
    """A :class:`TestQueue` could not do what a test asked (a handler that never finished, a queue
    not settled within the time limit); the message says what was left and what to change."""

    __test__ = False  # not a pytest test class, though a test module imports it


class _NoPauses:
    """The tracker's pause watch on a virtual clock: a jump of the clock is no frozen process."""

    def start(self) -> None:
        """Nothing to watch."""

    def stop(self) -> None:
        """Nothing to stop."""

    def longest_since(self, since: float) -> float:
        return 0.0


class _Running:
    """How many handler calls are under way (a context manager around each)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0

    def __enter__(self) -> None:
        with self._lock:
            self._n += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._n -= 1

    def idle(self) -> bool:
        with self._lock:
            return self._n == 0


def _queue_config(name: str, group_id: str, settings: Mapping[str, Any]) -> Config:
    return Config.from_dict({
        "kafka": {"bootstrap_servers": _BOOTSTRAP},
        "queues": [{"name": name, **settings}],
        # Settlements reach the markers topic within a few real milliseconds.
        "consumer": {"group_id": group_id, "ack_flush_interval": "5ms"},
        "tracker": {"http_port": 0},
    })


class TestQueue:
    """One queue (its topic, markers and DLQ topics) on an in-memory cluster, with a running tracker.

    ::

        q = TestQueue("orders", max_deliveries=3)
        q.produce(b"order-1", key=b"k1")
        q.run(handle, reject_on=BadPayload)
        assert q.acked == [b"order-1"]
        q.close()

    :param name: the queue (topic) name.
    :param partitions: partitions of the queue topic (and of its markers topic).
    :param config: a whole kmq :class:`~kmq.config.Config` instead (``kafka`` settings are not used:
        every client is the simulated cluster's); its queue ``name`` (or its only queue) is the one tested.
    :param group_id: the consumers' group.
    :param queue_settings: ``queues[]`` keys of the queue (``lease``, ``max_deliveries``, ``backoff``, ...),
        as in kmq.yaml: ``TestQueue("orders", max_deliveries=3, backoff={"initial": "5s"})``.
    """

    __test__ = False  # a library class, not a pytest test class

    def __init__(self, name: str = "orders", *, partitions: int = 1, config: Config | None = None,
                 group_id: str = "kmq-test-workers", **queue_settings: Any) -> None:
        if config is None:
            config = _queue_config(name, group_id, queue_settings)
        elif queue_settings:
            raise TestQueueError(f"pass either config or queue settings ({', '.join(queue_settings)}), not both")
        self.config = config
        self.queue: QueueConfig = _pick(config, name)
        self.cluster = SimCluster(start_s=time.time())  # record timestamps look like today's
        self.shared = SharedCluster(self.cluster)
        self.clients = SimClients(self.shared)
        with self.shared.use() as c:
            for topic in (self.queue.name, self.queue.markers_topic, self.queue.dlq_topic):
                c.create_topic(topic, partitions)
        self._opened: list[Callable[[], KmqConsumer | None]] = []  # the KmqConsumers handed out, or under them
        self._closers: list[Callable[[], None]] = []
        self._round_robin = itertools.count()
        self._failed: list[BaseException] = []  # what the run() under way raised
        self._running = _Running()  # handler calls of the run() under way
        clock = self.cluster.clock
        self.tracker = Tracker(config, registry=CollectorRegistry(), clock=clock.now, clients=self.clients,
                               monotonic=clock.monotonic, pauses=_NoPauses())
        self.tracker.open(serve_http=False)
        self._closed = False

    # ------------------------------------------------------------ producing
    def produce(self, value: bytes | None, key: bytes | None = None, *, partition: int | None = None,
                headers: Sequence[tuple[str, bytes | None]] | None = None) -> Delivered:
        """Write a message to the queue topic now (as an application's producer would)."""
        with self.shared.use() as c:
            counts = c.partition_counts()[self.queue.name]
            if partition is None:  # as SimProducer: same key, same partition; unkeyed round-robin
                partition = (zlib.crc32(key) if key is not None else next(self._round_robin)) % counts
            offset = c.append(self.queue.name, partition, key, value, list(headers or ()), source="test")
        return Delivered(value, key, partition, offset, delivery_count_of(list(headers or ())), tuple(headers or ()))

    # ------------------------------------------------------------ consumers
    def consumer(self, **kwargs: Any) -> KmqConsumer:
        """A :class:`~kmq.consumer.consumer.KmqConsumer` of the queue (``kwargs``: its keyword
        arguments). Close it (or leave its ``with``) before reading results; :meth:`close` closes it too."""
        c = KmqConsumer(self.config, self.queue.name, clients=self.clients, **kwargs)
        self._opened.append(lambda: c)
        self._closers.append(c.close)
        return c

    def async_consumer(self, **kwargs: Any) -> AsyncKmqConsumer:
        """A :class:`~kmq.aio.AsyncKmqConsumer` of the queue; use it with ``async with``."""
        c = AsyncKmqConsumer(self.config, self.queue.name, clients=self.clients, **kwargs)
        self._opened.append(lambda: _started(c))
        return c

    def share_consumer(self, config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> ShareConsumer:
        """A :class:`~kmq.share.ShareConsumer` (confluent-kafka's share-consumer API on kmq); call
        ``subscribe([queue name])`` as with the real one. ``config``: the native dict; ``bootstrap.servers``
        and ``group.id`` default to the test queue's. The tracker applies the test queue's
        ``max_deliveries`` and ``backoff``; ``kmq.lease.ms`` and the like go in ``config``."""
        clients, opened = self.clients, self._opened

        def open_queue(cfg: Config, topic: str, max_records: int) -> KmqConsumer:
            c = KmqConsumer(cfg, topic, batch_size=max_records, clients=clients)
            opened.append(lambda: c)
            return c

        cls = type("TestShareConsumer", (ShareConsumer,), {"open_queue": staticmethod(open_queue)})
        conf = {"bootstrap.servers": _BOOTSTRAP, "group.id": self.config.consumer.group_id, **(config or {}), **kwargs}
        consumer: ShareConsumer = cls(conf)
        self._closers.append(consumer.close)
        return consumer

    # ------------------------------------------------------------ running handlers
    def run(self, handler: Callable[[KmqMessage], Any], *, reject_on: Any = (), workers: int = 1,
            for_seconds: float = 0.0, timeout: float = 30.0) -> None:
        """``KmqConsumer.run(handler, reject_on=...)`` until the queue is quiet: every message
        there is now handled and its settlement applied by the tracker, and what the tracker
        redelivers at once (a ``nack()`` without delay) handled too. With ``for_seconds``, the
        virtual clock then moves that far, redeliveries due meanwhile being handled as they come.
        ``timeout``: real seconds the handler may take in all (:class:`TestQueueError` past it)."""
        self._run(handler, reject_on, workers, timeout, lambda c: self._advance(for_seconds, [c], timeout))

    def run_until_settled(self, handler: Callable[[KmqMessage], Any], *, reject_on: Any = (), workers: int = 1,
                          limit: float = 86_400.0, timeout: float = 30.0) -> None:
        """Like :meth:`run`, moving the virtual clock to each redelivery until nothing is in flight
        (every message acked or dead-lettered), within ``limit`` virtual seconds
        (:class:`TestQueueError` past it): ``max_deliveries`` and backoff run their course."""
        def settle(c: KmqConsumer) -> None:
            end = self.cluster.clock.monotonic() + limit
            while (due := self.tracker.next_due_s()) is not None:
                if self.cluster.clock.monotonic() + due > end:
                    raise TestQueueError(f"messages of {self.queue.name} are still in flight after {limit:g} "
                                         "virtual seconds: a handler that never acks, or a limit too short")
                self._move(to_us(max(due, 0.001)), [c], timeout)
        self._run(handler, reject_on, workers, timeout, settle)

    def _run(self, handler: Callable[[KmqMessage], Any], reject_on: Any, workers: int, timeout: float,
             then: Callable[[KmqConsumer], None]) -> None:
        consumer = KmqConsumer(self.config, self.queue.name, clients=self.clients, batch_size=max(workers, 10))
        failed: list[BaseException] = []
        running = self._running

        def handle(msg: KmqMessage) -> Any:
            with running:
                return handler(msg)

        def target() -> None:
            try:
                consumer.run(handle, workers=workers, poll_timeout=0.05, reject_on=reject_on)
            except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
                failed.append(exc)

        thread = threading.Thread(target=target, name="kmq-testing-run", daemon=True)
        self._failed = failed
        thread.start()
        try:
            self._until_quiet([consumer], timeout)
            then(consumer)
        finally:
            self._failed = []
            consumer.stop()
            thread.join(timeout)
            consumer.close()
        if failed:
            raise failed[0]
        self.settle()

    # ------------------------------------------------------------ time
    def advance(self, seconds: float) -> None:
        """Move the virtual clock ``seconds`` on: the tracker redelivers what falls due (lapsed
        leases, nacks whose delay ends, backoff) and dead-letters what has had ``max_deliveries``.
        Settlements already made are applied first. Open consumers keep fetching meanwhile; a
        message one of them holds past its lease is redelivered, as a stalled handler's would be."""
        self._advance(seconds, [], 30.0)

    def settle(self) -> None:
        """Write the open consumers' settlements and let the tracker apply them (and redeliver what is
        due now), without moving the clock. Results read after it include every settlement made."""
        for c in self._open_consumers():
            c.writer.flush(5.0)
        self._tracker_caught_up(time.monotonic() + 10.0)

    def _advance(self, seconds: float, running: list[KmqConsumer], timeout: float) -> None:
        clock = self.cluster.clock
        end = clock.now_us() + to_us(max(0.0, seconds))
        self.settle()
        while (left := end - clock.now_us()) > 0:
            due = self.tracker.next_due_s()  # recomputed after each move: settlements change it
            step = left if due is None else to_us(due)
            self._move(min(left, max(step, 1_000)), running, timeout)  # due now still moves 1 ms: progress

    def _move(self, us: int, running: list[KmqConsumer], timeout: float) -> None:
        """One move of the clock (at most :data:`_MAX_JUMP_S`), then what it made due: the consumers
        poll, the tracker redelivers, and the ``running`` consumers handle what came."""
        with self.shared.use() as c:
            c.clock.advance(max(1, min(us, to_us(_MAX_JUMP_S))) / 1_000_000)
        self._polled_once()
        self.settle()
        if running:
            self._until_quiet(running, timeout)

    def _polled_once(self) -> None:
        """Give every consumer that is fetching one poll at the new time (the group sees it alive)."""
        members = [m for m in self.clients.consumers
                   if m.group_id != self.config.tracker.group_id and m.open and m.fetches]
        before = [m.fetches for m in members]
        deadline = time.monotonic() + _POLL_WAIT_S
        for m, n in zip(members, before):
            while m.fetches == n and m.open and time.monotonic() < deadline:
                self.shared.wait_for_change(self.shared.changes(), 0.005)

    def _tracker_caught_up(self, deadline: float) -> None:
        """Step the tracker until it has applied every marker written so far."""
        while True:
            self.tracker.step(0.0)
            if self._markers_read() and self.tracker.ready()[0]:
                self.tracker.step(0.0)  # what the markers made due now
                return
            if time.monotonic() > deadline:
                raise TestQueueError(f"the tracker did not catch up with the markers of {self.queue.name}")

    def _markers_read(self) -> bool:
        tracker_members = [m for m in self.clients.consumers if m.group_id == self.config.tracker.group_id]
        with self.shared.use() as c:
            ends = {p: c.log(self.queue.markers_topic, p).high_water
                    for p in range(c.partition_counts()[self.queue.markers_topic])}
        for m in tracker_members:
            if not m.open:
                continue
            for p, end in ends.items():
                pos = m.position(self.queue.markers_topic, p)
                if pos is None or pos < end:
                    return False
        return True

    def _until_quiet(self, running: list[KmqConsumer], timeout: float) -> None:
        """Wait (real time) until the ``running`` consumers have taken and settled everything in the
        queue, the tracker applied it, and nothing it redelivered at once is left."""
        deadline = time.monotonic() + timeout
        held_since: tuple[tuple[Any, ...], float] | None = None  # ordering: key: what stood still, and since when
        while True:
            seen = self.shared.changes()
            if self._failed:
                return  # raised by _run
            # Settled first, then applied: settle() must start after the last settlement was written.
            held = sum(n for c in running for n in c.in_flight().values())
            if self._running.idle() and self._unsettled() == held:
                if held == 0:
                    self.settle()
                    if self._unsettled() == 0 and self.tracker.next_due_s() != 0.0:
                        return
                elif self.config.consumer.ordering == "key" and self.tracker.next_due_s():
                    # Messages of a key wait for an earlier message's copy, which only a move of the
                    # clock brings: quiet once that stood still for a moment (real time).
                    state = (held, self._log_ends())
                    if held_since is None or held_since[0] != state:
                        held_since = (state, time.monotonic())
                    elif time.monotonic() - held_since[1] >= _HELD_STILL_S:
                        self.settle()
                        return
            if time.monotonic() > deadline:
                per_partition = {p: n for c in running for p, n in c.in_flight().items()}
                raise TestQueueError(f"{self.queue.name} was not quiet within {timeout:g}s (real time): unsettled "
                                     f"messages per partition {per_partition or 'none'}; a handler that blocks, or a "
                                     "timeout too short")
            self.tracker.step(0.0)
            self.shared.wait_for_change(seen + 1, 0.005)

    def _unsettled(self) -> int | None:
        """Records of the queue topic no marker settled yet; None while the consumers' group has not
        committed past every record (some are not fetched yet)."""
        q = self.queue.name
        with self.shared.use() as c:
            committed = c.committed(self.config.consumer.group_id, q)
            settled = {(r.partition, r.offset) for _m, r in self._view().settlements()}
            n = 0
            for p in range(c.partition_counts()[q]):
                plog = c.log(q, p)
                if committed.get(p, 0) < plog.high_water:
                    return None
                n += sum((p, o) not in settled for o in range(plog.log_start, plog.high_water))
        return n

    def _log_ends(self) -> tuple[int, ...]:
        with self.shared.use() as c:
            return tuple(c.log(t, p).high_water for t in (self.queue.name, self.queue.markers_topic)
                         for p in range(c.partition_counts()[t]))

    def _open_consumers(self) -> list[KmqConsumer]:
        return [c for get in self._opened if (c := get()) is not None and not c.stopping]

    # ------------------------------------------------------------ results
    def _view(self) -> QueueView:
        return QueueView(self.cluster, self.queue)

    @property
    def records(self) -> list[Delivered]:
        """Every record of the queue topic (produced messages and redelivered copies), by partition and offset."""
        with self.shared.use():
            return self._view().records()

    def delivery_counts(self, value: bytes) -> list[int]:
        """The delivery counts of the queue's records with ``value`` (1, then one more per copy)."""
        return [r.delivery_count for r in self.records if r.value == value]

    @property
    def acked(self) -> list[bytes | None]:
        """Values of the deliveries an END marker settled (``ack()``, a handler that returned, ``ACCEPT``)."""
        with self.shared.use():
            return [r.value for m, r in self._view().settlements() if isinstance(m, End)]

    @property
    def nacked(self) -> list[Nacked]:
        """Deliveries a NACK settled, with the delay asked for."""
        with self.shared.use():
            return [Nacked(r, m.delay_ms / 1000.0) for m, r in self._view().settlements() if isinstance(m, Nack)]

    @property
    def rejected(self) -> list[Rejected]:
        """Deliveries a REJECT settled, with the reason given."""
        with self.shared.use():
            return [Rejected(r, m.reason) for m, r in self._view().settlements() if isinstance(m, Reject)]

    @property
    def dead_letters(self) -> list[DeadLetter]:
        """The dead-letter topic's records (rejected messages, and those past ``max_deliveries``)."""
        with self.shared.use():
            return self._view().dead_letters()

    @property
    def now(self) -> float:
        """Virtual seconds since the queue was made."""
        return self.cluster.clock.monotonic()

    # ------------------------------------------------------------ ending
    def close(self) -> None:
        """Close what it handed out and the tracker."""
        if self._closed:
            return
        self._closed = True
        errors = []
        for close in reversed(self._closers):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - close everything, report the first failure
                errors.append(exc)
        self.tracker.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> "TestQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TestQueue({self.queue.name!r}, t={self.now:.3f}s)"


def _started(c: AsyncKmqConsumer) -> KmqConsumer | None:
    """The KmqConsumer an AsyncKmqConsumer started (None before ``start()``)."""
    try:
        return c.consumer
    except KmqError:
        return None


def _pick(config: Config, name: str) -> QueueConfig:
    if len(config.queues) == 1:
        return config.queues[0]
    for q in config.queues:
        if q.name == name:
            return q
    raise TestQueueError(f"the configuration has no queue {name!r}; its queues: "
                         f"{', '.join(q.name for q in config.queues)}")
