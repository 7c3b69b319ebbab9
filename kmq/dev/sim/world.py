"""One schedule: a queue, its markers and DLQ on a :class:`SimCluster`, and the actors that use them.

The actors are driven one at a time by :meth:`World.run`, each when its wake
time comes, as threads of separate processes would be, but in one thread on
the virtual clock (a call that waits, a START acknowledgement or the
tracker's flush, holds the others up meanwhile: time still passes for the
broker and its faults, not for the other actors).

* :class:`Producer`: sends the workload's messages (value ``m00042``) and sends
  again what was not acknowledged (an application producer with retries);
  under an :class:`~kmq.dev.sim.faults.OpenTransaction` it writes its next
  messages in a transaction, committed or aborted (those messages given up)
  when the fault ends;
* :class:`~kmq.dev.sim.worker.Worker`: a kmq consumer: the real fetch
  pipeline (START markers per partition, acknowledged before the commit,
  committed before the hand-over; reading ``read_uncommitted`` as
  kafka-python does, or in some seeds ``read_committed`` as librdkafka
  does), then each delivery settled as the
  workload draws it: END, NACK, REJECT, nothing (the lease lapses), or a
  crash (it loses what it holds and comes back later, from the commits);
* :class:`TrackerActor`: the real :class:`tracker.redeliver.Redeliverer` and
  :class:`kmq.core.lease_state.PartitionState`, fed by the markers topic read
  on the cluster, producing copies, dead letters and CLOSED markers through a
  :class:`SimProducer` and reading the queue through a log reader (a
  :class:`SimLogReader` unless the search plants another).
"""

from __future__ import annotations

import random
from typing import Any, Callable

from prometheus_client import CollectorRegistry

from kmq.client.api import READ_COMMITTED, READ_UNCOMMITTED
from kmq.config import Config, QueueConfig
from kmq.core.lease_state import PartitionState
from kmq.core.markers import BadMarker, decode_record
from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.consumer import SimConsumer
from kmq.dev.sim.faults import OpenTransaction
from kmq.dev.sim.producer import SimDelivery, SimProducer
from kmq.dev.sim.reader import SimLogReader
from kmq.dev.sim.tracker_loop import ServiceTrackerActor
from kmq.dev.sim.violation import Violation
from kmq.dev.sim.worker import KeyedDone, Worker
from kmq.dev.sim.workload import GROUP, QUEUE, SERVICE, Workload, message_id
from kmq.telemetry.metrics import TrackerMetrics
from tracker.redeliver import Redeliverer, delivery_timeout_s, send_wait_s

__all__ = ["World", "Worker", "Producer", "TrackerActor", "QUEUE", "GROUP", "message_id", "queue_config"]

TRACKER = "tracker"
TRACKER_READER = "tracker-reader"
# The tracker sizes its producer from the topics' max.message.bytes (copy_request_size_for); the simulated
# topics report none and take any record, so tracker.max_request_size sizes it for the largest the fault
# plan writes (2 MiB).
TRACKER_REQUEST_SIZE = 4 * 1024 * 1024


def queue_config(w: Workload) -> Config:
    """The kmq configuration of the simulated queue (what the tracker and the workers are given)."""
    return Config.from_dict({
        "kafka": {"bootstrap_servers": "sim:9092", "session_timeout": "10s", "heartbeat_interval": "1s"},
        "queues": [{"name": QUEUE, "lease": f"{int(w.lease * 1000)}ms", "max_deliveries": w.max_deliveries,
                    "backoff": {"initial": "200ms", "max": "2s", "multiplier": 2.0}}],
        "tracker": {"tick": "50ms", "http_port": 0, "group_id": f"{TRACKER}-group",
                    "max_request_size": TRACKER_REQUEST_SIZE},
    })


class _Actor:
    name: str
    interval: float
    wake: float = 0.0

    def step(self) -> None:  # pragma: no cover - every actor has its own
        raise NotImplementedError

    def busy(self) -> bool:
        """Whether the actor still has work it knows of (for quiescence)."""
        return False


class Producer(_Actor):
    """Sends each message at its time; resends the ones whose send failed, until acknowledged."""

    interval = 0.05

    def __init__(self, world: "World", times: list[float]) -> None:
        self.world = world
        self.name = "app-producer"
        self.client = SimProducer(world.cluster, self.name, delivery_timeout=10.0)
        self._todo = [(t, f"m{i:05d}") for i, t in enumerate(times)]
        self._sent: list[tuple[str, SimDelivery]] = []
        self.acked: set[str] = set()
        self._transactions = [f for f in world.cluster.faults.of(OpenTransaction) if f.topic == QUEUE]
        self._open = 0  # transactions begun and not ended

    def step(self) -> None:
        now = self.world.cluster.t()
        while self._transactions and self._transactions[0].at <= now:
            self._transact(self._transactions.pop(0))
        while self._todo and self._todo[0][0] <= now:
            _, mid = self._todo.pop(0)
            self._send(mid)
        unsettled = []
        for mid, fut in self._sent:
            if not fut.is_done:
                unsettled.append((mid, fut))
            elif fut.exception is not None:
                self.world.note(mid, f"produce failed ({fut.exception}); sending again")
                self._send(mid, unsettled)
            else:
                self.acked.add(mid)
                self.world.note(mid, f"produce acked {QUEUE}[{fut.value.partition}]@{fut.value.offset}")
        self._sent = unsettled

    def _send(self, mid: str, into: list | None = None) -> None:
        fut = self.client.send(QUEUE, value=mid.encode(), key=self.world.workload.key_of(mid, self.world.ordered))
        (self._sent if into is None else into).append((mid, fut))

    def _transact(self, f: OpenTransaction) -> None:
        """Write the next ``f.records`` messages in one transaction now; end it at ``f.until``."""
        c, w = self.world.cluster, self.world
        mids = [mid for _, mid in self._todo[:f.records]]
        del self._todo[:len(mids)]
        if not mids:
            c.record(f"world {self.name}: nothing left to send in a transaction")
            return
        txn = c.begin_transaction(self.name)
        self._open += 1
        then = "commit" if f.commit else "abort"
        for mid in mids:
            offset = c.append(QUEUE, f.partition, w.workload.key_of(mid, w.ordered), mid.encode(), source=self.name,
                              txn=txn)
            w.note(mid, f"produce in transaction {txn}: {QUEUE}[{f.partition}]@{offset}, open until "
                        f"t={f.until:g}s, then {then}")

        def end() -> None:
            markers = c.end_transaction(txn, f.commit)
            self._open -= 1
            where = ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(markers.items()))
            for mid in mids:
                if f.commit:
                    self.acked.add(mid)
                w.note(mid, f"transaction {txn} {'committed' if f.commit else 'aborted (message given up)'}, "
                            f"marker at {where}")

        c.clock.call_at(c.clock.now() + max(0.0, f.until - c.t()), end)

    def busy(self) -> bool:
        return bool(self._todo or self._sent or self._open)


class TrackerActor(_Actor):
    """The real redelivery step on the simulated cluster (see the module docstring)."""

    interval = 0.05

    def __init__(self, world: "World", reader: Any) -> None:
        self.world = world
        self.name = TRACKER
        c, q, cfg = world.cluster, world.queue, world.config
        self.consumer = SimConsumer(c, TRACKER)
        self.consumer.assign([(q.markers_topic, p) for p in range(world.workload.partitions)])
        self.states = {p: PartitionState(q.backoff.delay, q.max_deliveries, max_hold_ms=int(q.max_hold * 1000))
                       for p in range(world.workload.partitions)}
        self.metrics = TrackerMetrics(CollectorRegistry())

        def new_producer(compression: str = "none") -> SimProducer:  # the simulated log keeps records, not batches
            return SimProducer(c, TRACKER, delivery_timeout=delivery_timeout_s(cfg.kafka),
                               max_request_size=TRACKER_REQUEST_SIZE)

        self.redeliverer = Redeliverer(new_producer(), reader, self.metrics, clock_ms=c.clock.now_ms,
                                       send_timeout_s=send_wait_s(cfg.kafka), max_request_size=TRACKER_REQUEST_SIZE,
                                       new_producer=new_producer)
        self.max_in_flight: dict[int, int] = {}  # partition -> most offsets open at once

    def step(self) -> None:
        c = self.world.cluster
        for rec in self.consumer.fetch(0.0, 5000):
            state = self.states[rec.partition]
            marker = decode_record(rec.key, rec.value, rec.partition)
            if isinstance(marker, BadMarker):
                c.record(f"world tracker skips a bad marker at {rec.partition}@{rec.offset}: {marker.reason}")
                state.skip(rec.offset)
            else:
                state.apply(marker, rec.offset, rec.timestamp)
        for p, state in sorted(self.states.items()):
            items = state.due(c.clock.now_ms(), limit=5000)
            if items:
                report = self.redeliverer.process(self.world.queue, p, state, items)
                c.record(f"world tracker {QUEUE}[{p}]: {report.redelivered} copied, {report.dead_lettered} "
                         f"dead-lettered, {report.missing} missing, {report.deferred} deferred, {report.failed} failed")
            self.max_in_flight[p] = max(self.max_in_flight.get(p, 0), state.in_flight)

    def busy(self) -> bool:
        return any(s.in_flight for s in self.states.values())


class World:
    """One seed's schedule: the cluster, the topics, the actors and the per-message notes.

    :param reader: makes the tracker's log reader from the cluster (the search plants defects here).
    :param config: the kmq configuration the tracker and the workers are given (default:
        :func:`queue_config` of ``workload``; another must keep its queue).
    """

    def __init__(self, cluster: SimCluster, workload: Workload, seed: int,
                 reader: Callable[[SimCluster], Any] | None = None, config: Config | None = None) -> None:
        self.cluster = cluster
        self.workload = workload
        self.rng = random.Random(f"world-{seed}")
        self.config = config or queue_config(workload)
        self.queue: QueueConfig = self.config.queues[0]
        for topic in (QUEUE, self.queue.markers_topic, self.queue.dlq_topic):
            cluster.create_topic(topic, workload.partitions)
        self.notes: dict[str, list[str]] = {}
        # consumer.ordering: key in this schedule (drawn on a stream of its own: other seeds keep their runs)
        self.ordered = random.Random(f"ordering-{seed}").random() < workload.ordering_share
        # consumer.hand_over: started (not with ordering: key, which the config refuses); a stream of its own too
        self.hand_over_started = (not self.ordered and random.Random(f"hand-over-{seed}").random()
                                  < workload.hand_over_started_share)
        # The workers' isolation level: read_committed as librdkafka's default (kafka.client: confluent) in
        # this share of the seeds, else kafka-python's read_uncommitted (a stream of its own)
        self.worker_isolation = (READ_COMMITTED if random.Random(f"isolation-{seed}").random()
                                 < workload.read_committed_share else READ_UNCOMMITTED)
        self.done: list[KeyedDone] = []  # what handlers acked or rejected, in order (ordering: key)
        self.released: set[tuple[str, int, bytes | None]] = set()  # (owner, partition, key) given up on
        self.started: dict[int, set[int]] = {p: set() for p in range(workload.partitions)}
        #: Violations an actor saw as they happened (the invariants read the end state; these, the moment).
        self.breaches: list[Violation] = []
        self.producer = Producer(self, workload.send_times(self.rng))
        self.workers = [Worker(self, f"w{i}") for i in range(workload.workers)]
        make_reader = reader or (lambda cl: SimLogReader(cl, TRACKER_READER))
        self.tracker: TrackerActor | ServiceTrackerActor
        if workload.tracker_loop == SERVICE:
            self.tracker = self._service_tracker(make_reader(cluster))
        else:
            self.tracker = TrackerActor(self, make_reader(cluster))
        self.actors: list[_Actor] = [self.producer, *self.workers, self.tracker]  # type: ignore[list-item]  # duck-typed actors

    def _service_tracker(self, reader: Any) -> ServiceTrackerActor:
        w = self.workload
        crash_at = (round(self.rng.uniform(0.0, w.produce_over * 2), 6)
                    if self.rng.random() < w.tracker_crash_chance else None)
        return ServiceTrackerActor(self, reader, SimLogReader(self.cluster, TRACKER_READER), TRACKER, crash_at=crash_at)

    def breach(self, v: Violation) -> None:
        """An actor saw ``v`` happen (at most a few of each kind are kept: one proves it)."""
        if sum(b.invariant == v.invariant for b in self.breaches) < 3:
            self.breaches.append(v)
        self.cluster.record(f"world breach {v.invariant}: {v.detail}")

    def note(self, mid: str | None, text: str) -> None:
        """One line of a message's history (also in the cluster's history, so in the digest)."""
        line = f"{self.cluster.t():.6f} {text}"
        if mid is not None:
            self.notes.setdefault(mid, []).append(line)
        self.cluster.record(f"world {mid or '-'}: {text}")

    # ------------------------------------------------------------ driving
    def run(self, until: float, quiet_after: float, max_steps: int) -> tuple[bool, int]:
        """Run the actors until ``until`` (simulated seconds) or until the world is quiet after
        ``quiet_after``; returns (quiet, steps taken)."""
        c = self.cluster
        steps = 0
        next_check = quiet_after
        while steps < max_steps:
            actor = min(self.actors, key=lambda a: (a.wake, self.actors.index(a)))
            if actor.wake >= until:
                break
            if actor.wake > c.t():
                c.clock.run_until(c.clock.now() + (actor.wake - c.t()))
            thaw = c.faults.frozen_until(actor.name, c.t())
            if thaw is not None:
                actor.wake = thaw + 1e-6  # past the clock's microsecond rounding: thawed then
                steps += 1
                continue
            actor.step()
            steps += 1
            actor.wake = c.t() + actor.interval
            if c.t() >= next_check:
                if self.quiet():
                    return True, steps
                next_check = c.t() + 1.0
        return self.quiet(), steps

    def quiet(self) -> bool:
        """Nothing left to do: every send settled, every delivery settled, every partition consumed
        and committed (past every record the workers are handed: a commit or abort marker at the
        end is never handed, nor, read committed, an aborted record), nothing open in the tracker."""
        if any(a.busy() for a in self.actors):
            return False
        for p in range(self.workload.partitions):
            plog = self.cluster.log(QUEUE, p)
            committed = self.cluster.groups.committed(GROUP, (QUEUE, p)) or 0
            if (plog.open_transactions() or committed < plog.log_start < plog.high_water
                    or plog.read(committed, plog.high_water, self.worker_isolation)):
                return False
            if (self.tracker.states[p].position or 0) < self.cluster.log(self.queue.markers_topic, p).high_water:
                return False
        return True
