"""Sinks of the lag job, written from ``foreachBatch`` and idempotent by batch id.

* **topic**: one JSON record per (queue, partition, window) to ``Q__kmq_metrics``,
  keyed ``"<partition>:<window_start_ms>"`` with the batch id in the value. After
  the records of batch N are acknowledged, N is recorded in
  ``<checkpoint>/kmq-sinks/topic-committed``; a batch re-run after a crash
  whose id is not above it is skipped. A crash between the acknowledgement and
  that note re-sends identical records with identical keys (readers keep the
  last value per key; the topic may be compacted).
* **parquet**: ``<path>/batch_id=N/`` written with mode overwrite, so a re-run
  replaces its own earlier attempt and never adds rows.
* **prometheus**: ``kmq_lag_*`` on the driver (labels queue, partition):
  per-window counts are added to monotonic counters and to the ack-latency
  histogram (so ``rate()`` works and no window is lost between scrapes); levels
  (in-flight, oldest age, marker lag) are gauges set from the newest window.
  Counters add each batch once: a batch id not above the last one added is
  skipped (a restarted driver starts its counters from zero, which Prometheus
  reads as a counter reset).

Marker lag (markers high-water mark seen by the job minus the tracker group's
committed offset) is looked up on the driver when a batch is written.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from kmq.config import Config
from kmq.core.errors import BrokerUnavailable, KmqError
from kmq.telemetry.metrics import LagMetrics
from kmq.core.lag_state import LATENCY_BUCKETS_MS, MARKER_TYPES
from kmq.spark.schema import OUTPUT_SCHEMA
from kmq.spark.stopping import BatchRefused
from kmq.spark.sink_retry import OUTAGE_BUDGET_S, retry_until

__all__ = ["BatchSinks", "LagJobMetrics", "row_key"]

log = logging.getLogger(__name__)


def row_key(row: dict) -> str:
    """Metrics-topic key of a window row: ``<partition>:<window_start_ms>``."""
    return f"{row['partition']}:{row['window_start_ms']}"


class LagJobMetrics(LagMetrics):
    """The ``kmq_lag_*`` metrics (declared in :mod:`kmq.telemetry.metrics`), fed from window rows."""

    def __init__(self, registry=None) -> None:
        super().__init__(registry, tuple(b / 1000 for b in LATENCY_BUCKETS_MS))
        self.last_added_batch = -1

    def add_batch(self, rows: list[dict], batch_id: int) -> bool:
        """Add a batch's windows (oldest first); False when this batch id was already added."""
        if batch_id <= self.last_added_batch:
            log.info("batch %d already in the Prometheus counters; skipped", batch_id)
            return False
        for r in _fold_per_partition(rows):
            self.update(r)
        self.last_added_batch = batch_id
        self.last_batch.set(batch_id)
        return True

    def update(self, row: dict) -> None:
        """Add one closed window's counts; set the levels at its end."""
        labels = (row["queue"], str(row["partition"]))
        for t in MARKER_TYPES:
            self.markers.labels(*labels, t).inc(row[f"markers_{t.lower()}"])
        self.bad_markers.labels(*labels).inc(row["bad_markers"])
        self.acked.labels(*labels).inc(row["acked"])
        self.redeliveries.labels(*labels).inc(row["redeliveries"])
        self.dead_letters.labels(*labels).inc(row["dead_letters"])
        self.missing.labels(*labels).inc(row["missing"])
        self.late_acks.labels(*labels).inc(row["late_acks"])
        if row.get("ack_latency_buckets") is not None:
            self.ack_latency.add(*labels, list(row["ack_latency_buckets"]), (row["ack_latency_sum_ms"] or 0) / 1000)
        self.in_flight.labels(*labels).set(row["in_flight"])
        self.oldest.labels(*labels).set((row["oldest_in_flight_ms"] or 0) / 1000)
        if row.get("marker_lag") is not None:
            self.marker_lag.labels(*labels).set(row["marker_lag"])
        self.window_end.labels(*labels).set(row["window_end_ms"] / 1000)


def _fold_per_partition(rows: list[dict]) -> list[dict]:
    """One row per queue partition with the same effect on the metrics as its windows one by
    one: counts and histograms summed, levels from the newest window. A catching-up batch
    closes thousands of windows; the Prometheus client's per-label calls cost more than the
    rest of the sink."""
    out: dict[tuple, dict] = {}
    for r in sorted(rows, key=lambda r: r["window_end_ms"]):
        key = (r["queue"], r["partition"])
        acc = out.get(key)
        if acc is None:
            acc = out[key] = dict(r)
            if r.get("ack_latency_buckets") is not None:
                acc["ack_latency_buckets"] = list(r["ack_latency_buckets"])
            continue
        for c in _SUMMED:
            acc[c] = (acc[c] or 0) + (r[c] or 0)
        if r.get("ack_latency_buckets") is not None:
            if acc.get("ack_latency_buckets") is None:
                acc["ack_latency_buckets"] = list(r["ack_latency_buckets"])
            else:
                acc["ack_latency_buckets"] = [a + b for a, b in zip(acc["ack_latency_buckets"], r["ack_latency_buckets"])]
        for c in ("in_flight", "oldest_in_flight_ms", "marker_lag", "window_end_ms"):  # levels: the newest
            if c in r:
                acc[c] = r[c]
    return list(out.values())


_SUMMED = (*(f"markers_{t.lower()}" for t in MARKER_TYPES), "bad_markers", "acked", "redeliveries",
           "dead_letters", "missing", "late_acks", "ack_latency_sum_ms")


class _CommittedBatch:
    """The last batch id a sink finished, kept next to Spark's checkpoint (any Hadoop FS)."""

    def __init__(self, spark, checkpoint: str, name: str) -> None:
        self.spark = spark
        self.path = f"{checkpoint.rstrip('/')}/kmq-sinks/{name}-committed"

    def _fs(self):
        jvm = self.spark.sparkContext._jvm
        p = jvm.org.apache.hadoop.fs.Path(self.path)
        return p, p.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration())

    def get(self) -> int:
        p, fs = self._fs()
        if not fs.exists(p):
            return -1
        stream = fs.open(p)
        try:
            reader = self.spark.sparkContext._jvm.java.io.BufferedReader(
                self.spark.sparkContext._jvm.java.io.InputStreamReader(stream))
            line = reader.readLine()
        finally:
            stream.close()
        return int(line.strip()) if line else -1

    def set(self, batch_id: int) -> None:
        p, fs = self._fs()
        jvm = self.spark.sparkContext._jvm
        tmp = jvm.org.apache.hadoop.fs.Path(self.path + ".tmp")
        out = fs.create(tmp, True)
        try:
            out.write(bytearray(f"{batch_id}\n".encode()))
        finally:
            out.close()
        fs.delete(p, False)
        fs.rename(tmp, p)


class BatchSinks:
    """Everything ``foreachBatch`` does with one micro-batch of window rows."""

    def __init__(self, spark, cfg: Config, checkpoint: str, sinks: tuple[str, ...], parquet_path: str | None = None,
                 prometheus_port: int | None = None, prometheus_host: str = "0.0.0.0") -> None:
        self.spark = spark
        self.cfg = cfg
        self.sinks = tuple(sinks)
        unknown = set(self.sinks) - {"topic", "prometheus", "parquet"}
        if unknown:
            raise KmqError(f"unknown sink(s) {', '.join(sorted(unknown))}: use topic, prometheus or parquet")
        if "parquet" in self.sinks and not parquet_path:
            raise KmqError("the parquet sink needs --parquet-path DIR")
        self.parquet_path = parquet_path
        self.metrics = LagJobMetrics()
        self.http_server = None
        self.http_port: int | None = None
        if "prometheus" in self.sinks and prometheus_port is not None:
            from prometheus_client import start_http_server

            server, _thread = start_http_server(prometheus_port, addr=prometheus_host, registry=self.metrics.registry)
            self.http_server = server
            self.http_port = server.server_port
            log.info("Prometheus metrics on http://%s:%d/metrics", prometheus_host, self.http_port)
        self._topic_committed = _CommittedBatch(spark, checkpoint, "topic") if "topic" in self.sinks else None
        self._producer: Any = None  # a producer of kmq.client
        self._offsets_admin = None
        self._refusing = False
        self._topics_ready: set[str] = set()
        #: Seconds a metrics topic write is retried through a broker outage before the job stops.
        self.sink_retry_budget = OUTAGE_BUDGET_S
        self.batches_written = 0
        self.windows_written = 0
        self.last_windows: list[tuple[int, int]] = []  # (start_ms, end_ms) of the last batch written

    @classmethod
    def from_options(cls, spark, cfg: Config, opts) -> "BatchSinks":
        return cls(spark, cfg, opts.checkpoint, opts.sinks, opts.parquet_path, opts.prometheus_port, opts.prometheus_host)

    # ------------------------------------------------------------ batch
    def refuse_batches(self) -> None:
        """From now on fail every batch at its start: the job is stopping (see :mod:`kmq.spark.stopping`)."""
        self._refusing = True

    def write_batch(self, df, batch_id: int) -> None:
        """The ``foreachBatch`` function."""
        if self._refusing:
            raise BatchRefused(f"the lag job is stopping: batch {batch_id} is left for the next start")
        pdf = df.toPandas()
        if len(pdf) == 0:
            self.last_windows = []
            return
        rows = [self._row(r) for r in pdf.to_dict("records")]
        self._add_marker_lag(rows)
        if "parquet" in self.sinks:
            self._write_parquet(df.sparkSession, rows, batch_id)
        if "topic" in self.sinks:
            self._write_topic(rows, batch_id)
        if "prometheus" in self.sinks:
            self.metrics.add_batch(rows, batch_id)
        self.batches_written += 1
        self.windows_written += len(rows)
        self.last_windows = [(r["window_start_ms"], r["window_end_ms"]) for r in rows]

    @staticmethod
    def _row(r: dict) -> dict:
        out: dict[str, Any] = {}
        for k, v in r.items():
            if k in ("window_start", "window_end"):
                out[f"{k}_ms"] = int(v.value // 1_000_000)
            elif v is None or (isinstance(v, float) and v != v):
                out[k] = None
            elif k in ("queue",):
                out[k] = str(v)
            elif k == "ack_latency_buckets":
                out[k] = [int(x) for x in v]
            else:
                out[k] = int(v)
        return out

    def _add_marker_lag(self, rows: list[dict]) -> None:
        from kmq.client import open_admin

        topics = {q.label: q.markers_topic for q in self.cfg.queues}
        keys = {(topics.get(r["queue"], f"{r['queue']}__markers"), r["partition"]) for r in rows}
        # One OffsetFetch for every partition of the batch (consumer.committed() asks once per
        # partition, a round trip each: with many partitions that was most of a batch's sink time).
        group = self.cfg.tracker.group_id

        def fetch():
            if self._offsets_admin is None:
                self._offsets_admin = open_admin(self.cfg.kafka)
            return self._offsets_admin.group_offsets(group, keys)

        try:
            # A short budget: marker lag is one column; the windows must not wait for it.
            committed = retry_until("marker lag (tracker offsets)", fetch, (KmqError, OSError), budget=5.0,
                                    reset=self._reset_admin)
        except (KmqError, OSError) as exc:
            self._reset_admin()
            log.warning("marker lag unknown for this batch (%s: %s): written without it", type(exc).__name__, exc)
            for r in rows:
                r["marker_lag"] = None
            return
        for r in rows:
            key = (topics.get(r["queue"], f"{r['queue']}__markers"), r["partition"])
            c = committed.get(key)
            r["marker_lag"] = max(0, r["markers_high_water"] - (c if c is not None and c > 0 else 0))

    def _reset_admin(self) -> None:
        admin, self._offsets_admin = self._offsets_admin, None
        if admin is not None:
            try:
                admin.close()
            except Exception:  # noqa: BLE001 - a client that lived through an outage: best effort
                pass

    def _reset_producer(self) -> None:
        from kmq.client import close_producer

        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                close_producer(producer, 1)
            except Exception:  # noqa: BLE001 - best effort, as above
                pass

    def _write_parquet(self, spark, rows: list[dict], batch_id: int) -> None:
        import pandas as pd

        pdf = pd.DataFrame(rows)
        for c in ("window_start", "window_end"):
            pdf[c] = pd.to_datetime(pdf[f"{c}_ms"], unit="ms", utc=True)
        pdf = pdf.drop(columns=["window_start_ms", "window_end_ms"])

        schema = OUTPUT_SCHEMA + ", marker_lag long"
        cols = [c.strip().split(" ")[0] for c in schema.split(",")]
        out = spark.createDataFrame(pdf[cols].astype(object).where(pdf[cols].notna(), None), schema)
        assert self.parquet_path is not None  # __init__ refuses the parquet sink without it
        out.coalesce(1).write.mode("overwrite").parquet(f"{self.parquet_path.rstrip('/')}/batch_id={batch_id}")

    def _write_topic(self, rows: list[dict], batch_id: int) -> None:
        assert self._topic_committed is not None
        if batch_id <= self._topic_committed.get():
            log.info("batch %d already in the metrics topic; skipped", batch_id)
            return
        from kmq.client import produce_errors, producer

        failures = (*produce_errors(), BrokerUnavailable, OSError)

        def send_all() -> None:
            if self._producer is None:
                self._producer = producer(self.cfg.kafka)
            futures = []
            for r in rows:
                topic = self.cfg.queue_labelled(r["queue"]).metrics_topic
                self._ensure_topic(topic)
                value = json.dumps({**r, "batch_id": batch_id}, separators=(",", ":")).encode()
                futures.append(self._producer.send(topic, key=row_key(r).encode(), value=value))
            self._producer.flush(timeout=30)
            for f in futures:
                f.get(timeout=30)

        # Through a broker outage: the batch waits (Spark starts no other meanwhile) and is written once
        # Kafka is back; a retry may repeat windows of this batch, identical and keyed (deduplicated).
        try:
            retry_until(f"metrics topic write of batch {batch_id}", send_all, failures,
                        budget=self.sink_retry_budget, reset=self._reset_producer)
        except failures as exc:
            raise KmqError(
                f"the metrics topic could not be written for {self.sink_retry_budget:.0f} s (batch {batch_id}: "
                f"{type(exc).__name__}: {exc}); is Kafka at {self.cfg.kafka.bootstrap_servers} reachable? The job "
                f"stops; started again it resumes from its checkpoint with this batch") from exc
        self._topic_committed.set(batch_id)

    def _ensure_topic(self, topic: str) -> None:
        if topic in self._topics_ready:
            return
        from kmq.client import open_admin

        admin = open_admin(self.cfg.kafka)
        try:
            if topic not in admin.topic_names():
                admin.create(topic, 1, 1, {})  # False: another process created it meanwhile
        finally:
            admin.close()
        self._topics_ready.add(topic)

    def close(self) -> None:
        """Flush and close clients, stop the HTTP endpoint."""
        if self._producer is not None:
            from kmq.client import close_producer

            close_producer(self._producer)
            self._producer = None
        if self._offsets_admin is not None:
            self._offsets_admin.close()
            self._offsets_admin = None
        if self.http_server is not None:
            self.http_server.shutdown()
            self.http_server = None


def parquet_rows(path: str) -> list[dict]:
    """Every row under a Parquet sink directory (pyarrow; for tests and tooling)."""
    import pyarrow.dataset as ds

    if not os.path.isdir(path):
        return []
    return ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pylist()
