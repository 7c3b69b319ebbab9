"""``kmq bench share``: native Kafka share groups beside kmq's share API and KmqConsumer, one run.

Three variants (:mod:`kmq.bench.share_child`) on the same broker, the same topic layout
(``--partitions``, default 4) and the same handler (a CRC of the value, ``--processing-ms`` of
sleep, then ACCEPT / ``ack()`` of every message), each run in its own process and group:
``native`` (``confluent_kafka.ShareConsumer``), ``kmq-share`` (:class:`kmq.share.ShareConsumer`,
``kafka.client`` confluent) and ``kmq`` (:class:`kmq.KmqConsumer`, confluent). Measured:

1. throughput: ``--messages`` records of ``--size`` bytes pre-produced to one topic, each run in
   a fresh group, from the first record handed to the handler to the last acknowledgement sent
   (kmq: every END in Kafka); ``--rounds`` rounds, the variants' order rotating; the median.
2. latency at a fixed offered rate: ``--rate`` records/s for ``--rate-seconds``, each carrying its
   send time (``time.time()``, the same machine), produced round robin over the partitions while
   the variant consumes; p50/p95/p99 of handler time minus send time, after a 1 s warm-up. Every
   variant runs with its client's defaults; the native consumer runs once more with
   ``fetch.wait.max.ms`` :data:`TUNED_FETCH_WAIT_MS` (librdkafka's default, 500 ms, lets it fall
   behind a live rate), reported beside the others.
3. CPU per message: the consumer process's CPU (user + system) over the throughput run divided
   by its messages (and over the latency run by its records). kmq's tracker is not in it: it is
   a service of its own (and idle in these two phases).
4. lock expiry to redelivery: ``--samples`` records each received and never acknowledged, with the
   broker's lock duration (group config ``share.record.lock.duration.ms``) and kmq's lease both
   ``--lease``; the delay from (first arrival + lock) to the redelivered record's arrival at a
   handler, on a topic of one partition (a native share group gives each of several partitions to
   one member, so a stuck member's partition would keep the record). Native: a second consumer
   of the group receives it (the first one stops polling: a stuck worker; a share consumer in
   explicit mode cannot poll on while a record is unacknowledged). KmqConsumer: the same
   consumer, polling on with ``consumer.auto_renew`` off (as a native lock is not extended), gets
   the tracker's copy (a tracker runs in this process, ``backoff.initial`` ``--kmq-backoff``, default 0 as a lock expiry has none
   natively). ``kmq-share`` is not measured here: in explicit mode it refuses to poll on while a
   record is unacknowledged, as natively, and kmq writes the copy to the record's partition,
   which the stuck consumer keeps, so no other member could receive it.

Without ``--bootstrap`` an Apache Kafka broker (:class:`kmq.dev.kafka.KafkaCluster`, one node,
share groups on, lock duration ``--lease``) is started for the run and stopped at the end, also on
errors and Ctrl-C. With ``--bootstrap`` the broker must have share groups (Kafka 4.2+) and allow
``--lease`` as a group lock duration (``group.share.min.record.lock.duration.ms``).
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import click

from kmq.bench.live_child import result_of_fed_child
from kmq.bench.share_child import VARIANTS
from kmq.core.errors import DevBrokerError

__all__ = ["command", "run"]

#: The latency phase also runs the native consumer with this ``fetch.wait.max.ms`` (librdkafka's default
#: is 500 ms; at a live rate the native share consumer then falls behind, see docs/benchmarks.md).
TUNED_FETCH_WAIT_MS = 10
#: Kafka's default lock duration, given to the throughput and latency groups (and the same kmq lease).
DEFAULT_LOCK_S = 30.0


def _spawn(phase: str, variant: str, args: dict, timeout: float) -> dict:
    code = f"from kmq.bench.share_child import child; child({phase!r}, {variant!r}, {json.dumps(args)!r})"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired as exc:
        raise click.ClickException(f"{variant} {phase} run did not finish in {timeout + 60:.0f}s") from exc
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise click.ClickException(f"{variant} {phase} run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


class _Kafka:
    """Admin work on the broker: topics, share group configs, producing."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    def topic(self, prefix: str, partitions: int) -> str:
        """A fresh queue topic with kmq's markers and DLQ topics beside it."""
        from kmq.client.topics import ensure_topics
        from kmq.config import Config

        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        cfg = Config.from_dict({"kafka": {"bootstrap_servers": self.bootstrap, "client": "confluent"},
                                "queues": [{"name": name}]})
        ensure_topics(cfg.kafka, cfg.queues[0], partitions)
        return name

    def share_group(self, group: str, lock_s: float) -> None:
        """A native group reading from the earliest offset (a new one starts at the end) with this lock duration."""
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("share.record.lock.duration.ms", str(int(lock_s * 1000)),
                        incremental_operation=AlterConfigOpType.SET)])
        try:
            for f in self.admin.incremental_alter_configs([res]).values():
                f.result(30)
        except Exception as exc:  # noqa: BLE001 - any refusal means the same to the user
            raise click.ClickException(
                f"the broker at {self.bootstrap} refused the share group config of {group} ({exc}): it needs share "
                f"groups (Apache Kafka 4.2+, group.share.enable) and a lock duration of {lock_s:g}s allowed "
                "(group.share.min/max.record.lock.duration.ms); pick another --lease or broker") from exc

    def produce(self, topic: str, messages: int, size: int, partitions: int) -> None:
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20, "batch.size": 512 * 1024})
        value = b"x" * size
        deadline = time.monotonic() + 600
        for i in range(messages):
            while True:
                try:
                    p.produce(topic, value=value, partition=i % partitions)
                    break
                except BufferError:  # the producer's queue is full: let it send
                    if time.monotonic() > deadline:
                        raise click.ClickException(f"producing {messages} records to {topic} took over 600 s") from None
                    p.poll(0.05)
        if p.flush(120) != 0:
            raise click.ClickException(f"producing {messages} records to {topic} did not finish in 120 s")


def _produce_at(bootstrap: str, topic: str, rate: int, size: int, partitions: int, stop: threading.Event,
                seconds: float) -> None:
    """``rate`` records a second in 1 ms steps, each starting with its send time, until ``stop`` (or ``seconds``)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    pad = b"x" * max(0, size - 20)
    owed, i = 0.0, 0
    next_at = end = time.monotonic()
    end += seconds
    while not stop.is_set() and time.monotonic() < end:
        owed += rate * 0.001
        while owed >= 1:
            p.produce(topic, value=b"%020.6f" % time.time() + pad, partition=i % partitions)
            i += 1
            owed -= 1
        p.poll(0)
        next_at += 0.001
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    p.flush(10)


def _latency_run(kafka: _Kafka, variant: str, args: dict, rate: int, size: int, timeout: float) -> dict:
    """The probe record, the child, the live producer once the child got the probe."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": kafka.bootstrap})
    p.produce(args["topic"], value=b"%020.6f" % time.time(), partition=0)
    p.flush(10)
    code = f"from kmq.bench.share_child import child; child('latency', {variant!r}, {json.dumps(args)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    producer = threading.Thread(target=_produce_at, daemon=True, args=(
        kafka.bootstrap, args["topic"], rate, size, args["partitions"], stop, timeout))
    return result_of_fed_child(proc, producer, stop, f"{variant} latency run")


def _tracker(bootstrap: str, topic: str, lease: float, backoff: float) -> Any:
    from kmq.config import Config
    from tracker.service import Tracker

    cfg = Config.from_dict({
        "kafka": {"bootstrap_servers": bootstrap, "session_timeout": "6s", "heartbeat_interval": "1s",
                  "client": "confluent"},
        "queues": [{"name": topic, "lease": f"{lease}s",
                    "backoff": {"initial": f"{backoff}s", "max": f"{max(backoff, 1.0)}s"}}],
        "tracker": {"group_id": f"bench-share-tracker-{uuid.uuid4().hex[:8]}", "http_port": 0},
    })
    t = Tracker(cfg, http_host="127.0.0.1").start()
    deadline = time.monotonic() + 60
    while not t.ready()[0]:
        if time.monotonic() > deadline:
            t.stop()
            raise click.ClickException("kmq's tracker was not ready within 60 s")
        time.sleep(0.05)
    return t


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else None


def _start_broker(bootstrap: str | None, lease: float) -> tuple[str, Any]:
    if bootstrap is not None:
        return bootstrap, None
    from kmq.dev.kafka import KafkaCluster

    lock_ms = str(int(lease * 1000))
    cluster = KafkaCluster(settings={"group.share.record.lock.duration.ms": lock_ms,
                                     "group.share.min.record.lock.duration.ms": str(min(1000, int(lease * 1000)))})
    try:
        cluster.start()
    except DevBrokerError as exc:
        raise click.ClickException(f"could not start Apache Kafka for the bench: {exc} (or pass --bootstrap host:port)") from exc
    return cluster.bootstrap, cluster


def run(messages: int = 200_000, size: int = 100, partitions: int = 4, rounds: int = 3, processing_ms: float = 0.0,
        rate: int = 2000, rate_seconds: float = 10.0, lease: float = 2.0, samples: int = 3, kmq_backoff: float = 0.0,
        bootstrap: str | None = None, timeout: float = 600.0, echo: Any = None) -> dict:
    """Run the three phases; returns the figures (human lines through ``echo``)."""
    say = echo or (lambda *_: None)
    if size < 21:
        raise click.ClickException("--size must be at least 21 bytes: a latency record starts with its 20-byte send time")
    bootstrap, cluster = _start_broker(bootstrap, lease)
    tracker = None
    try:
        kafka = _Kafka(bootstrap)
        base = {"bootstrap": bootstrap, "partitions": partitions, "processing_ms": processing_ms, "timeout": timeout,
                "lease_s": DEFAULT_LOCK_S}

        def group(phase: str, variant: str, lock: float) -> str:
            g = f"bench-share-{phase}-{variant}-{uuid.uuid4().hex[:8]}"
            if variant == "native":
                kafka.share_group(g, lock)
            return g

        # 1 + 3: throughput and CPU per message
        topic = kafka.topic("bench-share", partitions)
        t = time.perf_counter()
        kafka.produce(topic, messages, size, partitions)
        say(f"produced {messages} x {size} B to {topic} ({partitions} partitions) in {time.perf_counter() - t:.1f}s; "
            f"handler: crc32 + {processing_ms:g} ms, ack every message")
        tp: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for r in range(rounds):
            for variant in VARIANTS[r % 3:] + VARIANTS[:r % 3]:
                args = {**base, "topic": topic, "messages": messages, "group": group("tp", variant, DEFAULT_LOCK_S)}
                res = _spawn("throughput", variant, args, timeout)
                res["rate"] = res["messages"] / res["seconds"]
                res["cpu_us_per_message"] = res["cpu_seconds"] / res["messages"] * 1e6
                tp[variant].append(res)
                say(f"round {r + 1} {variant:9s}: {res['rate']:>9,.0f} msg/s ({res['seconds']:.2f}s, CPU "
                    f"{res['cpu_us_per_message']:.1f} us/msg, redelivered {res['redelivered']}, "
                    f"peak RSS {res['rss_mb']:.0f} MB)")
        # 2: latency at a fixed rate
        lat: dict[str, dict] = {}
        for variant in VARIANTS:
            ltopic = kafka.topic("bench-share-lat", partitions)
            args = {**base, "topic": ltopic, "seconds": rate_seconds, "group": group("lat", variant, DEFAULT_LOCK_S)}
            lat[variant] = _latency_run(kafka, variant, args, rate, size, min(timeout, rate_seconds + 120))
            x = lat[variant]
            if not x["measured"]:
                raise click.ClickException(f"{variant}: no record of the rate phase reached the handler")
            say(f"latency {variant:9s}: p50 {x['p50_ms']:.1f} ms, p95 {x['p95_ms']:.1f} ms, p99 {x['p99_ms']:.1f} ms "
                f"({x['measured']} records at {rate}/s; CPU {x['cpu_seconds'] / max(1, x['handled']) * 1e6:.0f} us/msg)")
        ltopic = kafka.topic("bench-share-lat", partitions)
        args = {**base, "topic": ltopic, "seconds": rate_seconds, "group": group("lat", "native", DEFAULT_LOCK_S),
                "native_extra": {"fetch.wait.max.ms": TUNED_FETCH_WAIT_MS}}
        x = lat["native-tuned"] = _latency_run(kafka, "native", args, rate, size, min(timeout, rate_seconds + 120))
        if not x["measured"]:
            raise click.ClickException("native (tuned): no record of the rate phase reached the handler")
        say(f"latency native with fetch.wait.max.ms {TUNED_FETCH_WAIT_MS}: p50 {x['p50_ms']:.1f} ms, p95 "
            f"{x['p95_ms']:.1f} ms, p99 {x['p99_ms']:.1f} ms ({x['measured']} records at {rate}/s)")
        # 4: lock expiry to redelivery
        # One partition: a native share group assigns each of several partitions to one member, and
        # the stuck member's partition would hold the redelivered record too.
        rtopic = {v: kafka.topic(f"bench-share-re-{v}", 1) for v in ("native", "kmq")}
        tracker = _tracker(bootstrap, rtopic["kmq"], lease, kmq_backoff)
        red: dict[str, dict] = {}
        for variant in ("native", "kmq"):
            args = {**base, "topic": rtopic[variant], "partitions": 1, "samples": samples, "lease_s": lease,
                    "timeout": min(timeout, 60.0), "group": group("re", variant, lease)}
            got = _spawn("redelivery", variant, args, samples * (lease + 60) + 60)
            delays = [s["delay_ms"] for s in got["samples"]]
            red[variant] = {"delay_ms": delays, "median_ms": statistics.median(delays), "max_ms": max(delays)}
            say(f"redelivery {variant:9s}: lock expiry -> handler median {red[variant]['median_ms']:.0f} ms, max "
                f"{red[variant]['max_ms']:.0f} ms ({', '.join(f'{d:.0f}' for d in delays)}; lock/lease {lease:g}s)")
        red["kmq-share"] = {"delay_ms": [], "median_ms": None, "max_ms": None,
                            "not_measured": "explicit mode refuses to poll on while a record is unacknowledged, and "
                                            "kmq copies to the record's partition, kept by the stuck consumer"}
        return _summary(tp, lat, red, dict(messages=messages, size=size, partitions=partitions, rounds=rounds,
                                           processing_ms=processing_ms, rate=rate, rate_seconds=rate_seconds,
                                           lease_s=lease, samples=samples, kmq_backoff_s=kmq_backoff,
                                           broker="started" if cluster is not None else bootstrap), say)
    finally:
        if tracker is not None:
            tracker.stop()
        if cluster is not None:
            cluster.stop()


def _summary(tp: dict, lat: dict, red: dict, params: dict, say: Any) -> dict:
    out: dict[str, Any] = {**params, "variants": {}}
    for v in VARIANTS:
        out["variants"][v] = {
            "msgs_per_s": [x["rate"] for x in tp[v]], "msgs_per_s_median": _median([x["rate"] for x in tp[v]]),
            "cpu_us_per_message_median": _median([x["cpu_us_per_message"] for x in tp[v]]),
            "redelivered_during_throughput": sum(x["redelivered"] for x in tp[v]),
            "peak_rss_mb": max(x["rss_mb"] for x in tp[v]),
            "p50_ms": lat[v]["p50_ms"], "p95_ms": lat[v]["p95_ms"], "p99_ms": lat[v]["p99_ms"],
            "latency_measured": lat[v]["measured"],
            "latency_cpu_us_per_message": lat[v]["cpu_seconds"] / max(1, lat[v]["handled"]) * 1e6,
            "redelivery_delay_ms": red[v]["delay_ms"], "redelivery_delay_median_ms": red[v]["median_ms"],
            "redelivery_delay_max_ms": red[v]["max_ms"],
        }
        if "not_measured" in red[v]:
            out["variants"][v]["redelivery_not_measured"] = red[v]["not_measured"]
    tuned = lat["native-tuned"]
    out["native_tuned_latency"] = {"fetch_wait_max_ms": TUNED_FETCH_WAIT_MS, "p50_ms": tuned["p50_ms"],
                                   "p95_ms": tuned["p95_ms"], "p99_ms": tuned["p99_ms"], "measured": tuned["measured"]}
    nat = out["variants"]["native"]
    for v, name in (("kmq-share", "kmq_share"), ("kmq", "kmq")):
        x = out["variants"][v]
        ratios = [a["rate"] / b["rate"] for a, b in zip(tp[v], tp["native"])]
        out[f"{name}_vs_native"] = {
            "throughput_ratio_median": statistics.median(ratios), "throughput_ratio_per_round": ratios,
            "cpu_per_message_ratio": x["cpu_us_per_message_median"] / nat["cpu_us_per_message_median"],
            "p50_diff_ms": x["p50_ms"] - nat["p50_ms"], "p99_diff_ms": x["p99_ms"] - nat["p99_ms"],
            "p99_diff_to_tuned_native_ms": x["p99_ms"] - tuned["p99_ms"],
            "redelivery_delay_diff_ms": (x["redelivery_delay_median_ms"] - nat["redelivery_delay_median_ms"]
                                         if x["redelivery_delay_median_ms"] is not None else None),
        }
    say("")
    say(f"{'':28s}{'native':>12s}{'kmq.share':>12s}{'KmqConsumer':>12s}")
    rows = (("throughput msg/s (median)", "msgs_per_s_median", "{:,.0f}"),
            ("CPU us/message", "cpu_us_per_message_median", "{:.1f}"),
            ("latency p50 ms", "p50_ms", "{:.1f}"), ("latency p95 ms", "p95_ms", "{:.1f}"),
            ("latency p99 ms", "p99_ms", "{:.1f}"),
            ("lock expiry->redelivery ms", "redelivery_delay_median_ms", "{:.0f}"),
            ("  (max)", "redelivery_delay_max_ms", "{:.0f}"))
    for label, key, fmt in rows:
        cells = [out["variants"][v][key] for v in VARIANTS]
        say(f"{label:28s}" + "".join(f"{fmt.format(c) if c is not None else '-':>12s}" for c in cells))
    say(f"native with fetch.wait.max.ms {TUNED_FETCH_WAIT_MS}: p50 {tuned['p50_ms']:.1f} ms, p95 "
        f"{tuned['p95_ms']:.1f} ms, p99 {tuned['p99_ms']:.1f} ms")
    for name, label in (("kmq_share", "kmq.share/native"), ("kmq", "KmqConsumer/native")):
        r = out[f"{name}_vs_native"]
        diff = r["redelivery_delay_diff_ms"]
        say(f"{label}: throughput x{r['throughput_ratio_median']:.2f}, CPU/msg x{r['cpu_per_message_ratio']:.2f}, "
            f"p99 {r['p99_diff_ms']:+.1f} ms ({r['p99_diff_to_tuned_native_ms']:+.1f} ms against native with "
            f"fetch.wait.max.ms {TUNED_FETCH_WAIT_MS}), redelivery delay "
            + (f"{diff:+.0f} ms" if diff is not None else "not measured (see the module docstring)"))
    return out


@click.command("share")
@click.option("--messages", type=click.IntRange(min=1), default=200_000, show_default=True,
              help="Pre-produced records read by each throughput run.")
@click.option("--size", type=click.IntRange(min=21), default=100, show_default=True, help="Payload bytes.")
@click.option("--partitions", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Throughput rounds (each runs the three variants, the order rotating); the median is reported.")
@click.option("--processing-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Handler time per message (sleep), in every phase.")
@click.option("--rate", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Offered records/s of the latency phase.")
@click.option("--rate-seconds", type=click.FloatRange(min=1), default=10.0, show_default=True,
              help="Seconds of records measured in the latency phase.")
@click.option("--lease", type=click.FloatRange(min=1), default=2.0, show_default=True,
              help="Seconds: the native lock duration and kmq's lease of the redelivery phase.")
@click.option("--samples", type=click.IntRange(min=1), default=3, show_default=True,
              help="Held records timed in the redelivery phase.")
@click.option("--kmq-backoff", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Seconds: the tracker's backoff.initial in the redelivery phase (native has none after a lock expiry).")
@click.option("--timeout", type=click.FloatRange(min=10), default=600.0, show_default=True,
              help="Seconds a throughput run may take at most.")
@click.option("--bootstrap", default=None,
              help="Use this broker (Kafka 4.2+ with share groups) instead of starting one.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object (the last line).")
def command(as_json: bool, **opts: Any) -> None:
    """Native share groups (confluent_kafka.ShareConsumer) beside kmq.share.ShareConsumer and
    KmqConsumer: throughput, latency at a fixed rate, CPU per message, lock expiry to redelivery."""
    result = run(echo=click.echo, **opts)
    if as_json:
        click.echo(json.dumps(result))
