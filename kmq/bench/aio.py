"""``kmq bench aio``: the asyncio API against a plain aiokafka loop and the threaded API,
side by side in one run.

All variants read the same pre-produced messages of one queue, each run in a
fresh consumer group and a fresh process, alternating ``--rounds`` times, with
the handler of ``kmq bench consumer`` (a crc32 of the value), awaited as a
coroutine by the asyncio variants:

* threads:   ``KmqConsumer.poll(max_records=batch)``, the handler, ``msg.ack()`` each;
* aiokafka:  a plain aiokafka loop (no kmq): ``getmany(max_records=batch)``, the
  coroutine handler per record, ``await commit()`` per batch;
* aio-for:   ``async for msg in AsyncKmqConsumer``: the coroutine handler, ``await msg.ack()``;
* aio-run:   ``AsyncKmqConsumer.run(handler, concurrency=--concurrency)`` (return = ack);
* loop-for, loop-run: the same two with ``kafka.client: aiokafka`` (the fetcher step on the event
  loop, no fetcher thread: :mod:`kmq.consumer.loop_driver`); their ratio to the plain aiokafka loop
  is the figure to watch.

``--variants`` runs a subset (``threads`` and ``aiokafka`` always run: the ratios need them).

Throughput is measured from the first message to the last one settled and the
final flush or commit (group join excluded). The asyncio variants also run a
ticker coroutine (every 5 ms) and report the largest gap between its ticks, and
how late the loop woke it at most (the gap less the 5 ms it asked to sleep): how
long the event loop was kept from other work while consuming at full speed
(the plain aiokafka loop's own figure is the reference). Garbage collections
stop every thread of a process; the report gives the largest delay less the
collections inside it as well, the full collections and the longest one. Every variant's process
also times each full (generation-2) collection from the first message to the last one settled,
with the collector as it found it (:mod:`kmq.bench.gc_pauses`; ``--tuned-gc`` tunes it in every
variant): count, longest and p99, the figures of the garbage collection target.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import click

from kmq.bench.consumer import _child_kmq, _config, _cpu, _produce, _rss_mb, handler
from kmq.bench.gc_pauses import FullCollections, merge, said
from kmq.dev.broker import broker_unless

__all__ = ["command", "run"]

VARIANTS = ("threads", "aiokafka", "aio-for", "aio-run", "loop-for", "loop-run")
#: What the asyncio variants are compared with.
BASELINES = ("threads", "aiokafka")
TICK = 0.005


async def work(value: bytes) -> int:
    """The handler as a coroutine (what an asyncio application awaits per message)."""
    return handler(value)


class LoopGap:
    """The largest gap between the ticks of a coroutine that sleeps :data:`TICK` seconds, and how
    late the loop woke it (the gap less the tick): the time the loop was kept from other work.

    Garbage collections stop every thread of the process, whichever allocation triggers them,
    for as long as visiting their generation's objects takes (a full one: every live object);
    they are recorded (a ``gc.callbacks`` hook) so the report can tell the delay they explain
    from the rest."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._gaps: list[tuple[float, float]] = []  # (start, end) of ticks later than 1 ms
        self._collections: list[tuple[float, float, int]] = []  # (start, end, generation)
        self._gc_began = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            gc.callbacks.append(self._gc)
            self._task = asyncio.create_task(self._tick())

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self._collections.append((self._gc_began, time.perf_counter(), info.get("generation", -1)))

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            self.worst = max(self.worst, now - last)
            if now - last - TICK > 0.001:
                self._gaps.append((last, now))
            last = now

    def stop(self) -> float:
        """Stop ticking; the largest gap in ms (the other figures are in :meth:`figures`)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
            gc.callbacks.remove(self._gc)
        return self.worst * 1000

    def figures(self) -> dict[str, float]:
        """After :meth:`stop`: how late the loop was at most, and at most less the collections inside
        that delay (ms); the full collections while ticking and the longest collection of any generation."""
        late = besides = 0.0
        for a, b in self._gaps:
            collecting = sum(max(0.0, min(b, cb) - max(a, ca)) for ca, cb, _ in self._collections)
            late = max(late, b - a - TICK)
            besides = max(besides, b - a - TICK - collecting)
        return {"loop_late_ms": late * 1000, "loop_late_besides_gc_ms": besides * 1000,
                "full_collections": sum(1 for c in self._collections if c[2] == 2),
                "collection_max_ms": max((b - a for a, b, _ in self._collections), default=0.0) * 1000}


def _child_threads(cfg: Any, messages: int, batch: int, tuned: bool) -> dict:
    """The threaded variant is `kmq bench consumer`'s KmqConsumer loop, as it is."""
    out = _child_kmq(cfg, messages, batch, tuned=tuned)
    return {"messages": out["messages"], "seconds": out["seconds"], "cpu_seconds": out["cpu_seconds"],
            "loop_cpu_seconds": None, "loop_gap_ms": None, "full_gc": out["full_gc"]}


async def _child_aiokafka(cfg: Any, messages: int, batch: int, tuned: bool) -> dict:
    """The reference: a plain aiokafka consumer loop, commit per batch, no kmq."""
    # aiokafka is not one of kmq's clients (kafka.client): only this comparison uses it.
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(cfg.queues[0].name, bootstrap_servers=cfg.kafka.bootstrap_servers,
                         group_id=cfg.consumer.group_id, enable_auto_commit=False, auto_offset_reset="earliest",
                         max_poll_records=batch, session_timeout_ms=int(cfg.kafka.session_timeout * 1000),
                         heartbeat_interval_ms=int(cfg.kafka.heartbeat_interval * 1000))
    gap, full = LoopGap(), FullCollections()
    n, t0, c0, l0, acc = 0, 0.0, 0.0, 0.0, 0
    await c.start()
    try:
        while n < messages:
            records = await c.getmany(timeout_ms=500, max_records=batch)
            if not records:
                continue
            if n == 0:
                t0, c0, l0 = time.perf_counter(), _cpu(), time.thread_time()
                gap.start()
                full.start()
            for recs in records.values():
                for r in recs:
                    acc ^= await work(r.value)
                n += len(recs)
            await c.commit()
        took, cpu, loop_cpu = time.perf_counter() - t0, _cpu() - c0, time.thread_time() - l0
        worst = gap.stop()
        collections = full.stop(tuned)
    finally:
        await c.stop()
    return {"messages": n, "seconds": took, "cpu_seconds": cpu, "loop_cpu_seconds": loop_cpu, "loop_gap_ms": worst,
            **gap.figures(), "full_gc": collections}


async def _child_aio(cfg: Any, messages: int, batch: int, variant: str, concurrency: int, tuned: bool) -> dict:
    from kmq.consumer.aio import AsyncKmqConsumer

    gap, full = LoopGap(), FullCollections()
    n, t0, c0, l0, acc = 0, 0.0, 0.0, 0.0, 0
    async with AsyncKmqConsumer(cfg, batch_size=batch) as c:
        if variant.endswith("-for"):
            async for msg in c:
                if n == 0:
                    t0, c0, l0 = time.perf_counter(), _cpu(), time.thread_time()
                    gap.start()
                    full.start()
                acc ^= await work(msg.value)
                await msg.ack()
                n += 1
                if n == messages:
                    break
        else:
            async def handle(msg: Any) -> None:
                nonlocal n, t0, c0, l0, acc
                if n == 0:
                    t0, c0, l0 = time.perf_counter(), _cpu(), time.thread_time()
                    gap.start()
                    full.start()
                acc ^= await work(msg.value)
                n += 1
                if n == messages:
                    c.stop()

            await c.run(handle, concurrency=concurrency)
        loop_cpu = time.thread_time() - l0
        collections = full.stop(tuned)  # at full speed: the final flush is not
        await asyncio.get_running_loop().run_in_executor(None, c.consumer.writer.flush)
        took, cpu = time.perf_counter() - t0, _cpu() - c0
        worst = gap.stop()
    return {"messages": n, "seconds": took, "cpu_seconds": cpu, "loop_cpu_seconds": loop_cpu, "loop_gap_ms": worst,
            **gap.figures(), "full_gc": collections}


def _child(variant: str, bootstrap: str, queue: str, messages: int, batch: int, concurrency: int,
           client: str = "kafka-python", tuned_gc: bool = False) -> None:
    import logging

    if tuned_gc:  # every variant alike, as kmq work tunes its process
        from kmq.config.process import tune_collector

        tune_collector()

    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    cfg = _config(bootstrap, queue, f"bench-{variant}-{uuid.uuid4().hex[:8]}", "100ms",
                  "aiokafka" if variant.startswith("loop-") else client)
    if variant == "threads":
        out = _child_threads(cfg, messages, batch, tuned_gc)
    elif variant == "aiokafka":
        out = asyncio.run(_child_aiokafka(cfg, messages, batch, tuned_gc))
    else:
        out = asyncio.run(_child_aio(cfg, messages, batch, variant, concurrency, tuned_gc))
    out["rss_mb"] = _rss_mb()
    print("RESULT " + json.dumps(out), flush=True)


def _spawn(variant: str, bootstrap: str, queue: str, messages: int, batch: int, concurrency: int,
           client: str = "kafka-python", tuned_gc: bool = False) -> dict:
    code = ("from kmq.bench.aio import _child; "
            f"_child({variant!r}, {bootstrap!r}, {queue!r}, {messages}, {batch}, {concurrency}, {client!r}, "
            f"{tuned_gc!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise click.ClickException(f"{variant} run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


def run(messages: int = 100_000, size: int = 100, batch: int = 500, concurrency: int = 16, rounds: int = 3,
        partitions: int = 1, bootstrap: str | None = None, echo: Any = None, client: str = "kafka-python",
        tuned_gc: bool = False, variants: tuple[str, ...] = ()) -> dict:
    """Run the variants ``rounds`` times; returns the figures (also printed through ``echo``). ``client``:
    the Kafka client of the aio- variants (``kafka.client``; the loop- variants are on aiokafka); the
    aiokafka loop is the reference either way. ``tuned_gc``: every variant's process tunes its garbage
    collector as ``kmq work`` does. ``variants``: a subset (default all; the baselines always run)."""
    say = echo or (lambda *_: None)
    chosen = tuple(v for v in VARIANTS if v in BASELINES or not variants or v in variants)
    bootstrap, broker = broker_unless(bootstrap)
    try:
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        _produce(bootstrap, queue, messages, size, partitions, "kafka-python")
        say(f"produced {messages} x {size} B to {queue} ({partitions} partition(s)); aio-run concurrency {concurrency}; "
            f"kmq variants on {client}" + ("; garbage collector tuned in every variant" if tuned_gc else ""))
        runs: dict[str, list[dict]] = {v: [] for v in chosen}
        for r in range(rounds):
            for variant in chosen:
                res = _spawn(variant, bootstrap, queue, messages, batch, concurrency, client, tuned_gc)
                res["rate"] = res["messages"] / res["seconds"]
                runs[variant].append(res)
                gap = "" if res["loop_gap_ms"] is None else (
                    f", loop thread cpu {res['loop_cpu_seconds']:.2f}s, largest loop gap {res['loop_gap_ms']:.1f} ms, "
                    f"loop late {res['loop_late_ms']:.1f} ms ({res['loop_late_besides_gc_ms']:.1f} ms besides garbage "
                    f"collection; {res['full_collections']} full, the longest collection {res['collection_max_ms']:.1f} ms)")
                say(f"round {r + 1} {variant:8s}: {res['rate']:>9,.0f} msg/s  ({res['seconds']:.2f}s, "
                    f"cpu {res['cpu_seconds']:.2f}s, peak RSS {res['rss_mb']:.0f} MB{gap}; full collections "
                    f"{said(res['full_gc'])})")
        medians = {v: statistics.median(x["rate"] for x in runs[v]) for v in chosen}
        ratios = {base: _ratios(runs, base, chosen) for base in BASELINES}
        gaps = {v: max(x["loop_gap_ms"] for x in runs[v]) for v in chosen[1:]}
        late = {v: max(x["loop_late_ms"] for x in runs[v]) for v in chosen[1:]}
        besides = {v: max(x["loop_late_besides_gc_ms"] for x in runs[v]) for v in chosen[1:]}
        full = {v: sum(x["full_collections"] for x in runs[v]) for v in chosen[1:]}
        longest = {v: max(x["collection_max_ms"] for x in runs[v]) for v in chosen[1:]}
        say("medians: " + ", ".join(f"{v} {m:,.0f} msg/s" for v, m in medians.items()))
        for base in BASELINES:
            say(f"ratio to {base} (per round; median): " + ", ".join(
                f"{v} {' '.join(f'{x:.3f}' for x in per_round)}; {statistics.median(per_round):.3f}"
                for v, per_round in ratios[base].items()))
        full_gc = {v: merge([x["full_gc"] for x in runs[v]]) for v in chosen}
        say("full garbage collections at full speed (target: kmq's at most 5 ms with the collector at defaults): "
            + "; ".join(f"{v} {said(f)}" for v, f in full_gc.items()))
        say("largest event-loop gap: " + ", ".join(f"{v} {g:.1f} ms" for v, g in gaps.items()))
        say(f"loop late beyond the {TICK * 1000:.0f} ms tick, at most (besides garbage collection; full collections "
            "while ticking, the longest collection): " + ", ".join(
                f"{v} {late[v]:.1f} ms ({besides[v]:.1f} ms; {full[v]}, {longest[v]:.1f} ms)" for v in late))
        return {"client": client, "tuned_gc": tuned_gc, "messages": messages, "size": size, "batch": batch, "concurrency": concurrency,
                "rounds": rounds,
                "partitions": partitions, "msgs_per_s": {v: [x["rate"] for x in runs[v]] for v in chosen},
                "median_msgs_per_s": medians,
                "ratio_to_threads": {v: statistics.median(x) for v, x in ratios["threads"].items()},
                "ratio_to_aiokafka": {v: statistics.median(x) for v, x in ratios["aiokafka"].items()},
                "ratios_per_round": ratios, "max_loop_gap_ms": gaps,
                "max_loop_late_ms": late, "max_loop_late_besides_gc_ms": besides,
                "full_collections": full, "max_collection_ms": longest, "full_gc": full_gc,
                "loop_gap_ms_per_round": {v: [x["loop_gap_ms"] for x in runs[v]] for v in chosen[1:]}}
    finally:
        if broker is not None:
            broker.stop()


def _ratios(runs: dict[str, list[dict]], base: str, chosen: tuple[str, ...]) -> dict[str, list[float]]:
    """Each variant's rate over ``base``'s of the same round (the variants after ``base``)."""
    return {v: [a["rate"] / b["rate"] for a, b in zip(runs[v], runs[base])]
            for v in chosen[chosen.index(base) + 1:]}


@click.command("aio")
@click.option("--messages", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--size", type=click.IntRange(min=1), default=100, show_default=True, help="Payload bytes.")
@click.option("--batch", type=click.IntRange(min=1), default=500, show_default=True, help="batch_size of the consumers.")
@click.option("--concurrency", type=click.IntRange(min=1), default=16, show_default=True, help="aio-run handlers at once.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--bootstrap", default=None, help="Use this broker instead of an embedded one.")
@click.option("--client", type=click.Choice(["kafka-python", "confluent"]), default="kafka-python", show_default=True,
              help="Kafka client of the kmq variants (kafka.client); the aiokafka loop is the reference either way.")
@click.option("--tuned-gc", is_flag=True,
              help="Tune every variant's garbage collector as kmq work does (kmq.config.process.tune_collector).")
@click.option("--variants", multiple=True, type=click.Choice(VARIANTS[2:]),
              help="Run only these (repeatable); threads and aiokafka always run. Default: all.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON too.")
def command(as_json: bool, variants: tuple[str, ...], **opts: Any) -> None:
    """AsyncKmqConsumer (async for, run; threaded bridge and on aiokafka) vs a plain aiokafka loop and
    KmqConsumer (threads), one broker."""
    result = run(echo=click.echo, variants=variants, **opts)
    if as_json:
        click.echo(json.dumps(result))
