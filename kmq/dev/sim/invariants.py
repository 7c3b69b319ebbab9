"""What must hold at the end of a schedule, read from the topics themselves.

At the end (after the faults stopped and the world went quiet, or the step
bound ran out) the queue, markers and DLQ logs are scanned (the search has no
retention faults, so they are complete) and checked:

* ``lost``: every message the producer sent was acked (an END marker covers
  one of its records) or dead-lettered (a record in the DLQ carries it). A
  message written only in transactions that were aborted
  (:class:`~kmq.dev.sim.faults.OpenTransaction`; the application gave it up)
  is owed only if a worker was handed one of those records (a START names
  it: workers reading uncommitted are, docs/protocol.md): then it is
  processed like any other;
* ``early-dead-letter``: a message dead-lettered for a reason other than a
  reject had at least ``max_deliveries`` STARTs; one dead-lettered as rejected
  was rejected by a handler;
* ``copies``: at most :data:`COPY_BOUND_FACTOR` x ``max_deliveries`` copies
  of a message (the tracker's copies, ``kmq-origin`` set). Without faults a
  message has at most ``max_deliveries - 1``; a few more happen legitimately
  (a copy whose acknowledgement was lost is sent again, a producer resend
  makes two originals, each with its own copies): seeds 0..299 of the default
  workload show at most ``max_deliveries + 1``. Twice ``max_deliveries``
  means copies multiply;
* ``commit-without-start``: no committed offset of the workers' group passes
  a queue record that no START marker covers (of the records the workers are
  handed: not the commit and abort markers, nor, when they read committed,
  the records of aborted transactions);
* ``commit-before-start-acked`` and ``hand-over-before-start-acked``: seen by
  the workers as it happens (:meth:`World.breach`): no commit covers, and no
  hand-over gives user code, a batch before Kafka acknowledged every START
  marker of it (the START's futures decide, not the fetch pipeline's state);
* ``backoff-early`` and ``copied-while-leased``: a copy waits out the lease
  and the backoff of the delivery it copies, and a delivery whose lease never
  lapsed (renewed in time, acked within it) is never copied
  (:mod:`kmq.dev.sim.leases`);
* ``tracker-state``: the tracker's open offsets of a partition never exceeded
  the records of that queue partition, and nothing is left open at the end;
* ``not-quiet``: the world went quiet (every delivery settled, every partition
  consumed, nothing open in the tracker) within the step bound;
* ``overdue`` and ``view-dropped``: liveness while the faults happen
  (:mod:`kmq.dev.sim.liveness`);
* ``key-order``: with ``consumer.ordering: key``, within one owner of a
  partition, handlers settle the messages of a key for good (ack, reject)
  in offset order, a copy at its origin's place. Not judged: a key the
  consumer released (its copy did not come in time: ordering given up, as
  documented), a copy whose first delivery went to another owner, and a copy
  of a message settled for good before (the tracker copied it when its lease
  ran out; the late ack or reject released the key, as documented).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from kmq.core.markers import BadMarker, End, Reject, Start
from kmq.core.message import HEADER_DLQ_REASON, HEADER_ORIGIN, header_text, parse_origin
from kmq.core.copies import reference_of
from kmq.dev.sim.leases import leases
from kmq.dev.sim.liveness import checked_marker, overdue, view_drops
from kmq.dev.sim.violation import Violation
from kmq.dev.sim.world import GROUP, QUEUE, World, message_id

__all__ = ["Violation", "Scan", "scan", "check", "COPY_BOUND_FACTOR"]

COPY_BOUND_FACTOR = 2


@dataclass
class Scan:
    """What the logs say about each message (by message id)."""

    where: dict[tuple[int, int], str] = field(default_factory=dict)  # (queue partition, offset) -> message
    copies: Counter = field(default_factory=Counter)
    starts: Counter = field(default_factory=Counter)
    started_offsets: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    ended: set[str] = field(default_factory=set)
    rejected: set[str] = field(default_factory=set)
    dead: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # message -> DLQ reasons
    written: set[str] = field(default_factory=set)  # messages with an original outside an aborted transaction
    aborted: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))  # originals aborted
    handed: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # offsets the workers are handed

    def given_up(self) -> set[str]:
        """The messages not owed: all their originals were aborted and no worker was handed one
        (see the module docstring)."""
        return {mid for mid, originals in self.aborted.items()
                if mid not in self.written and not any(off in self.started_offsets[p] for p, off in originals)}


def scan(world: World) -> Scan:
    """Read the queue, markers and DLQ logs of ``world``."""
    c, q, parts = world.cluster, world.queue, world.workload.partitions
    s = Scan()
    for p in range(parts):
        plog = c.log(QUEUE, p)
        s.handed[p] = {rec.offset for rec in plog.read(plog.log_start, plog.high_water, world.worker_isolation)}
        for rec in plog.read(plog.log_start, plog.high_water - plog.log_start):
            mid = message_id(rec.value)
            if mid is None:
                continue
            s.where[(p, rec.offset)] = mid
            origin = header_text(rec.headers, HEADER_ORIGIN)
            if origin is not None:
                s.copies[mid] += 1
            elif plog.aborted(rec):
                s.aborted[mid].append((p, rec.offset))
            else:
                s.written.add(mid)
    for p in range(parts):
        plog = c.log(q.markers_topic, p)
        for rec in plog.read(plog.log_start, plog.high_water - plog.log_start):
            marker = checked_marker(rec.key, rec.value, p)
            if isinstance(marker, BadMarker):
                continue
            for r in marker.ranges:
                for off in range(r.first, r.end):
                    if isinstance(marker, Start):
                        s.started_offsets[p].add(off)
                    mid = s.where.get((p, off))
                    if mid is None:
                        continue
                    if isinstance(marker, Start):
                        s.starts[mid] += 1
                    elif isinstance(marker, End):
                        s.ended.add(mid)
                    elif isinstance(marker, Reject):
                        s.rejected.add(mid)
    for p in range(parts):
        plog = c.log(q.dlq_topic, p)
        for rec in plog.read(plog.log_start, plog.high_water - plog.log_start):
            mid = message_id(rec.value)
            ref = reference_of(rec.headers)
            if mid is None and ref is not None and (loc := parse_origin(ref)) is not None:
                mid = s.where.get((loc[1], loc[2]))
            if mid is None:
                continue
            reason = header_text(rec.headers, HEADER_DLQ_REASON) or "?"
            s.dead[mid].append(reason)
    return s


def check(world: World, quiet: bool) -> tuple[list[Violation], Scan]:
    """Every invariant of the module docstring; an empty list when all hold."""
    s = scan(world)
    out: list[Violation] = []
    md = world.workload.max_deliveries
    if not quiet:
        busy = [a.name for a in world.actors if a.busy()]
        out.append(Violation("not-quiet", f"not quiet by the end; busy: {', '.join(busy) or 'none'}; "
                             f"tracker in flight: {[st.in_flight for _, st in sorted(world.tracker.states.items())]}"))
    given_up = s.given_up()
    for i in range(world.workload.messages):
        mid: str | None = f"m{i:05d}"
        if mid in given_up:
            continue
        if mid not in s.ended and mid not in s.dead:
            out.append(Violation("lost", f"{mid} was neither acked (END) nor dead-lettered", mid))
    for mid, reasons in sorted(s.dead.items()):
        for reason in reasons:
            if reason == "rejected" and mid not in s.rejected:
                out.append(Violation("early-dead-letter", f"{mid} dead-lettered as rejected, never rejected", mid))
            elif reason != "rejected" and s.starts[mid] < md:
                out.append(Violation("early-dead-letter", f"{mid} dead-lettered ({reason}) after {s.starts[mid]} "
                                     f"START(s), fewer than max_deliveries = {md}", mid))
    for mid, n in sorted(s.copies.items()):
        if n > COPY_BOUND_FACTOR * md:
            out.append(Violation("copies", f"{mid} has {n} copies, more than {COPY_BOUND_FACTOR} x max_deliveries", mid))
    for p, state in sorted(world.tracker.states.items()):
        records = world.cluster.log(QUEUE, p).high_water
        peak = world.tracker.max_in_flight.get(p, 0)
        if peak > records or (quiet and (state.in_flight or state.segment_count)):
            out.append(Violation("tracker-state", f"{QUEUE}[{p}]: at most {peak} open offset(s) for {records} "
                                 f"record(s); {state.in_flight} open, {state.segment_count} segment(s) at the end"))
    for p in range(world.workload.partitions):
        committed = world.cluster.groups.committed(GROUP, (QUEUE, p)) or 0
        start = world.cluster.log(QUEUE, p).log_start
        unstarted = [o for o in range(start, committed) if o in s.handed[p] and o not in s.started_offsets[p]]
        if unstarted:
            mid = s.where.get((p, unstarted[0]))
            out.append(Violation("commit-without-start", f"{QUEUE}[{p}] committed at {committed} past offset(s) "
                                 f"{unstarted[:10]} without a START", mid))
    out += world.breaches
    out += leases(world)
    out += key_order(world, s.where)
    out += overdue(world, s.where)
    out += view_drops(world)
    return out, s


def key_order(world: World, where: dict[tuple[int, int], str]) -> list[Violation]:
    """The ``key-order`` invariant (module docstring), over the workers' acks and rejects in the order
    they came."""
    out: list[Violation] = []
    done: set[tuple[int, int]] = set()
    last: dict[tuple[str, int, bytes | None], tuple[int, int]] = {}  # (owner, partition, key) -> (origin, offset)
    broken: set[tuple[str, int, bytes | None]] = set()
    for a in world.done:
        k = (a.owner, a.partition, a.key)
        if a.key is None or (a.partition, a.origin) in done:
            continue
        done.add((a.partition, a.origin))
        if not a.own_origin or k in world.released or k in broken:
            continue
        before = last.get(k)
        if before is not None and a.origin < before[0]:
            broken.add(k)
            out.append(Violation("key-order", f"{a.owner} settled {QUEUE}[{a.partition}]@{a.offset} (origin "
                                 f"@{a.origin}, {a.kind}) of key {a.key!r} after @{before[1]} (origin @{before[0]})",
                                 where.get((a.partition, a.offset))))
        else:
            last[k] = (a.origin, a.offset)
    return out

