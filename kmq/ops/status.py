"""A queue's state per partition, read from Kafka directly (``kmq status``).

Works while the tracker is down: through one :class:`~kmq.client.api.LogReader`
it reads the committed offsets of the workers and tracker groups, the log
bounds (the end from a fetch made now, never a latest-offset look-up) and
replays the markers from the tracker's committed offset to their end through
the pure :class:`~kmq.core.lease_state.PartitionState`, as a new tracker owner would.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from kmq.client import LogReader, LogReadError, Partition, open_log_reader
from kmq.client.topics import describe, require_aligned
from kmq.config import Config, QueueConfig
from kmq.core.errors import KmqError
from kmq.core.lease_state import PartitionState
from kmq.core.markers import BadMarker, decode_record

__all__ = ["PartitionStatus", "collect", "tracker_metrics", "age_text"]


@dataclass(frozen=True)
class PartitionStatus:
    partition: int
    in_flight: int
    oldest_age_s: float
    queue_lag: int | None  # queue high-water minus the workers group's committed offset
    marker_lag: int | None  # markers high-water minus the tracker group's committed offset
    dlq_size: int | None  # records in DLQ partition p (None: the DLQ has fewer partitions)
    bad_markers: int
    # Markers between the tracker's committed offset and the log start: deleted by retention before the
    # tracker read them (docs/operations.md, markers lost to retention).
    markers_lost: int = 0
    dlq_missing: bool = False  # the DLQ topic does not exist (dead letters wait, see docs/operations.md)
    scheduled: int = 0  # of in_flight: scheduled messages (kmq-not-before) waiting for their time


def _replay(reader: LogReader, q: QueueConfig, tps: list[Partition],
            start: dict[Partition, int | None]) -> dict[int, tuple[PartitionState, int]]:
    """Each markers partition replayed from ``start`` to its end, as a new tracker owner would:
    (state, bad markers) per partition."""
    states = {p: PartitionState(q.backoff.delay, q.max_deliveries, max_hold_ms=int(q.max_hold * 1000))
              for _t, p in tps}
    bad = dict.fromkeys(states, 0)
    for (_t, p), records in reader.scan({tp: start.get(tp) for tp in tps}):
        st = states[p]
        for rec in records:
            marker = decode_record(rec.key, rec.value, p)
            if isinstance(marker, BadMarker):
                st.skip(rec.offset)
                bad[p] += 1
            else:
                st.apply(marker, rec.offset, rec.timestamp)
    return {p: (st, bad[p]) for p, st in states.items()}


def collect(cfg: Config, queue: str, workers_group: str | None = None, tracker_group: str | None = None,
            now_ms: int | None = None, timeout_s: float = 30.0, group: str | None = None) -> list[PartitionStatus]:
    """Per queue partition: in-flight, oldest age, queue lag, marker lag, DLQ size, of the queue's
    consumer ``group`` (needed when the queue is configured for several).
    ``timeout_s``: how long a read waits for an answer from the broker."""
    q = cfg.queue(queue, group)
    layout = describe(cfg.kafka, q)
    if layout.dlq_partitions is None and layout.queue_partitions is not None and layout.markers_partitions is not None:
        dlq_missing = True  # still worth a status: the tracker keeps dead letters open until the DLQ exists
    else:
        layout, dlq_missing = require_aligned(cfg.kafka, q), False
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    n = layout.queue_partitions or 0
    qtps = [(q.name, p) for p in range(n)]
    mtps = [(q.markers_topic, p) for p in range(n)]
    dtps = [(q.dlq_topic, p) for p in range(layout.dlq_partitions or 0)]
    reader = open_log_reader(cfg.kafka, timeout_s)
    try:
        worker_off = reader.committed(workers_group or cfg.workers_group(q), qtps)
        tracker_off = reader.committed(tracker_group or cfg.tracker.group_id, mtps)
        bounds = reader.bounds(qtps + mtps + dtps)
        states = _replay(reader, q, mtps, tracker_off)
    except LogReadError as exc:
        raise LogReadError(f"reading the state of {q.name} failed: {exc}") from exc
    finally:
        reader.close()
    out = []
    for p in range(n):
        qtp, mtp = qtps[p], mtps[p]
        st, bad = states[p]
        wc, tc = worker_off[qtp], tracker_off[mtp]
        (q_start, q_end), (m_start, m_end) = bounds[qtp], bounds[mtp]
        dlq = None
        if p < len(dtps):
            d_start, d_end = bounds[dtps[p]]
            dlq = d_end - d_start
        out.append(PartitionStatus(
            partition=p, in_flight=st.in_flight, oldest_age_s=st.oldest_age_s(now_ms),
            queue_lag=q_end - (wc if wc is not None else q_start),
            marker_lag=m_end - (tc if tc is not None else m_start),
            dlq_size=dlq, bad_markers=bad,
            markers_lost=max(0, m_start - tc) if tc is not None else 0,
            dlq_missing=dlq_missing, scheduled=st.scheduled(now_ms),
        ))
    return out


def tracker_metrics(url: str, queue: str, timeout_s: float = 5.0) -> list[str]:
    """The ``kmq_tracker_*`` samples of ``queue`` (and unlabelled ones) from a tracker's /metrics.

    Left out: histogram buckets, and the ``*_created`` series prometheus_client adds to every
    counter and histogram (a creation timestamp, not a figure to read)."""
    url = url.rstrip("/")
    if not url.endswith("/metrics"):
        url += "/metrics"
    try:
        text = urllib.request.urlopen(url, timeout=timeout_s).read().decode()
    except (urllib.error.URLError, OSError) as exc:
        raise KmqError(f"cannot read the tracker's metrics at {url}: {exc}") from exc
    out = []
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not name.startswith("kmq_tracker_") or name.endswith(("_bucket", "_created")):
            continue
        if "{" not in line or f'queue="{queue}"' in line or "queue=" not in line:
            out.append(line)
    return out


def age_text(seconds: float) -> str:
    """An age as `kmq status` and the console show it: ``-``, ``12.3s``, ``4.5m`` or ``1.2h``."""
    if seconds <= 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"
