"""Every kmq Prometheus metric, declared once (docs/operations.md explains them).

Metrics live in a :class:`prometheus_client.CollectorRegistry`. A consumer
records into the application's default registry (``prometheus_client.REGISTRY``,
what ``start_http_server()`` and most web-framework exporters serve) unless
it is given :class:`ConsumerMetrics` of its own; every consumer of a process
shares one set of ``kmq_consumer_*`` metrics per registry
(:meth:`ConsumerMetrics.shared`), told apart by the ``queue`` label. The
tracker and the lag job pass the registry they serve.
"""

from __future__ import annotations

import platform
import threading
import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import HistogramMetricFamily

from kmq.version import __version__

__all__ = ["ConsumerMetrics", "TrackerMetrics", "LagMetrics", "LATENCY_BUCKETS", "register_process_metrics",
           "exported_metric_names", "observe_many"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


_SHARED: "weakref.WeakKeyDictionary[CollectorRegistry, ConsumerMetrics]" = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


class ConsumerMetrics:
    """``kmq_consumer_*``: what a worker process did.

    ``ConsumerMetrics()`` makes metrics in a registry of their own (or in ``registry``);
    :meth:`shared` gives the one set of a registry, the default one unless told otherwise."""

    @classmethod
    def shared(cls, registry: CollectorRegistry | None = None) -> "ConsumerMetrics":
        """The process's consumer metrics in ``registry`` (default: ``prometheus_client.REGISTRY``),
        created on first use: a registry can hold each metric name only once."""
        registry = REGISTRY if registry is None else registry
        with _SHARED_LOCK:
            metrics = _SHARED.get(registry)
            if metrics is None:
                metrics = _SHARED[registry] = cls(registry)
            return metrics

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.messages = Counter(
            "kmq_consumer_messages_total", "Messages by outcome (received, acked, nacked, rejected, renewed)",
            ["queue", "outcome"], registry=r,
        )
        self.in_flight = Gauge(
            "kmq_consumer_in_flight", "Messages handed to user code and not yet settled", ["queue", "partition"], registry=r,
        )
        self.lease_expired = Counter(
            "kmq_consumer_lease_expired_total",
            "Messages handed to user code whose lease ended unsettled and unrenewed: they no longer count against "
            "flow control or the in-flight cap, the tracker redelivers them; a later settlement is still written",
            ["queue"], registry=r,
        )
        self.copies_skipped = Counter(
            "kmq_consumer_copies_skipped_total",
            "Copies made for another consumer group of the queue (kmq-group names it): committed past, never "
            "STARTed or delivered here", ["queue"], registry=r,
        )
        self.poll_interval_exceeded = Counter(
            "kmq_consumer_poll_interval_exceeded_total",
            "Times the application took no message for consumer.max_poll_interval while messages were ready: "
            "the consumer gave its partitions up (left the group) until the application took again",
            ["queue"], registry=r,
        )
        self.marker_write_seconds = Histogram(
            "kmq_consumer_marker_write_seconds", "Time to write START markers and get Kafka's acknowledgement",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        # Settlement markers (END/RENEW/NACK/REJECT) whose write failed (kmq/consumer/marker_sender.py), counted in the
        # messages they cover: a given-up marker means that many messages are processed again after their leases.
        self.markers_retried = Counter(
            "kmq_consumer_markers_retried_total",
            "Messages whose settlement marker was sent again after a failed write, by marker type",
            ["queue", "type"], registry=r,
        )
        self.markers_given_up = Counter(
            "kmq_consumer_markers_given_up_total",
            "Messages whose settlement marker was given up (not acknowledged within consumer.marker_retry_budget, "
            "or at close); the tracker redelivers them when their leases end",
            ["queue", "type"], registry=r,
        )
        # consumer.ordering: key (kmq/consumer/keyed_ready.py): what per-key ordering holds back.
        self.ordering_held = Gauge(
            "kmq_consumer_ordering_held_messages",
            "Messages ready but held back because an earlier message of their key is in user code or awaits its "
            "redelivered copy (consumer.ordering: key)",
            ["queue"], registry=r,
        )
        self.ordering_keys_blocked = Gauge(
            "kmq_consumer_ordering_keys_blocked",
            "Keys with messages held back (consumer.ordering: key)", ["queue"], registry=r,
        )
        self.ordering_released = Counter(
            "kmq_consumer_ordering_released_total",
            "Keys released without the redelivered copy of their failed message, after waiting for it longer than "
            "max_deliveries x (lease + backoff.max): that copy is handled after later messages of its key",
            ["queue"], registry=r,
        )
        # consumer.ordering: key across a change of partition owner (kmq/consumer/key_recovery.py).
        self.ordering_inherited_keys = Gauge(
            "kmq_consumer_ordering_inherited_keys",
            "Keys waiting for a message an earlier owner of their partition left unsettled (its copy, or its "
            "settlement in the markers) before their next message goes (consumer.ordering: key)",
            ["queue"], registry=r,
        )
        self.ordering_recoveries = Counter(
            "kmq_consumer_ordering_recoveries_total",
            "Assigned partitions whose earlier owner's unsettled messages were looked up, by result: inherited "
            "(keys held for them), clean (none), given_up (over the budget or a failed read: the partition's keys "
            "go on without them)",
            ["queue", "result"], registry=r,
        )
        self.ordering_recovery_records = Counter(
            "kmq_consumer_ordering_recovery_records_total",
            "Records read to learn what an earlier partition owner left unsettled, by topic (markers, queue)",
            ["queue", "topic"], registry=r,
        )
        self.markers_awaiting_retry = Gauge(
            "kmq_consumer_markers_awaiting_retry",
            "Messages whose settlement marker failed and is not written yet (waiting for a retry or being resent)",
            ["queue"], registry=r,
        )


class TrackerMetrics:
    """``kmq_tracker_*``: the redelivery tracker's view."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.markers = Counter("kmq_tracker_markers_total", "Marker records read, by type", ["queue", "type"], registry=r)
        self.in_flight = Gauge("kmq_tracker_in_flight", "Open (started, not closed) messages", ["queue", "partition"], registry=r)
        self.oldest_in_flight_seconds = Gauge(
            "kmq_tracker_oldest_in_flight_seconds", "Age of the oldest open message", ["queue", "partition"], registry=r,
        )
        self.redelivered = Counter(
            "kmq_tracker_redelivered_total", "Messages re-produced to the queue", ["queue", "reason"], registry=r,
        )
        self.dead_lettered = Counter(
            "kmq_tracker_dead_lettered_total", "Messages produced to the DLQ", ["queue", "reason"], registry=r,
        )
        self.late_acks = Counter("kmq_tracker_late_acks_total", "END/RENEW for offsets already closed", ["queue"], registry=r)
        self.redelivery_delay_seconds = Histogram(
            "kmq_tracker_redelivery_delay_seconds", "Actual redelivery time minus due time", buckets=LATENCY_BUCKETS, registry=r,
        )
        self.marker_lag = Gauge(
            "kmq_tracker_marker_lag", "Markers high-water mark minus the tracker's position", ["queue", "partition"], registry=r,
        )
        self.bad_markers = Counter("kmq_tracker_bad_markers_total", "Undecodable marker records skipped", registry=r)
        self.newer_markers = Counter(
            "kmq_tracker_newer_markers_total",
            "Markers of a newer wire version than this tracker reads, by handling (read: by their version-1 "
            "fields; held: not readable so, the partition held at it until a newer tracker reads it)",
            ["queue", "version", "handling"], registry=r,
        )
        self.held_partitions = Gauge(
            "kmq_tracker_held_partitions",
            "Owned markers partitions held at a marker of a newer wire version (nothing after it is applied)",
            ["queue"], registry=r,
        )
        self.clock_skew_seconds = Gauge(
            "kmq_tracker_clock_skew_seconds",
            "Tracker read time minus record timestamp of an owner's START markers read at the log end, the least "
            "per metrics interval (positive: the owner's clock is behind the tracker's)", ["queue", "owner"], registry=r,
        )
        self.clock_jumps = Counter(
            "kmq_tracker_clock_jumps_total",
            "Jumps of the tracker's own clock against its monotonic clock, by direction (back: every partition "
            "is re-read before a lease is judged)", ["direction"], registry=r,
        )
        self.clock_jump_seconds = Counter(
            "kmq_tracker_clock_jump_seconds_total", "How far the tracker's own clock jumped, summed, by direction",
            ["direction"], registry=r,
        )
        self.missing_offsets = Counter(
            "kmq_tracker_missing_offsets_total",
            "Offsets deleted from the queue log (below its log start) before redelivery, closed as outcome 3", ["queue"], registry=r,
        )
        self.past_log_end = Counter(
            "kmq_tracker_offsets_past_log_end_total",
            "Due offsets a START names that a read of the queue log ended below (not yet there as read: held back "
            "and read again, never closed), counted at each such read",
            ["queue"], registry=r,
        )
        self.lookup_failures = Counter(
            "kmq_tracker_lookup_failures_total",
            "Look-ups of a markers partition's log end (catch-up target, read-through mark) the broker did not "
            "answer; that partition is asked again with its own backoff",
            ["queue"], registry=r,
        )
        self.redelivery_failures = Counter(
            "kmq_tracker_redelivery_failures_total", "Redelivery attempts that failed and will be retried", ["queue"], registry=r,
        )
        self.producer_replacements = Counter(
            "kmq_tracker_producer_replacements_total",
            "Producers of copies the tracker closed and replaced, by reason (fatal: the client reported a fatal "
            "error; refused_id: the broker refused its producer id; undecided: it left sends undecided past its "
            "delivery timeout)", ["reason"], registry=r,
        )
        # Set by the service with set_function: evaluated at scrape time, like /readyz.
        self.ready = Gauge("kmq_tracker_ready", "1 when joined and caught up on every assigned partition (/readyz)",
                           registry=r)

        # Hostile records and failure paths: bounded, counted, visible.
        self.record_failures = Counter(
            "kmq_tracker_record_failures_total",
            "Failed sends of one record's copy or dead letter, by cause (retried, dead-lettered or closed)",
            ["queue", "cause"], registry=r,
        )
        self.undeliverable = Counter(
            "kmq_tracker_undeliverable_total",
            "Messages closed without any copy (CLOSED outcome 4): neither the queue nor the DLQ took them",
            ["queue", "cause"], registry=r,
        )
        self.failing_offsets = Gauge(
            "kmq_tracker_failing_offsets", "Open messages held back after failed redelivery attempts",
            ["queue", "partition"], registry=r,
        )
        self.markers_lost = Counter(
            "kmq_tracker_markers_lost_total",
            "Marker records deleted by retention before the tracker read them (committed offset below the log start)",
            ["queue"], registry=r,
        )
        self.marker_offset_resets = Counter(
            "kmq_tracker_marker_offset_resets_total",
            "Committed marker offsets not found in the markers log (below_log_start: retention; beyond_log_end)",
            ["queue", "kind"], registry=r,
        )
        self.retention_used_ratio = Gauge(
            "kmq_tracker_retention_used_ratio",
            "Age of the oldest open START divided by the markers retention (1 = its marker is about to be deleted)",
            ["queue", "partition"], registry=r,
        )
        self.stale_copies = Counter(
            "kmq_tracker_stale_copies_total",
            "Copies written by a tracker that was paused past its session timeout (possible duplicates)",
            ["queue"], registry=r,
        )
        self.fenced_commits = Counter(
            "kmq_tracker_fenced_commits_total", "Marker offset commits the group refused (stale membership)", registry=r,
        )
        self.stale_views = Counter(
            "kmq_tracker_stale_views_total",
            "Times the tracker dropped its in-memory view (paused past the session timeout, or fenced) and re-read",
            registry=r,
        )
        register_process_metrics(r)


class AckLatencyHistogram:
    """``kmq_lag_ack_latency_seconds``: a Prometheus histogram per (queue, partition) fed with
    whole bucket counts (the lag job counts acks per latency bucket in each window, so
    observing one value at a time would be pointless). Cumulative ``le`` buckets, ``_sum``
    and ``_count``, monotonic for the life of the process: ``histogram_quantile()`` over
    ``rate(..._bucket[5m])`` gives percentiles that aggregate across partitions."""

    name = "kmq_lag_ack_latency_seconds"
    _doc = "Ack latency (END time - START time) of acked offsets"

    def __init__(self, bounds_s: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.bounds_s = tuple(bounds_s)
        self._series: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        registry.register(self)

    def add(self, queue: str, partition: str, counts: list[int], sum_s: float) -> None:
        """Add one window: ``counts[i]`` acks at or below ``bounds_s[i]`` (non-cumulative), the last
        entry is the overflow bucket; ``sum_s`` is the latencies' total in seconds."""
        if len(counts) != len(self.bounds_s) + 1:
            raise ValueError(f"expected {len(self.bounds_s) + 1} bucket counts, got {len(counts)}")
        buckets, total = self._series.setdefault((queue, partition), ([0] * len(counts), [0.0]))
        for i, n in enumerate(counts):
            buckets[i] += int(n)
        total[0] += sum_s

    def describe(self):
        return [HistogramMetricFamily(self.name, self._doc, labels=["queue", "partition"])]

    def collect(self):
        fam = HistogramMetricFamily(self.name, self._doc, labels=["queue", "partition"])
        for (queue, partition), (buckets, total) in sorted(self._series.items()):
            cumulative, running = [], 0
            for bound, n in zip((*(repr(float(b)) for b in self.bounds_s), "+Inf"), buckets):
                running += n
                cumulative.append((bound, running))
            fam.add_metric([queue, partition], cumulative, total[0])
        yield fam


class LagMetrics:
    """``kmq_lag_*``: the Spark lag job's metrics (label names as the tracker's: queue, partition).

    Events counted per closed window are monotonic counters (``rate()`` them; a scrape
    interval longer than the window loses nothing); levels at a window's end are gauges;
    ack latency is a histogram.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 ack_latency_bounds_s: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r, qp = self.registry, ["queue", "partition"]
        # counters: per-window counts added up
        self.markers = Counter("kmq_lag_markers_total", "Marker records read, by type", [*qp, "type"], registry=r)
        self.bad_markers = Counter("kmq_lag_bad_markers_total", "Undecodable marker records", qp, registry=r)
        self.acked = Counter("kmq_lag_acked_total", "Offsets acknowledged (END)", qp, registry=r)
        self.redeliveries = Counter("kmq_lag_redeliveries_total", "Offsets redelivered (CLOSED outcome 1)", qp, registry=r)
        self.dead_letters = Counter("kmq_lag_dead_letters_total", "Offsets dead-lettered (CLOSED outcome 2)", qp, registry=r)
        self.missing = Counter("kmq_lag_missing_offsets_total", "Offsets missing from the queue log (CLOSED outcome 3)",
                               qp, registry=r)
        self.late_acks = Counter("kmq_lag_late_acks_total", "END markers for offsets already closed", qp, registry=r)
        self.ack_latency = AckLatencyHistogram(ack_latency_bounds_s, r)
        # gauges: levels at the end of the newest closed window
        self.in_flight = Gauge("kmq_lag_in_flight", "Offsets started and not closed, at the window end", qp, registry=r)
        self.oldest = Gauge("kmq_lag_oldest_in_flight_seconds", "Age of the oldest open offset at the window end", qp, registry=r)
        self.marker_lag = Gauge("kmq_lag_marker_lag", "Markers high-water mark minus the tracker's committed offset", qp, registry=r)
        self.window_end = Gauge("kmq_lag_window_end_timestamp_seconds", "End of the last closed window", qp, registry=r)
        self.last_batch = Gauge("kmq_lag_last_batch_id", "Last micro-batch written by the sinks", registry=r)
        register_process_metrics(r)


def observe_many(histogram: Histogram, amount: float, n: int) -> None:
    """``histogram.observe(amount)`` ``n`` times, in one update of the bucket and the sum where the
    histogram's layout is the one prometheus_client has had for years (else one observe each): the
    tracker observes one redelivery delay per copy, and copies of one START share their due time."""
    buckets, bounds, total = (getattr(histogram, a, None) for a in ("_buckets", "_upper_bounds", "_sum"))
    if n <= 0:
        return
    if buckets is None or bounds is None or total is None or len(buckets) != len(bounds):
        for _ in range(n):
            histogram.observe(amount)
        return
    total.inc(amount * n)
    for i, bound in enumerate(bounds):
        if amount <= bound:
            buckets[i].inc(n)
            break


def register_process_metrics(registry: CollectorRegistry) -> None:
    """``process_*`` (CPU, memory, open fds, start time; Linux) and ``kmq_build_info`` in ``registry``."""

    ProcessCollector(registry=registry)
    info = Gauge("kmq_build_info", "kmq version and Python version of this process (always 1)",
                 ["version", "python"], registry=registry)
    info.labels(__version__, platform.python_version()).set(1)


def exported_metric_names(components: tuple[type, ...] = (ConsumerMetrics, TrackerMetrics, LagMetrics)) -> set[str]:
    """Every sample name kmq's ``components`` (default: all) can export (``_total``,
    ``_bucket``/``_sum``/``_count`` included), from the declarations above: dashboards and alert
    rules are checked against it (``(ConsumerMetrics,)``: what a worker process exports)."""
    names: set[str] = set()
    for component in components:
        registry = CollectorRegistry()
        component(registry)
        for family in registry.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                        "summary": ("", "_sum", "_count"), "info": ("_info",)}.get(family.type, ("",))
            names.update(family.name + sfx for sfx in suffixes)
    return names

