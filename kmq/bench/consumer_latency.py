"""``kmq bench consumer --latency-rate R``: delivery latency of a plain loop and KmqConsumer at a fixed rate.

A producer in the benchmark process writes ``R`` records per second, each carrying its send
time (wall clock, the same machine); each variant runs in its own process and consumer group,
one after the other, with the same loop as the throughput runs (plain: ``poll``/``consume`` of
up to ``batch`` records and a synchronous commit per poll; kmq: ``KmqConsumer.poll`` and
``ack()``, with the default ``consumer.hand_over: committed`` and as ``kmq-started`` with
``started``). Latency is the handler's time minus the send time, for the records sent from one
second after the variant received its first record (group join and backlog excluded) until
``seconds`` later. Reported: p50, p95 and p99 of each variant, and each kmq variant's minus
plain's (``started`` for the second).

Both variants fetch with a wait of :data:`FETCH_WAIT_MS` (``consumer.fetch_wait`` for kmq, the
client's ``fetch.max.wait.ms`` for the plain loop). Kafka answers a waiting fetch as soon as a
record arrives, and then the wait does not matter; the embedded broker does not always, and
with the clients' default of 500 ms its held fetches made the p95 of both variants 430-500 ms
and their p50 swing between 30 and 170 ms from run to run, hiding the consumers' own cost.
The rounds alternate which variant runs first.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from kmq.bench.consumer_config import consumer_config as _config
from kmq.bench.live_child import result_of_fed_child
from kmq.bench.per_client import per_client
from kmq.dev.broker import broker_unless

__all__ = ["run", "run_latency"]

#: Records sent this long after the first one a variant received are measured (join and backlog excluded).
WARM_UP = 1.0
#: The fetch wait of every variant, milliseconds (module docstring).
FETCH_WAIT_MS = 20
#: The variants: the plain loop, and KmqConsumer with each ``consumer.hand_over``.
VARIANTS = ("plain", "kmq", "kmq-started")
HAND_OVER = {"kmq": "committed", "kmq-started": "started"}


def _sent_at(value: bytes) -> float:
    return float(value[:20])


def _child_latency(variant: str, bootstrap: str, queue: str, batch: int, seconds: float, client: str) -> None:
    """One variant: consume until ``seconds`` of records after the warm-up were seen; print the latencies' percentiles."""
    import logging


    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    cfg = _config(bootstrap, queue, f"lat-{variant}-{uuid.uuid4().hex[:8]}", "100ms", client, fetch_wait=f"{FETCH_WAIT_MS}ms",
                  hand_over=HAND_OVER.get(variant, "committed"))
    lat: list[float] = []
    state: dict[str, float | None] = {"from": None, "until": None}

    def seen(value: bytes) -> bool:
        """Record one latency; False once the measured window is over."""
        now = time.time()
        sent = _sent_at(value)
        if state["from"] is None:  # the probe record: joined, the producer starts now
            print("READY", flush=True)
            state["from"] = now + WARM_UP
            state["until"] = now + WARM_UP + seconds
        if sent >= state["until"]:  # type: ignore[operator]  # set by the probe record
            return False
        if sent >= state["from"]:  # type: ignore[operator]
            lat.append(now - sent)
        return True

    if variant in HAND_OVER:
        from kmq.consumer.consumer import KmqConsumer

        c = KmqConsumer(cfg, batch_size=batch)
        going = True
        while going:
            for m in c.poll(timeout=0.5, max_records=batch):
                going = seen(m.value) and going  # type: ignore[arg-type]  # the bench's records have values
                m.ack()
        c.close()
    elif client == "confluent":
        from kmq.client.confluent.consumer import consumer

        raw = consumer(cfg.kafka, queue, group_id=cfg.consumer.group_id,
                       **{"fetch.wait.max.ms": cfg.consumer.fetch_wait_ms or 500}).raw
        going = True
        while going:
            records = raw.consume(batch, 0.5)
            for r in records:
                if r.error() is None:
                    going = seen(r.value()) and going
            if records:
                raw.commit(asynchronous=False)
        raw.close()
    else:
        from kmq.client.kafka_python import clients

        kc = clients.consumer(cfg.kafka, group_id=cfg.consumer.group_id, max_poll_records=batch,
                              fetch_max_wait_ms=cfg.consumer.fetch_wait_ms)
        kc.subscribe([queue])
        going = True
        while going:
            records = kc.poll(timeout_ms=500, max_records=batch)
            for recs in records.values():
                for r in recs:
                    going = seen(r.value) and going
            if records:
                kc.commit()
        kc.close()
    lat.sort()
    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")

    print("RESULT " + json.dumps({"measured": len(lat), "p50_ms": pct(0.5), "p95_ms": pct(0.95),
                                  "p99_ms": pct(0.99), "mean_ms": statistics.fmean(lat) * 1000 if lat else None}),
          flush=True)


def _produce_at(bootstrap: str, queue: str, rate: int, client: str, stop: threading.Event, probe: bool = False) -> None:
    """Send ``rate`` records a second (in 1 ms steps), each carrying its send time, until ``stop``
    (``probe``: one record, flushed)."""
    from kmq import client as client_api

    cfg = _config(bootstrap, queue, "unused", "100ms", client)
    p = client_api.producer(cfg.kafka, linger=0, compression="none")
    step = 0.001
    per_step = rate * step
    owed = 0.0
    next_at = time.monotonic()
    try:
        if probe:
            p.send(queue, value=b"%020.6f" % time.time(), partition=0)
            p.flush()
        while not stop.is_set():
            owed += per_step
            while owed >= 1:
                p.send(queue, value=b"%020.6f" % time.time() + b"x" * 80, partition=0)
                owed -= 1
            next_at += step
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    finally:
        client_api.close_producer(p)


def _measure(variant: str, bootstrap: str, queue: str, rate: int, seconds: float, batch: int, client: str) -> dict:
    """One variant's run: a probe record, the child process, the live producer once the child got the probe."""
    stop = threading.Event()
    stop.set()
    _produce_at(bootstrap, queue, 1, client, stop, probe=True)
    code = ("from kmq.bench.consumer_latency import _child_latency; "
            f"_child_latency({variant!r}, {bootstrap!r}, {queue!r}, {batch}, {seconds}, {client!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    producer = threading.Thread(target=_produce_at, args=(bootstrap, queue, rate, client, stop), daemon=True)
    return result_of_fed_child(proc, producer, stop, f"{variant} latency run")


def run_latency(rate: int, seconds: float, client: str, batch: int = 500, rounds: int = 1,
                bootstrap: str | None = None, echo: Any = None) -> dict:
    """Latency percentiles of the plain loop and KmqConsumer at ``rate`` records/s (``rounds`` A/B pairs)."""
    from kmq.client.topics import ensure_topics

    say = echo or (lambda *_: None)
    bootstrap, broker = broker_unless(bootstrap)
    try:
        runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for r in range(rounds):
            for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                queue = f"lat-{uuid.uuid4().hex[:8]}"
                cfg = _config(bootstrap, queue, "unused", "100ms", client)
                ensure_topics(cfg.kafka, cfg.queues[0], 1)
                res = _measure(variant, bootstrap, queue, rate, seconds, batch, client)
                runs[variant].append(res)
                say(f"[{client}] round {r + 1} {variant:11s}: p50 {res['p50_ms']:.1f} ms, p95 {res['p95_ms']:.1f} ms, "
                    f"p99 {res['p99_ms']:.1f} ms ({res['measured']} records at {rate}/s)")
        med = {v: {k: statistics.median(x[k] for x in runs[v]) for k in ("p50_ms", "p95_ms", "p99_ms")} for v in runs}
        result = {"client": client, "rate": rate, "seconds": seconds, "batch": batch, "rounds": rounds, "runs": runs,
                  "median": med, "p50_diff_ms": med["kmq"]["p50_ms"] - med["plain"]["p50_ms"],
                  "p95_diff_ms": med["kmq"]["p95_ms"] - med["plain"]["p95_ms"],
                  "started": {"p50_diff_ms": med["kmq-started"]["p50_ms"] - med["plain"]["p50_ms"],
                              "p95_diff_ms": med["kmq-started"]["p95_ms"] - med["plain"]["p95_ms"]}}
        for v, diff in (("kmq", result), ("kmq-started", result["started"])):
            say(f"[{client}] at {rate} msg/s, {v} (consumer.hand_over: {HAND_OVER[v]}): p50 plain "
                f"{med['plain']['p50_ms']:.1f} ms, {v} {med[v]['p50_ms']:.1f} ms ({diff['p50_diff_ms']:+.1f}); p95 plain "
                f"{med['plain']['p95_ms']:.1f} ms, {v} {med[v]['p95_ms']:.1f} ms ({diff['p95_diff_ms']:+.1f})")
        return result
    finally:
        if broker is not None:
            broker.stop()


def run(rate: int = 5000, seconds: float = 10.0, clients: tuple[str, ...] = ("kafka-python", "confluent"),
        batch: int = 500, rounds: int = 3, bootstrap: str | None = None, echo: Any = None) -> dict:
    """:func:`run_latency` on each of ``clients`` (``kmq bench all``): ``{client: figures}``; a client
    that is not installed is reported as skipped."""
    return per_client(clients, lambda client: run_latency(rate, seconds, client, batch, rounds, bootstrap, echo))
