"""Leases honoured: a copy waits out its lease and backoff, a lease kept alive is never copied, and no
message is delivered more than ``max_deliveries`` times.

Read from the queue and markers logs at the end of a schedule, with the
simulator's own arithmetic (not kmq's, which is what is checked):

* ``backoff-early``: a copy with ``kmq-delivery-count`` k was sent no earlier
  than the delivery it copies was due: its first START's record time plus the
  lease (capped at ``max_hold``) plus the backoff for delivery count k-1
  (``initial * multiplier ** (k - 2)``, at most ``max``), or, if sooner, a
  NACK's record time plus its delay. Not judged for a copy of a delivery
  rejected before it, nor where the delivery copied is not known for sure
  (another record with the same origin and delivery count: a copy sent
  twice).
* ``over-max-deliveries``: no copy carries a ``kmq-delivery-count`` above
  ``max_deliveries`` (the last delivery's failure dead-letters it).
* ``copied-while-leased``: a delivery whose lease never lapsed (its one
  START, each RENEW written before the lease it extends ran out, and its END
  or REJECT before the last one ran out; no NACK) is never copied (a
  rejected one is dead-lettered). Judged
  only where its partition was clean (:func:`~kmq.dev.sim.liveness.clean`) from
  :data:`~kmq.dev.sim.liveness.SETTLE_S` before its START to a second after its END,
  but for faults only the tracker sees (:data:`TRACKER_SIDE`): a leader change of a markers
  partition (the markers are written and a fresh look-up finds them, however long the
  tracker's own fetches wait for the new leader) and hosts' clocks reading off (the checks
  take each record's time on the cluster's clock; the tracker must judge leases on its own).

Where a clock reads off, ``backoff-early`` and ``copied-while-leased`` allow a delivery's lease to
start as early as the tracker's fetch before the one that read its START (or a RENEW, a NACK): the tracker
takes a marker read at the log end as written no earlier than that, and with clocks apart that is
all it can know.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kmq.core.markers import End, Nack, Reject, Renew, Start
from kmq.core.message import HEADER_DELIVERY_COUNT, header_text, origin_of
from kmq.dev.sim.clock import EPOCH_S
from kmq.dev.sim.faults import ClockSkew, LeaderChange, on_host
from kmq.dev.sim.liveness import SETTLE_S, clean, markers_of
from kmq.dev.sim.violation import Violation
from kmq.dev.sim.workload import QUEUE
from kmq.dev.sim.world import TRACKER, World, message_id

__all__ = ["backoff_early", "copied_while_leased", "over_max_deliveries", "leases", "TRACKER_SIDE"]

#: Faults that keep a partition clean for ``copied-while-leased``: they touch only what the tracker
#: sees of the markers, and it must not copy a delivery kept alive whatever they do.
TRACKER_SIDE: tuple[type, ...] = (LeaderChange, ClockSkew)



@dataclass
class _Delivery:
    """One record of the queue with what the markers say about it."""

    offset: int
    mid: str
    origin: str
    count: int
    ts_ms: int
    starts: list[tuple[int, int]] = field(default_factory=list)  # (record time, lease ms)
    renews: list[tuple[int, int]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    nacks: list[tuple[int, int]] = field(default_factory=list)  # (record time, delay ms)
    rejects: list[int] = field(default_factory=list)
    gap_ms: int = 0  # the longest fetch gap of the tracker over its START, RENEWs and NACKs (see _slack_ms)


def _count(headers) -> int:
    text = header_text(headers, HEADER_DELIVERY_COUNT) if headers else None
    return int(text) if text is not None and text.isascii() and text.isdigit() else 1


def _deliveries(world: World, p: int) -> dict[int, _Delivery]:
    plog = world.cluster.log(QUEUE, p)
    out: dict[int, _Delivery] = {}
    for rec in plog.read(plog.log_start, plog.high_water - plog.log_start):
        mid = message_id(rec.value)
        if mid is not None:
            out[rec.offset] = _Delivery(rec.offset, mid, origin_of(rec.headers, QUEUE, p, rec.offset),
                                        _count(rec.headers), rec.timestamp - rec.skew_ms)
    gaps = _tracker_fetch_gaps(world, p)
    for moff, ts, marker in markers_of(world, p):
        for r in getattr(marker, "ranges", ()):
            for off in range(r.first, r.end):
                d = out.get(off)
                if d is None:
                    continue
                if isinstance(marker, (Start, Renew, Nack)):
                    d.gap_ms = max(d.gap_ms, gaps.get(moff, 0))
                if isinstance(marker, Start):
                    d.starts.append((ts, marker.lease_ms))
                elif isinstance(marker, Renew):
                    d.renews.append((ts, marker.lease_ms))
                elif isinstance(marker, End):
                    d.ends.append(ts)
                elif isinstance(marker, Nack):
                    d.nacks.append((ts, marker.delay_ms))
                elif isinstance(marker, Reject):
                    d.rejects.append(ts)
    return out


def _backoff_ms(world: World, count: int) -> float:
    b = world.queue.backoff
    if count < 1:
        return 0.0
    return min(b.max, b.initial * b.multiplier ** min(count - 1, 64)) * 1000.0


def _hold_ms(world: World, lease_ms: int) -> int:
    return min(lease_ms, int(world.queue.max_hold * 1000))


def _tracker_fetch_gaps(world: World, p: int) -> dict[int, int]:
    """Markers offset of partition ``p`` -> the longest time (ms) between the tracker's fetch that read
    it and the fetch before (over its processes)."""
    topic = world.queue.markers_topic
    out: dict[int, int] = {}
    for (consumer, t, part, off), gap in world.cluster.fetch_gaps.items():
        if t == topic and part == p and on_host(consumer, TRACKER):
            out[off] = max(out.get(off, 0), round(gap * 1000))
    return out


def _slack_ms(world: World, d: _Delivery) -> int:
    """What ``d``'s lease may lose where clocks disagree: a marker read at the log end counts from
    no earlier than the tracker's fetch before the one that read it, however far its writer's clock
    reads off (:func:`kmq.core.marker_clock.marker_time`); with clocks apart that is all it knows."""
    return d.gap_ms + 1 if world.cluster.faults.of(ClockSkew) else 0


def _t(ts_ms: float) -> float:
    return ts_ms / 1000.0 - EPOCH_S


def _by_origin(deliveries: dict[int, _Delivery]) -> dict[tuple[str, int], list[_Delivery]]:
    out: dict[tuple[str, int], list[_Delivery]] = defaultdict(list)
    for d in deliveries.values():
        out[(d.origin, d.count)].append(d)
    return out


def backoff_early(world: World, p: int, deliveries: dict[int, _Delivery]) -> list[Violation]:
    """The ``backoff-early`` invariant (module docstring) for queue partition ``p``."""
    by_origin = _by_origin(deliveries)
    for c in sorted(deliveries.values(), key=lambda d: d.offset):
        if c.count < 2:
            continue
        sources = [s for s in by_origin.get((c.origin, c.count - 1), []) if s.offset < c.offset]
        if len(sources) != 1:
            continue
        s = sources[0]
        if any(t <= c.ts_ms for t in s.rejects):
            continue
        # Due at the first of: the first lease run out and its backoff waited, a NACK's delay over.
        bounds = [(start_ts + _hold_ms(world, lease_ms) + _backoff_ms(world, s.count),
                   f"START at t={_t(start_ts):.3f}s, lease {lease_ms} ms, backoff {_backoff_ms(world, s.count):.0f} ms")
                  for start_ts, lease_ms in sorted(s.starts)[:1]]
        bounds += [(ts + _hold_ms(world, delay_ms), f"NACK at t={_t(ts):.3f}s, delay {delay_ms} ms")
                   for ts, delay_ms in s.nacks if ts <= c.ts_ms]
        if not bounds:
            continue
        earliest, why = min(bounds)
        if c.ts_ms < earliest - 1 - _slack_ms(world, s):  # ms rounding
            return [Violation("backoff-early", f"{QUEUE}[{p}]@{c.offset} (delivery {c.count}) copied from @{s.offset} "
                              f"at t={_t(c.ts_ms):.3f}s, before it was due at t={_t(earliest):.3f}s ({why})", c.mid)]
    return []


def _kept_until(world: World, d: _Delivery) -> tuple[int, str] | None:
    """The record time of ``d``'s END or REJECT (and which) when its lease never lapsed before it, else None."""
    if len(d.starts) != 1 or len(d.ends) + len(d.rejects) != 1 or d.nacks:
        return None
    start_ts, lease_ms = d.starts[0]
    deadline = start_ts + _hold_ms(world, lease_ms)
    for ts, renew_ms in sorted(d.renews):
        if ts >= deadline - _slack_ms(world, d):
            return None
        deadline = max(deadline, ts + _hold_ms(world, renew_ms))
    end, kind = (d.ends[0], "END") if d.ends else (d.rejects[0], "REJECT")
    return (end, kind) if end < deadline - _slack_ms(world, d) else None


def copied_while_leased(world: World, p: int, deliveries: dict[int, _Delivery]) -> list[Violation]:
    """The ``copied-while-leased`` invariant (module docstring) for queue partition ``p``."""
    by_origin = _by_origin(deliveries)
    for d in sorted(deliveries.values(), key=lambda x: x.offset):
        if len(by_origin[(d.origin, d.count)]) != 1:
            continue
        kept = _kept_until(world, d)
        if kept is None:
            continue
        end, kind = kept
        copies = [c for c in by_origin.get((d.origin, d.count + 1), []) if c.offset > d.offset]
        if not copies or not clean(world, p, _t(d.starts[0][0]) - SETTLE_S, _t(end) + 1.0, TRACKER_SIDE):
            continue
        renews = f", renewed {len(d.renews)} time(s)" if d.renews else ""
        return [Violation("copied-while-leased", f"{QUEUE}[{p}]@{d.offset} was copied to @{copies[0].offset} "
                          f"although its lease never ran out (START at t={_t(d.starts[0][0]):.3f}s{renews}, {kind} at "
                          f"t={_t(end):.3f}s) and no fault but the tracker's own touched its partition", d.mid)]
    return []


def over_max_deliveries(world: World, p: int, deliveries: dict[int, _Delivery]) -> list[Violation]:
    """The ``over-max-deliveries`` invariant (module docstring) for queue partition ``p``."""
    md = world.queue.max_deliveries
    over = [d for d in sorted(deliveries.values(), key=lambda x: x.offset) if d.count > md]
    if not over:
        return []
    d = over[0]
    return [Violation("over-max-deliveries", f"{QUEUE}[{p}]@{d.offset} is delivery {d.count} of {d.origin}, more "
                      f"than max_deliveries = {md}", d.mid)]


def leases(world: World) -> list[Violation]:
    """The invariants of the module docstring, over every queue partition (at most one of each per partition)."""
    out: list[Violation] = []
    for p in range(world.workload.partitions):
        deliveries = _deliveries(world, p)
        out += over_max_deliveries(world, p, deliveries)
        out += backoff_early(world, p, deliveries)
        out += copied_while_leased(world, p, deliveries)
    return out
