"""A queue's state per partition, read from Kafka directly (``kmq status``).

Works while the tracker is down: it reads the committed offsets of the
workers and tracker groups, the high-water marks (``consumer.highwater`` after
a fetch, never a latest-offset look-up) and replays the markers from the
tracker's committed offset through the pure
:class:`~kmq.core.lease_state.PartitionState`, as a new tracker owner would.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from kafka import TopicPartition
from kafka.errors import KafkaError

from kmq.client.kafka_python.clients import broker_errors, consumer as make_consumer
from kmq.config import Config, QueueConfig
from kmq.core.errors import KmqError, MarkerDecodeError
from kmq.core.markers import decode, decode_key
from kmq.client.topics import describe, require_aligned
from kmq.core.lease_state import PartitionState

__all__ = ["PartitionStatus", "collect", "tracker_metrics", "high_waters", "age_text"]


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


def _committed(cfg: Config, group: str, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
    c = make_consumer(cfg.kafka, group_id=group, enable_auto_commit=False)
    try:
        return {tp: c.committed(tp) for tp in tps}
    finally:
        c.close()


def high_waters(cfg: Config, tps: list[TopicPartition], timeout_s: float = 10.0) -> tuple[dict, dict]:
    """(high-water, log start) per partition: seek to the beginning and fetch once."""
    c = make_consumer(cfg.kafka, enable_auto_commit=False, max_partition_fetch_bytes=1024, fetch_max_wait_ms=50)
    try:
        c.assign(tps)
        c.seek_to_beginning(*tps)
        starts = {tp: c.position(tp) for tp in tps}
        deadline = time.monotonic() + timeout_s
        while any(c.highwater(tp) is None for tp in tps):
            c.poll(timeout_ms=100, max_records=1)
            if time.monotonic() > deadline:
                raise KmqError("timed out reading high-water marks: is the broker healthy?")
        return {tp: c.highwater(tp) for tp in tps}, starts
    finally:
        c.close()


def _replay(cfg: Config, q: QueueConfig, tps: list[TopicPartition], start: dict, now_ms: int,
            timeout_s: float) -> dict[int, tuple[PartitionState, int]]:
    states = {tp.partition: (PartitionState(q.backoff.delay, q.max_deliveries, max_hold_ms=int(q.max_hold * 1000)), 0)
              for tp in tps}
    c = make_consumer(cfg.kafka, enable_auto_commit=False, max_poll_records=5000, fetch_max_wait_ms=50)
    try:
        c.assign(tps)
        for tp in tps:
            if start.get(tp) is None:
                c.seek_to_beginning(tp)
            else:
                c.seek(tp, start[tp])
        target: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + timeout_s
        while True:
            for tp, recs in c.poll(timeout_ms=100).items():
                st, bad = states[tp.partition]
                for rec in recs:
                    if tp in target and rec.offset >= target[tp]:
                        break
                    try:
                        if decode_key(rec.key) != tp.partition:
                            raise MarkerDecodeError("key names another partition")
                        st.apply(decode(rec.value), rec.offset, rec.timestamp)
                    except MarkerDecodeError:
                        st.skip(rec.offset)
                        bad += 1
                states[tp.partition] = (st, bad)
            for tp in tps:
                if tp not in target and c.highwater(tp) is not None:
                    target[tp] = c.highwater(tp)
            if len(target) == len(tps) and all(c.position(tp) >= target[tp] for tp in tps):
                return states
            if time.monotonic() > deadline:
                raise KmqError(f"replaying the markers of {q.name} took longer than {timeout_s:g}s")
    finally:
        c.close()


def collect(cfg: Config, queue: str, workers_group: str | None = None, tracker_group: str | None = None,
            now_ms: int | None = None, timeout_s: float = 60.0) -> list[PartitionStatus]:
    """Per queue partition: in-flight, oldest age, queue lag, marker lag, DLQ size."""
    q = cfg.queue(queue)
    layout = describe(cfg.kafka, q)
    if layout.dlq_partitions is None and layout.queue_partitions is not None and layout.markers_partitions is not None:
        dlq_missing = True  # still worth a status: the tracker keeps dead letters open until the DLQ exists
    else:
        layout, dlq_missing = require_aligned(cfg.kafka, q), False
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    n = layout.queue_partitions or 0
    qtps = [TopicPartition(q.name, p) for p in range(n)]
    mtps = [TopicPartition(q.markers_topic, p) for p in range(n)]
    dtps = [TopicPartition(q.dlq_topic, p) for p in range(layout.dlq_partitions or 0)]
    try:
        with broker_errors(cfg.kafka):
            worker_off = _committed(cfg, workers_group or cfg.consumer.group_id, qtps)
            tracker_off = _committed(cfg, tracker_group or cfg.tracker.group_id, mtps)
            hws, starts = high_waters(cfg, qtps + mtps + dtps)
            states = _replay(cfg, q, mtps, tracker_off, now_ms, timeout_s)
    except KafkaError as exc:
        raise KmqError(f"reading the state of {q.name} failed: {exc}") from exc
    out = []
    for p in range(n):
        qtp, mtp = qtps[p], mtps[p]
        st, bad = states[p]
        wc = worker_off[qtp]
        tc = tracker_off[mtp]
        dlq = None
        if p < len(dtps):
            dlq = hws[dtps[p]] - starts[dtps[p]]
        out.append(PartitionStatus(
            partition=p, in_flight=st.in_flight, oldest_age_s=st.oldest_age_s(now_ms),
            queue_lag=hws[qtp] - (wc if wc is not None else starts[qtp]),
            marker_lag=hws[mtp] - (tc if tc is not None else starts[mtp]),
            dlq_size=dlq, bad_markers=bad,
            markers_lost=max(0, starts[mtp] - tc) if tc is not None else 0,
            dlq_missing=dlq_missing,
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
