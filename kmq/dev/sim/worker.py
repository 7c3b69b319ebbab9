"""A kmq worker on the simulated cluster: the real fetch pipeline in a one-thread shell.

:class:`Worker` drives :class:`kmq.consumer.fetch_pipeline.FetchPipeline`, the
state machine :class:`~kmq.consumer.consumer.KmqConsumer`'s fetcher thread
drives, with the same events in the same order (the rebalance callbacks that
ran inside a poll before its records; START answers, the commit's answer and
the time before each poll) and carries out its actions the same way: START
markers per partition for a new batch, the commit of STARTed batches, the
hand-over to the handlers, giving back, seeking back. What differs is the
I/O: simulated clients on the virtual clock, handlers whose fates the
workload draws (END, NACK, REJECT, a lapsed lease, a crash of the whole
process), and no flow control beyond a bound on what the handlers hold.

In a schedule with ``consumer.ordering: key`` the hand-over goes through
the consumer's real :class:`~kmq.consumer.keyed_ready.KeyedReadyQueue`, as
``KmqConsumer`` uses it: committed batches are put in, handlers take what
it lets go, every settlement and every lease that ran out in a handler is
reported to it (an ack or reject after the lease as a late settlement),
keys whose copy did not come in time are released, and held messages are
renewed half a lease after their lease (re)started (RENEW markers). Each ack
and reject is noted (:class:`KeyedDone`) for the ``key-order`` invariant.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kmq.client.api import ClientCommitFailed, ProduceFailed
from kmq.consumer.fetch_batch import STARTING
from kmq.consumer.fetch_pipeline import Commit, FetchPipeline, GiveBack, HandOver, SeekBack, WriteStarts
from kmq.consumer.keyed_ready import KeyedReadyQueue, copy_origin
from kmq.core.markers import End, Nack, Reject, Renew, Start, encode, encode_key
from kmq.core.message import KmqMessage
from kmq.core.ranges import OffsetRange, coalesce
from kmq.dev.sim.consumer import SimConsumer
from kmq.dev.sim.downtime import Downtime
from kmq.dev.sim.producer import SimProducer
from kmq.dev.sim.violation import Violation
from kmq.dev.sim.workload import ACK, CRASH, GROUP, HANG, NACK, QUEUE, REJECT, Fate, message_id

if TYPE_CHECKING:
    from kmq.dev.sim.world import World

__all__ = ["Worker", "KeyedDone"]


@dataclass(frozen=True, slots=True)
class KeyedDone:
    """A handler settled a message for good (``kind``: ack or reject) under ``consumer.ordering: key``;
    ``origin`` is the offset of its first delivery (a copy counts at its origin's place);
    ``own_origin``: this owner took the origin itself (else the first delivery went to another owner)."""

    kind: str
    owner: str
    partition: int
    key: bytes | None
    origin: int
    offset: int
    own_origin: bool


class Worker:
    """A kmq consumer process (see the module docstring)."""

    interval = 0.1
    #: Records one poll may return, and what the handlers may hold before the worker stops fetching.
    MAX_RECORDS = 20
    MAX_HELD = 60

    def __init__(self, world: "World", name: str) -> None:
        self.world = world
        self.name = name
        self.wake = 0.0
        self.incarnation = 0
        self.pending: list[tuple[float, int, Fate, KmqMessage]] = []  # (due, seq, fate, message) in handlers
        self._seq = 0
        self._lock = threading.Lock()  # what a KmqMessage is built with; one thread here
        self.downtime = Downtime()
        self._start()

    def _start(self) -> None:
        c = self.world.cluster
        self.incarnation += 1
        self.consumer = SimConsumer(c, self.name, group_id=GROUP)
        self.consumer.subscribe([QUEUE], on_assigned=lambda tps: self._rebalances.append((True, tps)),
                                on_revoked=lambda tps: self._rebalances.append((False, tps)))
        self.markers = SimProducer(c, f"{self.name}-markers", delivery_timeout=10.0)
        self.owner = f"{self.name}#{self.incarnation}"
        self.pipeline = FetchPipeline.for_kafka(self.world.config.kafka, self.world.workload.lease,
                                                hand_over_started=self.world.hand_over_started)
        self._rebalances: list[tuple[bool, set]] = []  # callbacks that ran inside a poll, not reported yet
        self._commit: Any = None  # the commit in flight
        self._held = 0  # messages handed over, not settled
        # ordering: key: the consumer's keyed hand-over; taken messages -> (message, lease end), those
        # whose lease ran out in a handler, and the first deliveries (partition, offset) this owner took
        self.keyed = KeyedReadyQueue() if self.world.ordered else None
        self._taken: dict[tuple[int, int], tuple[KmqMessage, float]] = {}
        self._lapsed: set[tuple[int, int]] = set()
        self._origins: set[tuple[int, int]] = set()

    def _restart(self) -> None:
        self._start()
        self.world.cluster.record(f"world {self.name} restarted as {self.owner}")

    def busy(self) -> bool:
        return bool(self.pending or self.pipeline.pending) or self.downtime.down

    # ------------------------------------------------------------ the fetcher loop, one turn per step
    def step(self) -> None:
        c = self.world.cluster
        if not self.downtime.up(c.t(), self._restart):
            return
        if self._settle_due():
            return  # crashed
        if self.keyed is not None:
            self._keyed_turn()
        self._feed_answers()
        room = max(0, min(self.MAX_RECORDS, self.MAX_HELD - self._held - self._unhanded()))
        poll = self.pipeline.next_poll(room, c.t())
        if poll.wait:
            return
        # pause_all: every partition paused (no room, or a commit retried): the poll only keeps the membership
        records = self.consumer.fetch(0.0, 0 if poll.pause_all else poll.max_records, self._message)
        self._feed_rebalances()  # they ran inside that poll: its records belong to the assignment after them
        self._run(self.pipeline.polled(records, c.t()))

    def _message(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: Any, timestamp: int) -> KmqMessage:
        return KmqMessage(topic, partition, offset, key, value, headers, timestamp, None, self._lock)  # type: ignore[arg-type]

    def _unhanded(self) -> int:
        return sum(len(b.messages) for b in self.pipeline.pending)

    def _feed_rebalances(self) -> None:
        while self._rebalances:
            assigned, tps = self._rebalances.pop(0)
            parts = {p for t, p in tps if t == QUEUE}
            if assigned:
                self.pipeline.assigned(parts)
            else:
                self._run(self.pipeline.revoked(parts))

    def _feed_answers(self) -> None:
        """Report the STARTs and the commit Kafka answered, and the time (for the timeouts)."""
        now = self.world.cluster.t()
        for b in list(self.pipeline.pending):
            if b.state is STARTING and b.handle is not None and all(f.is_done for f in b.handle):
                failed = next((f.exception for f in b.handle if f.exception is not None), None)
                if failed is None:
                    for p, offs in b.offsets.items():
                        self.world.started[p].update(offs)
                self._run(self.pipeline.start_answered(b, failed, now))
        commit = self._commit
        if commit is not None and commit.is_done:
            self._commit = None
            self._run(self.pipeline.commit_answered(commit.exception, now))
        self._run(self.pipeline.tick(now))

    # ------------------------------------------------------------ the pipeline's actions
    def _run(self, actions: list) -> None:
        todo = list(actions)
        while todo:
            action = todo.pop(0)
            if isinstance(action, WriteStarts):
                todo += self._write_starts(action)
            elif isinstance(action, Commit):
                todo += self._send_commit(action)
            elif isinstance(action, HandOver):
                self._hand_over(action)
            elif isinstance(action, GiveBack):
                self.world.cluster.record(f"world {self.owner} gives back {len(action.messages)} ({action.why})")
            elif isinstance(action, SeekBack):
                self._seek_back(action)

    def _write_starts(self, action: WriteStarts) -> list:
        w, b = self.world, action.batch
        futures = []
        for p, offs in sorted(b.offsets.items()):
            start = Start(tuple(coalesce(offs)), lease_ms=int(w.workload.lease * 1000),
                          owner=self.owner)
            try:
                futures.append(self.markers.send(w.queue.markers_topic, value=encode(start), key=encode_key(p),
                                                 partition=p))
            except ProduceFailed as exc:
                return self.pipeline.start_answered(b, exc, w.cluster.t())
        b.handle = futures
        return []

    def _send_commit(self, action: Commit) -> list:
        early = [b for b in action.batches if not _start_acked(b)]
        if early:
            self.world.breach(Violation("commit-before-start-acked", f"{self.owner} commits {QUEUE} at "
                                        f"{dict(sorted(action.offsets.items()))}, over offsets "
                                        f"{_offsets(early)} whose START Kafka had not acknowledged"))
        try:
            self._commit = self.consumer.commit_async({(QUEUE, p): o for p, o in action.offsets.items()})
        except ClientCommitFailed as exc:
            return self.pipeline.commit_answered(exc, self.world.cluster.t())
        return []

    def _hand_over(self, action: HandOver) -> None:
        if not _start_acked(action.batch):
            first = action.messages[0] if action.messages else None
            self.world.breach(Violation("hand-over-before-start-acked", f"{self.owner} hands over "
                                        f"{_offsets([action.batch])} before Kafka acknowledged their START",
                                        message_id(first.value) if first is not None else None))
        if self.keyed is not None:
            self._held += len(action.messages)
            self.keyed.put(list(action.messages), action.batch.leased_at)
            return
        for m in action.messages:
            self._held += 1
            self._handle(m)

    def _handle(self, m: KmqMessage) -> None:
        """A handler takes ``m``: its fate is drawn."""
        w, c = self.world, self.world.cluster
        self._seq += 1
        fate = w.workload.handle(w.rng)
        how = "START acked" if self.pipeline.hand_over_started else "START acked, committed"
        w.note(message_id(m.value), f"{self.owner} took {QUEUE}[{m.partition}]@{m.offset} ({how}); "
               f"will {fate.kind} after {fate.after:g}s")
        if fate.kind == HANG:
            self._held -= 1  # its lease lapses; the handler thread is lost to it, not the flow bound
        else:
            self.pending.append((c.t() + fate.after, self._seq, fate, m))

    # ------------------------------------------------------------ ordering: key
    def _keyed_turn(self) -> None:
        """Release keys whose copy is overdue, end the leases that ran out in handlers, renew the
        held messages, and hand out what the key order lets go."""
        w, keyed, now = self.world, self.keyed, self.world.cluster.t()
        assert keyed is not None
        for r in keyed.expire(now):
            w.released.add((self.owner, r.partition, r.key))
            w.cluster.record(f"world {self.owner} releases key {r.key!r} of {QUEUE}[{r.partition}]: no copy of "
                             f"@{r.origin} in time")
        for _tp, (m, lease_end) in sorted(self._taken.items()):
            if lease_end <= now:
                self._lapse(m)
        lease = w.workload.lease
        renew: dict[int, list[int]] = {}
        for m in keyed.due_for_renewal(now - lease / 2, now):
            renew.setdefault(m.partition, []).append(m.offset)
        for p, offs in sorted(renew.items()):
            marker = Renew(tuple(coalesce(offs)), int(lease * 1000))
            self.markers.send(w.queue.markers_topic, value=encode(marker), key=encode_key(p), partition=p)
        taken = keyed.take(0.0, 0, lambda: True)
        for msgs, _first, _end, leased_at in keyed.taken():
            for m in msgs:
                self._taken[(m.partition, m.offset)] = (m, leased_at + lease)
        for m in taken:
            if copy_origin(m) is None:
                self._origins.add((m.partition, m.offset))
            self._handle(m)

    def _copy_wait(self) -> float:
        q = self.world.queue
        return q.max_deliveries * (q.lease + q.backoff.max)

    def _lapse(self, m: KmqMessage) -> None:
        """``m``'s lease ran out in its handler: its key waits for the copy (unless it was the last delivery)."""
        assert self.keyed is not None
        tp = (m.partition, m.offset)
        del self._taken[tp]
        self._lapsed.add(tp)
        final = m.delivery_count >= self.world.queue.max_deliveries
        self.keyed.settled(m, final, 0.0 if final else self.world.cluster.t() + self._copy_wait())

    def _key_settled(self, m: KmqMessage, kind: str, at: float) -> None:
        """A handler settled ``m`` at ``at`` (as ``KmqConsumer.settled`` and its late settler report it)."""
        assert self.keyed is not None
        tp = (m.partition, m.offset)
        if tp in self._taken and self._taken[tp][1] <= at:
            self._lapse(m)  # the lease ran out first
        if kind in (ACK, REJECT):
            origin = copy_origin(m)
            origin = m.offset if origin is None else origin
            self.world.done.append(KeyedDone(kind, self.owner, m.partition, m.key, origin, m.offset,
                                             (m.partition, origin) in self._origins))
        if tp in self._lapsed:
            self._lapsed.discard(tp)
            if kind in (ACK, REJECT):
                self.keyed.settled_late(m)
            return
        self._taken.pop(tp, None)
        final = kind in (ACK, REJECT) or m.delivery_count >= self.world.queue.max_deliveries
        self.keyed.settled(m, final, 0.0 if final else self.world.cluster.t() + self._copy_wait())

    def _seek_back(self, action: SeekBack) -> None:
        assigned = {p for t, p in self.consumer.assignment() if t == QUEUE}
        for p, off in action.offsets.items():
            if p in assigned:
                try:
                    self.consumer.seek(QUEUE, p, off)
                except ClientCommitFailed:
                    pass  # revoked meanwhile: the next owner starts from the commit
        self.world.cluster.record(f"world {self.owner} seeks back {dict(sorted(action.offsets.items()))} "
                                  f"({action.why})")
        if action.start_failed:  # as KmqConsumer does: a new marker producer
            self.markers.close(timeout=0.0)
            self.markers = SimProducer(self.world.cluster, f"{self.name}-markers", delivery_timeout=10.0)

    # ------------------------------------------------------------ handlers
    def _settle_due(self) -> bool:
        """Settle the deliveries whose handlers finished; True when one crashed the process."""
        c = self.world.cluster
        now = c.t()
        self.pending.sort(key=lambda x: (x[0], x[1]))
        while self.pending and self.pending[0][0] <= now:
            due, _, fate, m = self.pending.pop(0)
            if fate.kind == CRASH:
                self._crash(m)
                return True
            self._held -= 1
            nack_ms = int(self.world.workload.nack_delay * 1000)
            if self.keyed is not None:
                self._key_settled(m, fate.kind, due)
            # The lambdas run at once, in this iteration.
            marker = {ACK: lambda: End((OffsetRange(m.offset, 1),)), NACK: lambda: Nack((OffsetRange(m.offset, 1),), nack_ms),  # noqa: B023
                      REJECT: lambda: Reject((OffsetRange(m.offset, 1),), "sim handler rejected it")}.get(fate.kind)  # noqa: B023
            self.world.note(message_id(m.value), f"{self.owner} settles {QUEUE}[{m.partition}]@{m.offset}: {fate.kind}")
            if marker is not None:
                self.markers.send(self.world.queue.markers_topic, value=encode(marker()),  # type: ignore[arg-type]  # an END, NACK or REJECT
                                  key=encode_key(m.partition), partition=m.partition)
        return False

    def _crash(self, m: KmqMessage) -> None:
        c = self.world.cluster
        self.world.note(message_id(m.value), f"{self.owner} crashes handling {QUEUE}[{m.partition}]@{m.offset} "
                        f"({len(self.pending)} other delivery(ies) lost)")
        c.record(f"world {self.owner} crashes")
        self.consumer.crash()
        self.markers.close(timeout=0.0)
        self.pending = []
        self.pipeline.closed()
        self.downtime.crashed(c.t(), self.world.workload.restart_after)



def _start_acked(batch: Any) -> bool:
    """Whether Kafka acknowledged every START marker of ``batch`` (its futures, not the pipeline's
    state: the invariant must not take the code under test at its word)."""
    return batch.handle is not None and all(f.is_done and f.exception is None for f in batch.handle)


def _offsets(batches: list) -> dict[int, tuple[int, int]]:
    """Partition -> (first, last) of ``batches``' offsets."""
    out: dict[int, tuple[int, int]] = {}
    for b in batches:
        for p, offs in b.offsets.items():
            if offs:
                lo, hi = out.get(p, (offs[0], offs[-1]))
                out[p] = (min(lo, offs[0]), max(hi, offs[-1]))
    return dict(sorted(out.items()))
