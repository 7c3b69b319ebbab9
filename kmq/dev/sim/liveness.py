"""Liveness: a due offset is served in time, and the tracker drops its view only for a cause.

The safety invariants (:mod:`kmq.dev.sim.invariants`) look at the end state;
a tracker that serves one partition while another waits behind it passes
them, since everything is served once the faults stop. These two look at the
time in between.

* ``overdue``: replaying a queue partition's markers through a fresh
  :class:`~kmq.core.lease_state.PartitionState` (an oracle fed the whole log,
  as the tracker would be) tells when each offset became due (lease over,
  NACKed, rejected); the next marker about it (its CLOSED, or a late END)
  must follow within :func:`serve_bound` seconds. Checked only where the
  partition was *clean*: from :data:`SETTLE_S` before it became due to the
  bound after it, no fault was active but :class:`~kmq.dev.sim.faults.SlowRead`
  of other partitions (queue or markers) and open transactions
  (:class:`~kmq.dev.sim.faults.OpenTransaction`: the tracker reads
  uncommitted, they must not hold it back), and the tracker was not down. So a slow partition may
  delay the others by one stuck read, never starve them. Judged with the
  service loop only: which partition goes first is the service's choice
  (least recently served), and the simulator's loop around the redelivery
  step alone (``--tracker-loop step``) serves them in partition order.
* ``view-dropped``: the service tracker dropped its view
  (``kmq_tracker_stale_views_total``) although nothing in the schedule could
  put its group membership in doubt: no freeze of the tracker past the
  session timeout less a heartbeat, no failed commit. A slow step alone is
  no cause (the client's heartbeat thread keeps the membership).
"""

from __future__ import annotations

from typing import Iterator

from kmq.core.lease_state import PartitionState
from kmq.core.marker_clock import SKEW_ALLOWANCE_MS
from kmq.core.markers import BadMarker, Marker, decode_record
from kmq.dev.sim.clock import EPOCH_S
from kmq.dev.sim.faults import ClockSkew, CommitFault, Fault, MemberPause, OpenTransaction, SlowRead
from kmq.dev.sim.reader import POLL_S
from kmq.dev.sim.tracker_loop import ServiceTrackerActor
from kmq.dev.sim.violation import Violation
from kmq.dev.sim.workload import QUEUE
from kmq.dev.sim.world import TRACKER, World

__all__ = ["serve_bound", "overdue", "view_drops", "clean", "markers_of", "checked_marker", "SETTLE_S", "READ_TIMEOUT_S"]

#: The simulated log reader's timeout (the real readers' default).
READ_TIMEOUT_S = 10.0
#: Quiet time before a due offset for its partition to count as clean: what a fault leaves behind
#: (acknowledgements past their delivery timeout, a backlog, a catch-up) is over by then.
SETTLE_S = 30.0
#: Steps, sends and catch-up on top of the stuck read and the backoff.
SLACK_S = 2.0


def serve_bound(world: World) -> float:
    """Seconds within which a due offset of a clean partition is served: one stuck read of another
    partition (timeout and the poll past it), the queue's longest backoff (a timed-out offset waits
    it out first), and a little slack."""
    return READ_TIMEOUT_S + POLL_S + world.queue.backoff.max + SLACK_S


def _window(f: Fault) -> tuple[float, float]:
    if isinstance(f, ClockSkew) and f.host == TRACKER:
        # The tracker re-reads every partition after its clock jumps, and a replayed lease may last
        # the skew allowance longer: not judged until that is over.
        return f.at, f.at + SKEW_ALLOWANCE_MS / 1000.0
    return f.at, getattr(f, "until", f.at)


def clean(world: World, partition: int, start: float, end: float, ignore: tuple[type, ...] = ()) -> bool:
    """No fault but slow reads of other partitions (of the queue or of its markers; and faults of
    the kinds in ``ignore``), and the tracker up, in ``[start, end]``."""
    for f in world.cluster.faults.faults:
        at, until = _window(f)
        if at > end or until < start or isinstance(f, ignore):
            continue
        if isinstance(f, OpenTransaction):
            continue  # the tracker reads uncommitted: an open transaction must not hold its reads back
        if isinstance(f, SlowRead) and not (f.topic in (QUEUE, world.queue.markers_topic) and f.partition == partition):
            continue
        return False
    down_for = getattr(world.tracker, "down_for", 0.0)
    return not any(start <= t + down_for and t <= end for t in getattr(world.tracker, "crashes", []))


def _t(ts_ms: int) -> float:
    return ts_ms / 1000.0 - EPOCH_S


def checked_marker(key: bytes | None, value: bytes | None, partition: int) -> Marker | BadMarker:
    """:func:`~kmq.core.markers.decode_record`, cross-checked with the type byte on the wire: a marker
    decoded as another type than its bytes name counts as a bad one (a check must not take the
    decoder it checks at its word)."""
    marker = decode_record(key, value, partition)
    if not isinstance(marker, BadMarker) and (value is None or len(value) < 2 or value[1] != marker.TYPE):
        return BadMarker(f"decoded as {type(marker).__name__}, type byte {value[1] if value and len(value) > 1 else None}")
    return marker


def markers_of(world: World, partition: int) -> Iterator[tuple[int, int, object]]:
    """(offset, record time, marker or :class:`BadMarker`) of each record of a markers partition; the
    record time is when it was stamped on the cluster's clock (its writer's may read off)."""
    plog = world.cluster.log(world.queue.markers_topic, partition)
    for rec in plog.read(plog.log_start, plog.high_water - plog.log_start):
        yield rec.offset, rec.timestamp - rec.skew_ms, checked_marker(rec.key, rec.value, partition)


def overdue(world: World, where: dict[tuple[int, int], str]) -> list[Violation]:
    """The ``overdue`` invariant (module docstring); ``where`` maps (partition, offset) to messages."""
    if not isinstance(world.tracker, ServiceTrackerActor):
        return []  # the order of partitions is the service's (module docstring)
    q, bound = world.queue, serve_bound(world)
    end_ms = world.cluster.clock.now_ms()
    out = []
    for p in range(world.workload.partitions):
        oracle = PartitionState(q.backoff.delay, q.max_deliveries, max_hold_ms=int(q.max_hold * 1000))
        for moff, ts, marker in [*markers_of(world, p), (None, end_ms, None)]:
            due_ms = oracle.next_due_ms()
            if due_ms is not None and _t(ts) - _t(due_ms) > bound and clean(world, p, _t(due_ms) - SETTLE_S,
                                                                                _t(due_ms) + bound):
                item = oracle.due(due_ms)[0]
                off = item.ranges[0].first
                next_event = "the end of the run" if moff is None else f"marker {q.markers_topic}[{p}]@{moff}"
                out.append(Violation("overdue", f"{QUEUE}[{p}]@{off} was due at t={_t(due_ms):.3f}s and still "
                                     f"not served at t={_t(ts):.3f}s ({next_event}), more than {bound:g}s later, "
                                     f"with no fault on its partition", where.get((p, off))))
                break
            if moff is None:
                break
            if isinstance(marker, BadMarker):
                oracle.skip(moff)
            else:
                oracle.apply(marker, moff, ts)  # type: ignore[arg-type]
    return out


def _membership_causes(world: World) -> list[Fault]:
    kafka = world.config.kafka
    limit = kafka.session_timeout - kafka.heartbeat_interval
    tracker = world.tracker.name
    return [f for f in world.cluster.faults.faults
            if (isinstance(f, MemberPause) and f.consumer == tracker and f.until - f.at > limit)
            or (isinstance(f, CommitFault) and f.consumer in (None, tracker))]


def view_drops(world: World) -> list[Violation]:
    """The ``view-dropped`` invariant (module docstring)."""
    t = world.tracker
    if not isinstance(t, ServiceTrackerActor):
        return []  # the redelivery step alone keeps no view
    drops = t.views_dropped()
    if drops and not _membership_causes(world):
        return [Violation("view-dropped", f"the tracker dropped its view {drops} time(s) (kmq_tracker_stale_views_"
                          f"total) with no freeze past the session timeout and no failed commit in the schedule")]
    return []
