"""The lag job: markers topics in, per-partition window statistics out.

Plan (Structured Streaming)::

    markers topics (kmq-kafka Python source, or Spark's "kafka" connector)
      -> kmq-kafka: the source tasks decode in bulk (kmq.core.markers_bulk) and emit one row per
         run of up to 20,000 records (kmq.spark.marker_chunks); Spark's connector: one row
         per record (queue, partition, marker offset, time (ms), key, value)
      -> groupBy(queue, partition).applyInPandasWithState: unpack the chunks (or decode the
         records in bulk; bad records become type BAD) and feed PartitionLagState.apply_decoded
         (open ranges + current window; processing-time timeout closes idle windows)
      -> foreachBatch: sinks (metrics topic, Prometheus, Parquet), idempotent by batch id

:func:`build_windows` returns the streaming DataFrame of closed windows;
:func:`start` starts the query with the sinks; :func:`run` is ``kmq lag-job``.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field, replace

from kmq.config import Config, SparkConfig
from kmq.core.errors import KmqError
from kmq.core.lag_state import PartitionLagState
from kmq.spark import connector as cn
from kmq.spark.connector_options import kafka_options
from kmq.spark.sink_retry import OUTAGE_BUDGET_S
from kmq.spark.schema import OUTPUT_COLUMNS, OUTPUT_SCHEMA, STATS_COLUMNS
from kmq.spark.stopping import StopRequest, await_query, quiet_spark_shutdown, stop_query

__all__ = [
    "JobOptions",
    "OUTPUT_SCHEMA",
    "SparkConnectorMissing",
    "LagJobFailed",
    "preflight",
    "spark_session",
    "read_markers",
    "source_options",
    "build_windows",
    "start",
    "run",
]

log = logging.getLogger(__name__)



class SparkConnectorMissing(KmqError):
    """Source ``kafka`` in a Spark whose classpath lacks Spark's Kafka connector (spark-submit without it)."""


class LagJobFailed(KmqError):
    """The streaming query stopped with an error (the first line says why)."""


def preflight(cfg: Config, opts: JobOptions) -> None:
    """Fail fast, with kmq's clear errors, when the broker or a markers topic is missing."""
    from kmq.client import open_log_reader
    from kmq.core.errors import TopicMissing

    reader = open_log_reader(cfg.kafka)
    try:
        for q in _queues(cfg, opts):
            if not reader.partition_count(q.markers_topic):
                raise TopicMissing(
                    f"markers topic {q.markers_topic!r} of queue {q.label!r} does not exist: run `kmq topics create`"
                )
    finally:
        reader.close()


def _summary(exc: BaseException) -> str:
    """The most telling line of a Spark/py4j error: a kmq error if any, else the last ``...Error: ...`` line."""
    text = str(getattr(exc, "desc", None) or exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    kmq_lines = [ln for ln in lines if ln.startswith("kmq.")]
    error_lines = [ln for ln in lines if "Error: " in ln and not ln.startswith(("File ", "at "))]
    best = kmq_lines or error_lines or lines or [repr(exc)]
    return best[-1][:500]


@dataclass
class JobOptions:
    """What ``kmq lag-job`` can be told; defaults suit a small cluster."""

    source: str | None = None  # kafka | python; None: spark.source of the config
    sinks: tuple[str, ...] = ("topic", "prometheus")
    checkpoint: str = "kmq-lag-checkpoint"
    trigger: str = "1 second"
    window_s: float = 10.0
    idle_close_s: float | None = None  # default: max(window, 2 s)
    parquet_path: str | None = None
    prometheus_port: int | None = 9109  # None: no metrics endpoint (kmq.bench)
    prometheus_host: str = "0.0.0.0"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = 1_000_000
    fail_on_data_loss: bool = True
    queues: tuple[str, ...] = ()  # empty = every configured queue
    spark_conf: dict[str, str] = field(default_factory=dict)

    @property
    def window_ms(self) -> int:
        return max(1, int(self.window_s * 1000))

    @property
    def idle_close_ms(self) -> int:
        s = self.idle_close_s if self.idle_close_s is not None else max(self.window_s, 2.0)
        return max(1, int(s * 1000))


# ------------------------------------------------------------------ session
def spark_session(opts: JobOptions, app_name: str = "kmq-lag-job", master: str | None = None,
                  spark_cfg: SparkConfig | None = None):
    """The SparkSession: reuses a running one (spark-submit), sets kmq's defaults otherwise.

    A Spark launched here for source ``kafka`` (``opts.source``, else ``spark_cfg.source``) gets
    Spark's Kafka connector at pyspark's version from the jars cache (:mod:`kmq.spark.connector`;
    the first start fills it from the Maven repository). A Spark that is already running (spark-submit,
    an earlier session) keeps its classpath; :func:`read_markers` says what to add when it lacks it.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    spark_cfg = spark_cfg or SparkConfig()
    given = SparkConf()
    b = SparkSession.builder.appName(app_name)
    launching = SparkContext._active_spark_context is None and not given.contains("spark.master")
    if master or not given.contains("spark.master"):
        b = b.master(master or "local[2]")
    defaults = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    }
    for k, v in defaults.items():
        if not given.contains(k):
            b = b.config(k, v)
    conf = dict(opts.spark_conf)
    connector, resolving = None, False
    if launching and (opts.source or spark_cfg.source) == "kafka":
        connector, extra, resolving = _connector_conf(spark_cfg, conf)
        conf.update(extra)
    for k, v in conf.items():
        b = b.config(k, v)
    try:
        spark = b.getOrCreate()
    except Exception as exc:  # pyspark's JAVA_GATEWAY_EXITED: the JVM stopped before it started Spark
        if not resolving:
            raise
        assert connector is not None  # resolving: _connector_conf gave one
        raise cn.ConnectorUnavailable(
            f"Spark did not start while resolving its Kafka connector {connector.coordinate} from "
            f"{spark_cfg.maven_repository} into {cn.home(spark_cfg.jars_cache, connector)} (the report above says "
            "why: an artifact Ivy could not fetch, or Java itself); check spark.maven_repository, or set "
            "spark.source: python") from exc
    if resolving:
        assert connector is not None
        cn.mark_cached(spark_cfg.jars_cache, connector)
    return spark


def _connector_conf(spark_cfg: SparkConfig, conf: dict[str, str]) -> tuple[cn.Connector, dict[str, str], bool]:
    """The connector, the Spark configuration that loads it, and whether Spark must resolve it
    (nothing cached yet). Jars and packages the user listed are kept."""
    c = cn.installed()
    if cn.is_cached(spark_cfg.jars_cache, c):
        extra = cn.cached_conf(spark_cfg.jars_cache, c)
        key, resolving = "spark.jars", False
    else:
        log.warning("fetching Spark's Kafka connector %s from %s into %s (once)", c.coordinate,
                    spark_cfg.maven_repository, cn.home(spark_cfg.jars_cache, c))
        cn.check_reachable(spark_cfg.maven_repository, c, spark_cfg.jars_cache)
        extra = cn.prepare(spark_cfg.jars_cache, spark_cfg.maven_repository, c)
        key, resolving = "spark.jars.packages", True
    if conf.get(key):
        extra[key] = f"{conf[key]},{extra[key]}"
    return c, extra, resolving


# ------------------------------------------------------------------ source
def _queues(cfg: Config, opts: JobOptions):
    # A queue's consumer groups are watched apart, each by its label (orders, orders__billing).
    qs = [cfg.queue_labelled(n) for n in opts.queues] if opts.queues else list(cfg.queues)
    if not qs:
        raise KmqError("no queue to watch: list queues in the config (queues:) or pass --queue NAME")
    return qs


def source_options(cfg: Config) -> dict[str, str]:
    """The connection options of the kmq-kafka source: ``kafka:`` of kmq.yaml as one serialized
    :class:`~kmq.config.KafkaConfig` (the source's driver and tasks rebuild it and connect through
    kmq's client settings), with the job's client id and the passwords read here, so the
    executors need no password file."""
    from kmq.client.secrets import key_password, sasl_password
    from kmq.spark.source import KAFKA_OPTION

    k = cfg.kafka
    kafka = replace(k, client_id=f"{k.client_id}-lag-job", sasl_password=sasl_password(k), sasl_password_file=None,
                    ssl_password=key_password(k), ssl_password_file=None)
    return {KAFKA_OPTION: kafka.to_json()}


def kafka_connector_available(spark) -> bool:
    """True when Spark's own Kafka source is on the classpath."""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(
            cn.CONNECTOR_CLASS, False, spark.sparkContext._jvm.Thread.currentThread().getContextClassLoader()
        )
        return True
    except Exception:  # py4j wraps ClassNotFoundException
        return False


def read_markers(spark, cfg: Config, opts: JobOptions, marker_chunks: bool = True):
    """The markers stream of the watched queues.

    Source ``kafka`` (``opts.source``, else ``spark.source`` of the config) gives Spark's Kafka
    source columns, one row per record. The kmq-kafka source (``python``) gives decoded chunks
    (:mod:`kmq.spark.marker_chunks`), or with ``marker_chunks=False`` the same per-record
    columns as Spark's source.
    """
    topics = ",".join(q.markers_topic for q in _queues(cfg, opts))
    source = opts.source or cfg.spark.source
    if source == "kafka":
        sec = kafka_options(cfg.kafka)  # refuses what the Java client cannot be given, before Spark is asked
        if not kafka_connector_available(spark):
            c = cn.installed()
            raise SparkConnectorMissing(
                f"source kafka needs Spark's Kafka connector, which is not on this Spark's classpath: add "
                f"--packages {c.coordinate} to spark-submit (or set spark.jars.packages), or use "
                "spark.source: python / --source python (no jars needed)"
            )
        fmt = "kafka"
        # Ride through a broker outage as the Python source does: offset look-ups retried once a
        # second and tasks waiting for their records, for the outage budget.
        sec["fetchOffset.retryIntervalMs"] = "1000"
        sec["fetchOffset.numRetries"] = str(int(OUTAGE_BUDGET_S))
        sec["kafkaConsumer.pollTimeoutMs"] = str(int(OUTAGE_BUDGET_S * 1000))
    elif source == "python":
        from kmq.spark.source import SOURCE_NAME, register

        register(spark)
        fmt, sec = SOURCE_NAME, source_options(cfg)
        # The source decodes markers itself and hands over one row per run of records
        # (kmq.spark.marker_chunks): Spark's per-row cost would otherwise dominate the job.
        sec["markerChunks"] = str(marker_chunks).lower()
        # Ride through a broker outage: tasks wait for the records they know exist (default 30 s).
        sec.setdefault("pollTimeoutMs", str(int(OUTAGE_BUDGET_S * 1000)))
    else:
        raise KmqError(f"unknown source {source!r}: use kafka or python")
    r = (spark.readStream.format(fmt)
         .option("subscribe", topics)
         .option("startingOffsets", opts.starting_offsets)
         .option("failOnDataLoss", str(opts.fail_on_data_loss).lower())
         # The job never reads headers; without them the source builds no list per record.
         .option("includeHeaders", "false"))
    if opts.max_offsets_per_trigger:
        r = r.option("maxOffsetsPerTrigger", str(opts.max_offsets_per_trigger))
    for k, v in sec.items():
        r = r.option(k, v)
    return r.load()


# ------------------------------------------------------------------ state
def _stateful(window_ms: int, idle_close_ms: int):
    def update(key, pdfs, state):
        import warnings

        import pandas as pd

        from kmq.core.markers_bulk import decode_records
        from kmq.spark.marker_chunks import unpack

        # pyspark's own applyInPandasWithState code concatenates all-NA padding frames,
        # which pandas 2.x warns about on every batch; it is not ours to fix (runs in workers only).
        warnings.filterwarnings("ignore", message="The behavior of DataFrame concatenation with empty or all-NA",
                                category=FutureWarning)

        queue, partition = key
        st = PartitionLagState.from_json(state.get[0]) if state.exists else PartitionLagState(int(partition), window_ms)
        closed = []
        if state.hasTimedOut:
            closed.extend(st.expire(state.getCurrentProcessingTimeMs(), 0))
            if st.current is not None:  # its end is still ahead of the clock: look again then
                state.setTimeoutDuration(max(1, st.current.window_end_ms - state.getCurrentProcessingTimeMs()))
        else:
            # Rows of one key may arrive in several pieces and in any order: sort by marker offset.
            frames = [p for p in pdfs if len(p)]
            if frames and "chunk" in frames[0].columns:  # the kmq-kafka source's decoded chunks
                pdf = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
                if not pdf["first_offset"].is_monotonic_increasing:
                    pdf = pdf.sort_values("first_offset", kind="stable")
                for cell in pdf["chunk"].tolist():
                    offsets, ts_ms, d = unpack(cell)
                    closed.extend(st.apply_decoded(offsets.tolist(), ts_ms.tolist(), d))
            elif frames:  # raw records (Spark's Kafka connector)
                pdf = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
                if not pdf["moffset"].is_monotonic_increasing:
                    pdf = pdf.sort_values("moffset", kind="stable")
                # Bulk decode (numpy; bad records become BAD rows), then one pass over the batch;
                # offsets below the state's high-water mark were applied already and are skipped.
                d = decode_records(pdf["value"].tolist(), pdf["key"].tolist(), pdf["partition"].to_numpy())
                closed.extend(st.apply_decoded(pdf["moffset"].tolist(), pdf["ts_ms"].tolist(), d))
            state.setTimeoutDuration(idle_close_ms)
        state.update((st.to_json(),))
        if closed:
            rows = []
            for w in closed:
                r = w.as_row()
                r["queue"] = queue
                r["window_start"] = pd.Timestamp(w.window_start_ms, unit="ms", tz="UTC")
                r["window_end"] = pd.Timestamp(w.window_end_ms, unit="ms", tz="UTC")
                r.pop("window_start_ms")
                r.pop("window_end_ms")
                rows.append(r)
            out = pd.DataFrame(rows, columns=OUTPUT_COLUMNS)
            for c in (*STATS_COLUMNS, "ack_latency_sum_ms"):
                out[c] = out[c].astype("object")
            yield out

    return update


def build_windows(spark, cfg: Config, opts: JobOptions, markers=None):
    """Streaming DataFrame of closed windows (:data:`OUTPUT_SCHEMA`) per queue partition."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    queues = _queues(cfg, opts)
    raw = markers if markers is not None else read_markers(spark, cfg, opts)
    from pyspark.sql import functions as F

    topic_to_queue = F.create_map(*[F.lit(x) for q in queues for x in (q.markers_topic, q.label)])
    # Decoding happens inside the stateful step, batch-wise with kmq.core.markers_bulk:
    # one Python hop per record instead of two (see docs/spark.md).
    queue = F.coalesce(topic_to_queue[F.col("topic")], F.col("topic")).alias("queue")
    if "chunk" in raw.columns:  # kmq-kafka with markerChunks: decoded in the source, one row per run
        decoded = raw.select(queue, F.col("partition").cast("int").alias("partition"), "first_offset", "chunk")
    else:
        decoded = raw.select(
            queue,
            F.col("partition").cast("int").alias("partition"),
            F.col("offset").alias("moffset"),
            F.unix_millis(F.col("timestamp")).alias("ts_ms"),
            "key",
            "value",
        )
    return decoded.groupBy("queue", "partition").applyInPandasWithState(
        _stateful(opts.window_ms, opts.idle_close_ms),
        outputStructType=OUTPUT_SCHEMA,
        stateStructType="state string",
        outputMode="append",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )


def start(spark, cfg: Config, opts: JobOptions, sinks=None):
    """Start the streaming query with its sinks; returns (query, sinks)."""
    from kmq.spark.sinks import BatchSinks

    if sinks is None:
        sinks = BatchSinks.from_options(spark, cfg, opts)
    windows = build_windows(spark, cfg, opts)
    q = (windows.writeStream
         .foreachBatch(sinks.write_batch)
         .option("checkpointLocation", opts.checkpoint)
         .trigger(processingTime=opts.trigger)
         .queryName("kmq-lag-job")
         .start())
    return q, sinks


def run(cfg: Config, opts: JobOptions, master: str | None = None) -> None:
    """``kmq lag-job``: run until stopped (SIGTERM/Ctrl-C stop the query cleanly)."""
    preflight(cfg, opts)
    with StopRequest() as stop:
        spark = spark_session(opts, master=master, spark_cfg=cfg.spark)
        sinks = None
        try:
            query, sinks = start(spark, cfg, opts)
            log.info("lag job running: query %s, checkpoint %s", query.id, opts.checkpoint)
            try:
                if await_query(query, stop):
                    stop_query(spark, query, sinks)
            except Exception as exc:  # StreamingQueryException and py4j errors: one clear line
                if isinstance(exc, KmqError):
                    raise
                raise LagJobFailed(f"the lag job stopped: {_summary(exc)}") from exc
        finally:
            if sinks is not None:
                sinks.close()
            if stop.requested:
                quiet_spark_shutdown(spark)
            spark.stop()
    if stop.requested:
        log.info("lag job stopped")
