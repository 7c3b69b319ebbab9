"""A kmq worker on the simulated cluster: the consumer's own fetcher step, one step per turn.

:class:`Worker` runs :class:`kmq.consumer.fetcher.Fetcher`, the step
:class:`~kmq.consumer.consumer.KmqConsumer`'s fetcher thread runs in a loop,
on the simulated group consumer and the virtual clock: the same events for
:class:`~kmq.consumer.fetch_pipeline.FetchPipeline` in the same order (START
answers, the commit's answer and the time, then a poll, the rebalance
callbacks that ran inside it, its records) and the same actions carried out
(START markers per partition for a new batch, the commit of STARTed batches,
giving back, seeking back, the commit before a revocation). What differs is
injected: the marker writer (:class:`SimMarkerWriter`: the real one sends
from threads of its own and waits for the hand-off RENEW; here the markers go
on the worker's simulated producer and nothing waits inside a step), the
hand-over (to handlers whose fates the workload draws: END, NACK, REJECT, a
lapsed lease, a crash of the whole process) and flow control (only a bound on
what the handlers hold). The hand-over goes through the consumer's real
:class:`~kmq.consumer.ready_queue.ReadyQueue` and
:class:`~kmq.consumer.take_ahead.TakeAhead`, as ``KmqConsumer``'s iteration
takes it (a chunk at a time, twice the last while the taker keeps up, on the
virtual clock); handlers take what is handed over at once, so no ready
message waits for a revocation to commit it back.

A :class:`~kmq.dev.sim.faults.CloseDuringTake` closes the worker gracefully
from inside such a take (the ``take_chunk`` the take-ahead is given runs the
close after the ready queue's take, before the rest is kept), in the two
parts ``KmqConsumer.close`` has, through the same product code
(:mod:`kmq.consumer.close_ready`): the closing thread puts what was taken
ahead back into the ready queue; then, once the take returned, the fetcher's
side drains the ready queue and gives it back to the group
(:meth:`~kmq.consumer.fetcher.Fetcher.give_back_unhanded`), and the process
leaves the group; deliveries still in handlers stay in flight (the tracker
redelivers them when their leases end, as documented for ``close()``), and
the worker comes back ``restart_after`` later. Every message taken from the
ready queue must have gone to a handler or back to the group by then
(``stranded-by-close``, a breach seen at the close).

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

from kmq.client.api import ProduceFailed
from kmq.consumer.close_ready import give_back_ready, put_back_ahead
from kmq.consumer.fetch_pipeline import Commit, FetchPipeline, GiveBack, HandOver, SeekBack
from kmq.consumer.fetcher import Fetcher, FetcherParts
from kmq.consumer.keyed_ready import KeyedReadyQueue, copy_origin
from kmq.consumer.ready_queue import ReadyQueue
from kmq.consumer.take_ahead import TakeAhead
from kmq.core.errors import MarkerWriteError
from kmq.core.markers import End, Nack, Reject, Renew, Start, encode, encode_key
from kmq.core.message import KmqMessage, message_builder
from kmq.core.ranges import OffsetRange, coalesce
from kmq.dev.sim.consumer import SimConsumer
from kmq.dev.sim.downtime import Downtime
from kmq.dev.sim.faults import CloseDuringTake
from kmq.dev.sim.producer import SimProducer
from kmq.dev.sim.violation import Violation
from kmq.telemetry.metrics import ConsumerMetrics
from kmq.dev.sim.workload import ACK, CRASH, GROUP, HANG, NACK, QUEUE, REJECT, Fate, message_id

if TYPE_CHECKING:
    from kmq.dev.sim.world import World

__all__ = ["Worker", "KeyedDone", "SimMarkerWriter"]


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
        # What a KmqMessage is built with (one thread here); the handlers settle by writing markers, so
        # the messages' own settlements (a give-back) are noted nowhere.
        self._build = message_builder(_Unsettled(), threading.Lock())
        self.metrics = ConsumerMetrics()  # the fetcher step's; read by nothing
        self.downtime = Downtime()
        self._closes_done: set[CloseDuringTake] = set()  # each close fault cuts one take, once
        self._start()

    def _start(self) -> None:
        w = self.world
        c = w.cluster
        self.incarnation += 1
        self.consumer = SimConsumer(c, self.name, group_id=GROUP, isolation_level=w.worker_isolation)
        self.markers = SimProducer(c, f"{self.name}-markers", delivery_timeout=10.0)
        self.owner = f"{self.name}#{self.incarnation}"
        self.pipeline = FetchPipeline.for_kafka(w.config.kafka, w.workload.lease, hand_over_started=w.hand_over_started)
        self._held = 0  # messages handed over, not settled
        # ordering: key: the consumer's keyed hand-over; taken messages -> (message, lease end), those
        # whose lease ran out in a handler, and the first deliveries (partition, offset) this owner took
        self.keyed = KeyedReadyQueue() if w.ordered else None
        # Without ordering: key, the consumer's ready queue and its iteration's take-ahead; what was
        # taken from the ready queue and not given to a handler yet (a close must give it back).
        self.ready = ReadyQueue()
        self.ahead = TakeAhead(self._take_chunk, clock=c.t)
        self._unhanded_taken: dict[tuple[int, int], KmqMessage] = {}
        self._closing: CloseDuringTake | None = None
        self._taken: dict[tuple[int, int], tuple[KmqMessage, float]] = {}
        self._lapsed: set[tuple[int, int]] = set()
        self._origins: set[tuple[int, int]] = set()
        self.fetcher = Fetcher(FetcherParts(
            QUEUE, QUEUE, self.pipeline, SimMarkerWriter(self), self.keyed or self.ready, self._build,
            self._hand_over, _not_counted, self.metrics, threading.Event(), monotonic=c.t, observe=self._observe,
            max_poll_wait=0.0,  # the virtual clock moves between steps, not inside a poll
            session_timeout=w.config.kafka.session_timeout), self.consumer)
        self.fetcher.subscribe()

    def _restart(self) -> None:
        self._start()
        self.world.cluster.record(f"world {self.name} restarted as {self.owner}")

    def busy(self) -> bool:
        return bool(self.pending or self.pipeline.pending) or self.downtime.down

    # ------------------------------------------------------------ one turn: handlers, then the fetcher step
    def step(self) -> None:
        c = self.world.cluster
        if not self.downtime.up(c.t(), self._restart):
            return
        if self._settle_due():
            return  # crashed
        if self.keyed is not None:
            self._keyed_turn()
        self.fetcher.answers(c.t())
        if self._closing is None:
            self.fetcher.poll(max(0, min(self.MAX_RECORDS, self.MAX_HELD - self._held - self._unhanded())))
        if self._closing is not None:  # the fetcher's side of the close, once the step that saw it returned
            self._close()

    def _unhanded(self) -> int:
        return sum(len(b.messages) for b in self.pipeline.pending)

    # ------------------------------------------------------------ what the fetcher step is given
    def _observe(self, action: Any) -> None:
        """Each action of the pipeline, before the fetcher step carries it out: the invariants that
        look at the futures themselves (not the pipeline's word), and the history."""
        if isinstance(action, Commit):
            early = [b for b in action.batches if not _start_acked(b)]
            if early:
                self.world.breach(Violation("commit-before-start-acked", f"{self.owner} commits {QUEUE} at "
                                            f"{dict(sorted(action.offsets.items()))}, over offsets "
                                            f"{_offsets(early)} whose START Kafka had not acknowledged"))
        elif isinstance(action, GiveBack):
            self.world.cluster.record(f"world {self.owner} gives back {len(action.messages)} ({action.why})")
        elif isinstance(action, SeekBack):
            self.world.cluster.record(f"world {self.owner} seeks back {dict(sorted(action.offsets.items()))} "
                                      f"({action.why})")

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
        self.ready.put(list(action.messages), action.batch.leased_at, action.batch.gen)
        while self._closing is None:  # as KmqConsumer's iteration: until the close (or nothing is ready)
            m = self.ahead.next(0.0)
            if m is None:
                break
            self._unhanded_taken.pop((m.partition, m.offset), None)
            self._held += 1
            self._handle(m)
        self.ready.taken()  # the records of what was taken are for KmqConsumer's lease bookkeeping

    def _take_chunk(self, timeout: float, max_records: int) -> tuple[list[KmqMessage], float, int]:
        """The take-ahead's ``take_chunk``: the ready queue's; a :class:`CloseDuringTake` due now
        closes the consumer right after a take of more than one message, before its rest is kept."""
        msgs, leased_at, gen = self.ready.take_chunk(timeout, max_records, lambda: self._closing is not None)
        for m in msgs:
            self._unhanded_taken[(m.partition, m.offset)] = m
        if len(msgs) > 1 and self._closing is None:
            due = self.world.cluster.faults.close_during_take(self.name, self.world.cluster.t(), self._closes_done)
            if due is not None:
                self._begin_close(due, msgs)
        return msgs, leased_at, gen

    # ------------------------------------------------------------ a graceful close (CloseDuringTake)
    def _begin_close(self, fault: CloseDuringTake, taken: list[KmqMessage]) -> None:
        """The closing thread's part of ``KmqConsumer.close``, inside a take: what was taken ahead
        goes back into the ready queue; the take in progress brings its rest back the same way."""
        w = self.world
        self._closes_done.add(fault)
        self._closing = fault
        w.cluster.record(f"world {self.owner} closes while a take of {len(taken)} message(s) is in progress")
        for m in taken:
            w.note(message_id(m.value), f"{self.owner} closes while taking {QUEUE}[{m.partition}]@{m.offset} "
                   f"(one of {len(taken)} taken at once for iteration)")
        put_back_ahead(self.ahead, self.ready, QUEUE, fetching=True)

    def _close(self) -> None:
        """The fetcher's part of the close (the ready queue drained and given back to the group), then
        the process leaves the group and stops; it comes back ``restart_after`` later. A message taken
        from the ready queue that neither a handler nor the give-back got is stranded."""
        w, c = self.world, self.world.cluster
        drained = _Drained(self.ready)
        give_back_ready(self.fetcher, self.ahead, drained, QUEUE, final=True, wait=0.0)
        for tp in drained.seen:
            self._unhanded_taken.pop(tp, None)
        for m in sorted(self._unhanded_taken.values(), key=lambda m: (m.partition, m.offset)):
            w.note(message_id(m.value), f"{self.owner} closed: {QUEUE}[{m.partition}]@{m.offset}, taken from the "
                   f"ready queue, was neither handed to a handler nor given back")
            w.breach(Violation("stranded-by-close", f"{self.owner}'s close stranded {QUEUE}[{m.partition}]@"
                               f"{m.offset}: taken from the ready queue, neither handed to a handler nor given "
                               f"back to the group", message_id(m.value)))
        self.consumer.close()
        self.markers.close()
        for _, _, _, m in self.pending:
            w.note(message_id(m.value), f"{self.owner} closed with {QUEUE}[{m.partition}]@{m.offset} in a handler "
                   f"(its lease runs out)")
        self.pending = []
        c.record(f"world {self.owner} closed ({len(drained.seen)} ready message(s) given back)")
        self.downtime.crashed(c.t(), w.workload.restart_after)

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



class SimMarkerWriter:
    """The marker writer the worker's fetcher step is given: STARTs and hand-off RENEWs on the
    worker's simulated producer, sent without waiting (the real writer's hand-off waits for its RENEW
    on a thread of its own, which a step on the virtual clock cannot)."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self.owner = worker.owner  # the fetcher step names the group member here, as in START markers

    def send_starts(self, offsets: dict[int, list[int]]) -> list[tuple[int, list, Any]]:
        w = self._worker
        lease_ms = int(w.world.workload.lease * 1000)
        futures = []
        for p, offs in sorted(offsets.items()):
            ranges = coalesce(offs)
            start = Start(tuple(ranges), lease_ms=lease_ms, owner=self.owner)
            try:
                futures.append((p, ranges, w.markers.send(w.world.queue.markers_topic, value=encode(start),
                                                          key=encode_key(p), partition=p)))
            except ProduceFailed as exc:
                raise MarkerWriteError(f"START marker for {QUEUE}[{p}] not sent: {exc}") from exc
        return futures

    def wait_starts(self, futures: list[tuple[int, list, Any]], timeout: float | None = None) -> None:
        """Only asked once every future is done: the first refusal, or the STARTs noted as acknowledged."""
        failed = next((f.exception for _, _, f in futures if f.exception is not None), None)
        if failed is not None:
            raise MarkerWriteError(f"START marker not acknowledged: {failed}") from failed
        started = self._worker.world.started
        for p, ranges, _ in futures:
            for r in ranges:
                started[p].update(r.offsets())

    def hand_off(self, offsets: dict[int, list[int]], timeout: float) -> set[int]:
        w = self._worker
        ms = int(max(w.world.config.consumer.handoff_lease, w.world.queue.lease) * 1000)
        for p, offs in sorted(offsets.items()):
            marker = Renew(tuple(coalesce(offs)), ms)
            w.markers.send(w.world.queue.markers_topic, value=encode(marker), key=encode_key(p), partition=p)
        return set()  # not waited for

    def replace_producer(self, why: str) -> bool:
        """As KmqConsumer does after a failed START: a new marker producer."""
        w = self._worker
        w.markers.close(timeout=0.0)
        w.markers = SimProducer(w.world.cluster, f"{w.name}-markers", delivery_timeout=10.0)
        return True

    def flush_buffer(self) -> int:
        return 0  # settlements are written by the handlers themselves


class _Unsettled:
    """The settler of the worker's messages: the handlers write their markers themselves."""

    def settled(self, msg: KmqMessage, outcome: str, arg: Any) -> None:
        pass

    def renewed(self, msg: KmqMessage, lease: float | None) -> None:
        pass


class _Drained:
    """The ready queue as the close's give-back sees it, noting what its drain took out."""

    def __init__(self, ready: ReadyQueue) -> None:
        self._ready = ready
        self.seen: set[tuple[int, int]] = set()

    def drain(self, final: bool = True) -> list[tuple[list[KmqMessage], int]]:
        out = self._ready.drain(final)
        self.seen.update((m.partition, m.offset) for msgs, _ in out for m in msgs)
        return out


def _not_counted(_batch: Any) -> None:
    """No flow control in the simulator beyond the handlers' bound."""


def _start_acked(batch: Any) -> bool:
    """Whether Kafka acknowledged every START marker of ``batch`` (its futures, not the pipeline's
    state: the invariant must not take the code under test at its word)."""
    return batch.handle is not None and all(f.is_done and f.exception is None for _, _, f in batch.handle)


def _offsets(batches: list) -> dict[int, tuple[int, int]]:
    """Partition -> (first, last) of ``batches``' offsets."""
    out: dict[int, tuple[int, int]] = {}
    for b in batches:
        for p, offs in b.offsets.items():
            if offs:
                lo, hi = out.get(p, (offs[0], offs[-1]))
                out[p] = (min(lo, offs[0]), max(hi, offs[-1]))
    return dict(sorted(out.items()))
