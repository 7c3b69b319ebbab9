"""``kmq bench spark``: the lag job's throughput and end-to-end latency at local[2].

Both markers sources (``spark.source``) one after the other, side by side in one
report: ``kafka`` (Spark's own connector) and ``python`` (the kmq-kafka source, read
with ``--client``). Each runs in its own Spark, started as the lag job starts it.
Two phases per source against one markers topic (an embedded broker unless ``--bootstrap``):

1. **throughput**: a backlog of START/END markers is written first, then the job
   reads it; markers/s = marker records read (end minus start offsets) / trigger
   execution time over the batches after the warm-up (Spark's own progress
   reports), with the mean per-phase time of a batch (``steady_batch_ms``).
2. **latency**: with the job caught up, markers are written live (record time =
   now) at ``--rate`` per second; for every window row the sink records when it
   wrote the row. Reported: sink time minus window end (the newest marker of the
   window) and minus window start (its oldest marker).
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
import threading
import time
from typing import Any

import click

from kmq.bench.per_client import per_client
from kmq.core import markers as mk
from kmq.core.ranges import OffsetRange

__all__ = ["command", "run"]

log = logging.getLogger(__name__)


def _marker_records(partitions: int, count: int, t0_ms: int, spacing_ms: float, first_offsets: dict[int, int]):
    """START/END pairs, 10 offsets each, round-robin over partitions (made as they are sent:
    a backlog of millions is not held in memory)."""
    for i in range(count // 2):
        p = i % partitions
        off = first_offsets[p]
        first_offsets[p] = off + 10
        ts = int(t0_ms + i * 2 * spacing_ms)
        yield p, ts, mk.encode_key(p), mk.encode(mk.Start(ranges=(OffsetRange(off, 10),), lease_ms=30_000, owner="bench"))
        yield p, ts + 1, mk.encode_key(p), mk.encode(mk.End(ranges=(OffsetRange(off, 10),)))


def _offsets(value) -> dict:
    if isinstance(value, str):
        value = json.loads(value)
    return {(t, p): int(o) for t, parts in (value or {}).items() for p, o in parts.items()}


def batch_markers(progress) -> int:
    """Marker records a micro-batch read: its end offsets minus its start offsets.

    Not ``numInputRows``: the lag job's source emits one row per run of markers
    (kmq.spark.marker_chunks), so rows undercount markers.
    """
    total = 0
    for src in progress["sources"]:
        # The first batch has no start offset: it read from the log start, 0 on the bench's fresh topic.
        start, end = _offsets(src["startOffset"]), _offsets(src["endOffset"])
        total += sum(off - start.get(tp, 0) for tp, off in end.items())
    return total


def _produce(cfg, topic: str, records) -> None:
    """Write the backlog with the bench's client (``kafka.client``: confluent writes millions in seconds)."""
    from kmq.client.factory import producer

    p = producer(cfg.kafka, linger=0.02, batch_size=256 * 1024)
    try:
        for part, ts, k, v in records:
            p.send(topic, key=k, value=v, partition=part, timestamp_ms=ts)
        p.flush()
    finally:
        p.close()


def _fence(cfg, topic: str, partitions: int) -> None:
    """One RENEW of an acked range per partition, each alone in its produce request, after the
    backlog: a broker whose latest-offset look-up answers the first offset of the last batch plus
    one (the embedded tansu) then still reports every backlog marker to Spark's connector, which
    plans with that look-up. Harmless on every Kafka (a RENEW of closed offsets is only counted)."""
    from kmq.client.factory import producer

    p = producer(cfg.kafka)
    try:
        for part in range(partitions):
            p.send(topic, key=mk.encode_key(part), value=mk.encode(mk.Renew(ranges=(OffsetRange(0, 10),), lease_ms=30_000)),
                   partition=part, timestamp_ms=int(time.time() * 1000) - 3_600_000)
            p.flush()
    finally:
        p.close()


def run(bootstrap: str | None = None, partitions: int = 4, markers: int = 8_000_000, rate: int = 2_000,
        latency_seconds: float = 20.0, trigger: str = "1s", window: str = "1s",
        max_offsets_per_trigger: int = 1_000_000, client: str = "kafka-python",
        clients: tuple[str, ...] | None = None, source: str = "python",
        sources: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Run both phases; returns the figures. With ``sources``, one run per source, one after the
    other: ``{source: figures}`` (the ``python`` entry per client when ``clients`` are given). With
    ``clients``, one run of the Python source per client (its ``kafka.client``): ``{client: figures}``.
    Spark's connector reads with its own Java client; ``client`` then only writes the backlog."""
    if sources:
        return {s: run(bootstrap, partitions, markers, rate, latency_seconds, trigger, window, max_offsets_per_trigger,
                       (clients or (client,))[0] if s == "kafka" else client, clients if s == "python" else None, s)
                for s in sources}
    if clients:
        return per_client(clients, lambda c: run(bootstrap, partitions, markers, rate, latency_seconds, trigger, window,
                                                  max_offsets_per_trigger, c, source=source))
    from kmq.config import Config, parse_duration
    from kmq.dev.broker import DevBroker
    from kmq.spark.job import JobOptions, spark_session, start
    from kmq.spark.sinks import BatchSinks
    from kmq.spark.stopping import stop_query
    from kmq.client.topics import ensure_topics

    broker = None
    if bootstrap is None:
        broker = DevBroker()
        broker.start()
        bootstrap = broker.bootstrap
    queue = f"bench-spark-{int(time.time())}"
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": bootstrap, "client": client}, "queues": [{"name": queue}],
                            "tracker": {"group_id": f"{queue}-tracker"}})
    q = cfg.queues[0]
    workdir = tempfile.mkdtemp(prefix="kmq-bench-spark-")
    spark = query = sinks = None
    written: list[tuple[float, int, int]] = []
    try:
        ensure_topics(cfg.kafka, q, partitions)
        offsets = {p: 0 for p in range(partitions)}
        t0 = int(time.time() * 1000) - 3_600_000  # the backlog lies an hour back
        t_write = time.monotonic()
        _produce(cfg, q.markers_topic, _marker_records(partitions, markers, t0, 3_000_000 / markers, offsets))
        _fence(cfg, q.markers_topic, partitions)
        write_s = time.monotonic() - t_write
        opts = JobOptions(source=source, sinks=("prometheus",), checkpoint=f"{workdir}/ck",
                          trigger=f"{int(parse_duration(trigger) * 1000)} milliseconds",
                          window_s=parse_duration(window), prometheus_port=None,
                          max_offsets_per_trigger=max_offsets_per_trigger)
        spark = spark_session(opts, app_name=f"kmq-bench-spark-{source}")
        spark.sparkContext.setLogLevel("ERROR")

        class TimedSinks(BatchSinks):
            def write_batch(self, df, batch_id):
                pdf_rows = super().write_batch(df, batch_id)
                now = time.time()
                for ws, we in self.last_windows:
                    written.append((now, ws, we))
                return pdf_rows

        sinks = TimedSinks(spark, cfg, opts.checkpoint, opts.sinks, prometheus_port=None)
        query, _ = start(spark, cfg, opts, sinks)
        # Phase 1: drain the backlog.
        deadline = time.monotonic() + 600
        while True:
            done = sum(batch_markers(p) for p in query.recentProgress)
            if done >= markers + partitions or time.monotonic() > deadline:  # the backlog and its fences
                break
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.5)
        progress = [p for p in query.recentProgress if batch_markers(p) > 0]
        # The first two batches start the Python workers and their Kafka consumers: warm-up.
        steady = progress[2:] if len(progress) > 3 else progress[1:] if len(progress) > 2 else progress
        rows = sum(batch_markers(p) for p in steady)
        ms = sum(p["durationMs"]["triggerExecution"] for p in steady)
        throughput = rows / (ms / 1000) if ms else 0.0
        # Phase 2: live markers at `rate` per second.
        written.clear()
        stop = threading.Event()
        start_live = time.time()

        def writer():
            from kmq.client.kafka_python.clients import producer

            prod = producer(cfg.kafka, linger_ms=5)
            try:
                tick = 0.1
                per_tick = max(2, int(rate * tick))
                nxt = time.monotonic()
                while not stop.is_set():
                    now_ms = int(time.time() * 1000)
                    for part, ts, k, v in _marker_records(partitions, per_tick, now_ms, 0, offsets):
                        prod.send(q.markers_topic, key=k, value=v, partition=part, timestamp_ms=ts)
                    prod.flush()
                    nxt += tick
                    time.sleep(max(0.0, nxt - time.monotonic()))
            finally:
                prod.close()

        seen_batches = {p["batchId"] for p in query.recentProgress}
        th = threading.Thread(target=writer, daemon=True)
        th.start()
        # At least latency_seconds; longer while no live window was written yet (up to a minute):
        # on a loaded machine the first live batch can outlast a short run, and a run without a
        # single window measures nothing.
        until, give_up = time.monotonic() + latency_seconds, time.monotonic() + latency_seconds + 60

        def measured() -> bool:
            return any(ws / 1000 >= start_live + 2 for _, ws, _ in list(written))

        while time.monotonic() < until or (time.monotonic() < give_up and not measured()):
            time.sleep(0.2)
        stop.set()
        th.join(30)
        live_batches = [p for p in query.recentProgress if p["batchId"] not in seen_batches and batch_markers(p) > 0]
        live = [(now, ws, we) for now, ws, we in written if ws / 1000 >= start_live + 2]  # skip the ramp-up
        to_end = sorted(now - we / 1000 for now, ws, we in live)
        to_start = sorted(now - ws / 1000 for now, ws, we in live)

        def pct(xs, q_):
            return round(xs[min(len(xs) - 1, int(q_ * len(xs)))], 3) if xs else None

        return {
            "source": source,
            "client": client if source == "python" else f"Spark's connector (backlog written with {client})",
            "partitions": partitions,
            "backlog_markers": markers,
            "backlog_write_s": round(write_s, 2),
            "steady_batches": len(steady),
            "markers_per_s": round(throughput),
            "live_rate_markers_per_s": rate,
            "live_windows": len(live),
            "latency_window_end_to_sink_s": {"p50": pct(to_end, 0.5), "p95": pct(to_end, 0.95), "max": pct(to_end, 1.0)},
            "latency_window_start_to_sink_s": {"p50": pct(to_start, 0.5), "p95": pct(to_start, 0.95), "max": pct(to_start, 1.0)},
            # Where a steady batch's time goes, by Spark's own progress report (ms, mean per batch):
            # addBatch is reading, state and sinks; the rest is planning and checkpoint writes.
            "steady_batch_ms": {k: round(statistics.mean(p["durationMs"].get(k, 0) for p in steady))
                                for k in sorted(steady[0]["durationMs"])} if steady else None,
            "mean_batch_s": round(statistics.mean(p["durationMs"]["triggerExecution"] for p in steady) / 1000, 3) if steady else None,
            "live_mean_batch_s": round(statistics.mean(p["durationMs"]["triggerExecution"] for p in live_batches) / 1000, 3)
            if live_batches else None,
            "trigger": trigger,
            "window": window,
        }
    finally:
        if query is not None:
            stop_query(spark, query, sinks)  # at a batch boundary: no cancelled-job stack traces
        if sinks is not None:
            sinks.close()
        if spark is not None:
            spark.stop()
        if broker is not None:
            broker.stop()


@click.command("spark")
@click.option("--bootstrap", default=None, help="Use this broker instead of an embedded one.")
@click.option("--partitions", default=4, show_default=True)
@click.option("--markers", default=8_000_000, show_default=True,
              help="Backlog size for the throughput phase (8 batches at the default cap: 2 warm-up, 6 measured).")
@click.option("--rate", default=2_000, show_default=True, help="Live markers/s in the latency phase.")
@click.option("--latency-seconds", default=20.0, show_default=True)
@click.option("--trigger", default="1s", show_default=True)
@click.option("--window", default="1s", show_default=True)
@click.option("--max-offsets-per-trigger", default=1_000_000, show_default=True,
              help="Markers per micro-batch (the lag job's default).")
@click.option("--client", type=click.Choice(["kafka-python", "confluent"]), default="kafka-python", show_default=True,
              help="Client the Python source's tasks read markers with (kafka.client); it writes the backlog too.")
@click.option("--source", type=click.Choice(["both", "kafka", "python"]), default="both", show_default=True,
              help="Markers source (spark.source): both runs Spark's connector, then the Python source.")
def command(source: str, **opts) -> None:
    """Lag job: markers/s in steady state and marker-to-sink latency, per markers source."""
    figures = run(sources=("kafka", "python"), **opts) if source == "both" else run(source=source, **opts)
    click.echo(json.dumps(figures, indent=2))
    if source == "both":
        click.echo("catch-up markers/s: " + ", ".join(f"{s} {figures[s].get('markers_per_s', 0):,}" for s in figures),
                   err=True)
