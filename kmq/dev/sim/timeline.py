"""A message's history in a simulated schedule: ``kmq trace``'s timeline and what the actors did.

The timeline comes from the topics as ``kmq trace`` builds it
(:class:`kmq.core.trace.TraceBuilder` fed the queue partition, its markers
partition and the DLQ; the same words, :func:`kmq.core.trace.describe_event`),
stamped in simulated seconds (each record at the time it was stamped on the
cluster's clock, whatever its writer's clock read); the actors' notes (the producer's sends, a
worker taking the message and what its handler will do) are merged in by
time. A message the producer sent twice (an acknowledgement lost) has two
originals, each with its own timeline.
"""

from __future__ import annotations

from kmq.core.message import HEADER_ORIGIN, header_text
from kmq.core.trace import Trace, TraceBuilder, describe_event
from kmq.dev.sim.clock import EPOCH_S
from kmq.dev.sim.workload import GROUP, QUEUE, message_id
from kmq.dev.sim.world import World

__all__ = ["traces", "timeline"]


def traces(world: World, mid: str) -> list[Trace]:
    """``kmq trace``'s answer for each original record of ``mid``."""
    c, q = world.cluster, world.queue
    out = []
    for p in range(world.workload.partitions):
        qlog = c.log(QUEUE, p)
        records = qlog.read(qlog.log_start, qlog.high_water - qlog.log_start)
        for orig in records:
            if message_id(orig.value) != mid or header_text(orig.headers, HEADER_ORIGIN) is not None:
                continue
            b = TraceBuilder(QUEUE, f"{QUEUE}/{p}/{orig.offset}")
            for rec in records:
                b.add_queue_record(p, rec.offset, rec.timestamp - rec.skew_ms, rec.key, rec.headers)
            mlog = c.log(q.markers_topic, p)
            for rec in mlog.read(mlog.log_start, mlog.high_water - mlog.log_start):
                b.add_marker_record(rec.offset, rec.timestamp - rec.skew_ms, rec.key, rec.value)
            for dp in range(world.workload.partitions):
                dlog = c.log(q.dlq_topic, dp)
                for rec in dlog.read(dlog.log_start, dlog.high_water - dlog.log_start):
                    b.add_dlq_record(dp, rec.offset, rec.timestamp - rec.skew_ms, rec.headers)
            out.append(b.result(c.clock.now_ms(), c.groups.committed(GROUP, (QUEUE, p))))
    return out


def _t(ts_ms: int) -> float:
    return ts_ms / 1000.0 - EPOCH_S


def timeline(world: World, mid: str) -> list[str]:
    """``mid``'s history, one line per event, in time order (see the module docstring)."""
    lines: list[tuple[float, str]] = []
    for n in world.notes.get(mid, []):
        t, text = n.split(" ", 1)
        lines.append((float(t), f"{t} {text}"))
    finals = []
    for tr in traces(world, mid):
        for e in tr.events:
            where = f"dlq {e.partition}:{e.offset}" if e.kind == "dead-lettered" else f"copy {e.partition}:{e.offset}"
            lines.append((_t(e.ts_ms), f"{_t(e.ts_ms):.6f} [{tr.origin}] {where:<14} {describe_event(e)}"))
        finals.append(f"[{tr.origin}] final state: {tr.state} ({tr.state_text}), {tr.deliveries} deliveries")
    lines.sort(key=lambda x: x[0])  # stable: a note before the log's event of the same instant
    return [text for _, text in lines] + finals
