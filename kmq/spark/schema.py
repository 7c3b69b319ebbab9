"""The lag job's output rows: one per closed window of a queue partition.

Shared by the job (which builds them) and its sinks (which write them); no
pyspark import, so the sinks' tests can use it without a Spark session.
"""

from __future__ import annotations

from kmq.core.lag_state import MARKER_TYPES

__all__ = ["STATS_COLUMNS", "HISTOGRAM_COLUMNS", "OUTPUT_SCHEMA", "OUTPUT_COLUMNS"]

STATS_COLUMNS = (
    [f"markers_{t.lower()}" for t in MARKER_TYPES]
    + ["bad_markers", "acked", "in_flight", "oldest_in_flight_ms", "ack_p50_ms", "ack_p95_ms", "ack_p99_ms",
       "redeliveries", "dead_letters", "missing", "late_acks", "markers_high_water"]
)
# The ack-latency histogram of the window (counts per lag_state.LATENCY_BUCKETS_MS bucket,
# the last one open) and its exact sum: what the Prometheus sink's histogram is built from.
HISTOGRAM_COLUMNS = ["ack_latency_sum_ms", "ack_latency_buckets"]
OUTPUT_SCHEMA = (
    "queue string, partition int, window_start timestamp, window_end timestamp, "
    + ", ".join(f"{c} long" for c in STATS_COLUMNS)
    + ", ack_latency_sum_ms long, ack_latency_buckets array<long>"
)
OUTPUT_COLUMNS = ["queue", "partition", "window_start", "window_end", *STATS_COLUMNS, *HISTOGRAM_COLUMNS]
