"""``kmq bench consumer``: a plain group loop vs KmqConsumer, A/B, on either client.

``--client kafka-python`` (default) compares KmqConsumer with a plain
kafka-python loop, ``--client confluent`` KmqConsumer on confluent-kafka with a
plain confluent-kafka loop (``kmq bench all`` runs both pairs). Both variants
read the same pre-produced messages of one queue topic, each run in a fresh
consumer group and a fresh process (so peak RSS is per variant), alternating
plain/kmq ``--rounds`` times:

* plain: ``poll(max_records=batch)`` (confluent: ``consume(batch)``), the handler
  per record, a synchronous ``commit()`` per poll. On confluent-kafka with
  librdkafka's fetch settings, as a plain loop has them unless its author changed
  them: ``fetch.queue.backoff.ms`` 1 s, which stalls a loop that drains the
  prefetch quickly (kmq's consumers use 10 ms).
* plain-tuned (confluent only): the same loop with kmq's ``fetch.queue.backoff.ms``;
  KmqConsumer is reported against it too.
* kmq:   ``KmqConsumer.poll(max_records=batch)``, the same handler, ``msg.ack()`` each
  (the fetcher takes ``fetch_size`` records per Kafka poll, default 8 x batch,
  with one START per partition acknowledged before the commit; END ranges
  flushed every ``ack_flush_interval``); the clock stops after the final flush.

* share (``--share``): :class:`kmq.share.ShareConsumer` (the share-consumer API over
  KmqConsumer, same client) in implicit mode: ``poll()`` with ``max.poll.records`` = batch,
  the handler per record, each batch accepted by the next poll; the clock stops after a
  final ``commit_sync()`` (every END written). Reported as a ratio to the kmq run of the
  same round.

Throughput is measured from the first record handed to the handler to the
last one settled (group join excluded). Reported: msg/s of each run, the
median ratio kmq/plain (and share/kmq), marker records per message and peak RSS, and
each variant's full garbage collections over the same span (:mod:`kmq.bench.gc_pauses`:
count, longest, p99; the collector at Python's defaults except in ``kmq-gc``).

``--ordering key`` compares ``consumer.ordering: key`` with ``none`` instead
(both KmqConsumer, records keyed ``k0 .. k{--keys - 1}`` round robin): the
ratio is key/none, and the most messages of one key handed out at once is
reported (1 is the contract).
"""

from __future__ import annotations

import json
import statistics
import gc
import subprocess
import sys
import time
import uuid
import zlib
from collections import Counter
from typing import Any

import click

from kmq.bench.consumer_config import consumer_config as _config
from kmq.bench.consumer_latency import run_latency
from kmq.bench.gc_pauses import FullCollections, merge, said
from kmq.bench.per_client import per_client
from kmq.consumer.consumer import FETCH_BATCHES
from kmq.dev.broker import broker_unless

__all__ = ["command", "run"]


def handler(value: bytes) -> int:
    """The same light per-message work in both variants."""
    return zlib.crc32(value)


CLIENTS = ("kafka-python", "confluent")
#: Default messages per client: confluent-kafka reads several times faster, so a run of the same
#: size would last a fraction of a second, within the noise of process and group start-up.
DEFAULT_MESSAGES = {"kafka-python": 200_000, "confluent": 1_000_000}


def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


#: librdkafka's default ``fetch.queue.backoff.ms`` (kmq's confluent consumers set 10 ms).
LIBRDKAFKA_FETCH_QUEUE_BACKOFF_MS = 1000


def _child_plain_confluent(cfg: Any, messages: int, batch: int, tuned: bool = False) -> dict:
    from kmq.client.confluent.consumer import consumer

    # kmq's session timing either way; the fetch backoff is librdkafka's unless ``tuned``.
    fetch = {} if tuned else {"fetch.queue.backoff.ms": LIBRDKAFKA_FETCH_QUEUE_BACKOFF_MS}
    c = consumer(cfg.kafka, cfg.queues[0].name, group_id=cfg.consumer.group_id, **fetch).raw
    full = FullCollections()
    n = 0
    t0 = None
    acc = 0
    while n < messages:
        records = c.consume(batch, 0.5)
        if not records:
            continue
        if t0 is None:
            t0, c0 = time.perf_counter(), _cpu()
            full.start()
        for r in records:
            if r.error() is None:
                acc ^= handler(r.value())
                n += 1
        c.commit(asynchronous=False)
    assert t0 is not None  # set at the first batch
    took, cpu = time.perf_counter() - t0, _cpu() - c0
    collections = full.stop()
    c.close()
    return {"messages": n, "seconds": took, "cpu_seconds": cpu, "markers": 0, "full_gc": collections}


def _child_plain(cfg: Any, messages: int, batch: int) -> dict:
    if cfg.kafka.client == "confluent":
        return _child_plain_confluent(cfg, messages, batch)
    from kmq.client.kafka_python import clients

    kc = clients.consumer(cfg.kafka, group_id=cfg.consumer.group_id, max_poll_records=batch)
    kc.subscribe([cfg.queues[0].name])
    full = FullCollections()
    n = 0
    t0 = None
    acc = 0
    while n < messages:
        records = kc.poll(timeout_ms=500, max_records=batch)
        if not records:
            continue
        if t0 is None:
            t0, c0 = time.perf_counter(), _cpu()
            full.start()
        for recs in records.values():
            for r in recs:
                acc ^= handler(r.value)
            n += len(recs)
        kc.commit()
    assert t0 is not None  # set at the first batch
    took, cpu = time.perf_counter() - t0, _cpu() - c0
    collections = full.stop()
    kc.close()
    return {"messages": n, "seconds": took, "cpu_seconds": cpu, "markers": 0, "full_gc": collections}


def _child_kmq(cfg: Any, messages: int, batch: int, fetch: int | None = None, tuned: bool = False) -> dict:
    from kmq.consumer.consumer import KmqConsumer

    c = KmqConsumer(cfg, batch_size=batch, fetch_size=fetch)
    full = FullCollections()
    n = 0
    t0 = None
    acc = 0
    most_per_key = 0  # most messages of one key in one poll (all of a poll are out at once)
    while n < messages:
        msgs = c.poll(timeout=0.5, max_records=batch)
        if not msgs:
            continue
        if t0 is None:
            t0, c0 = time.perf_counter(), _cpu()
            full.start()
        if msgs[0].key is not None:
            most_per_key = max(most_per_key, max(Counter((m.partition, m.key) for m in msgs).values()))
        for m in msgs:
            acc ^= handler(m.value)  # type: ignore[arg-type]  # the bench's records have values
            m.ack()
        n += len(msgs)
    collections = full.stop(tuned)  # at full speed: the final flush and close are not
    c.writer.flush()
    assert t0 is not None  # set at the first batch
    took, cpu = time.perf_counter() - t0, _cpu() - c0
    c.close()
    return {"messages": n, "seconds": took, "cpu_seconds": cpu, "markers": c.writer.markers_sent,
            "most_per_key": most_per_key, "full_gc": collections}


def _child_kmq_iter(cfg: Any, messages: int, batch: int, fetch: int | None = None) -> dict:
    """KmqConsumer iterated (``for msg in consumer``, the README's loop): the handler and ``ack()`` each."""
    from kmq.consumer.consumer import KmqConsumer

    c = KmqConsumer(cfg, batch_size=batch, fetch_size=fetch)
    n = 0
    t0 = c0 = 0.0
    acc = 0
    for m in c:
        if n == 0:
            t0, c0 = time.perf_counter(), _cpu()
        acc ^= handler(m.value)  # type: ignore[arg-type]
        m.ack()
        n += 1
        if n == messages:
            break
    c.writer.flush()
    assert t0 is not None  # set at the first batch
    took, cpu = time.perf_counter() - t0, _cpu() - c0
    c.close()
    return {"messages": n, "seconds": took, "cpu_seconds": cpu, "markers": c.writer.markers_sent}


def _child_share(cfg: Any, messages: int, batch: int, flush_interval: str) -> dict:
    from kmq.config import parse_duration
    from kmq.share import ShareConsumer

    c = ShareConsumer({
        "bootstrap.servers": cfg.kafka.bootstrap_servers, "group.id": cfg.consumer.group_id,
        # The group timing of the other variants (kmq keys: natively it is the broker's).
        "kmq.session.timeout.ms": cfg.kafka.session_timeout * 1000,
        "kmq.heartbeat.interval.ms": cfg.kafka.heartbeat_interval * 1000, "kmq.kafka.client": cfg.kafka.client,
        "max.poll.records": batch, "kmq.ack.flush.interval.ms": parse_duration(flush_interval) * 1000,
    })
    c.subscribe([cfg.queues[0].name])
    n = 0
    t0 = None
    acc = 0
    while n < messages:
        msgs = c.poll(0.5)
        if not msgs:
            continue
        if t0 is None:
            t0, c0 = time.perf_counter(), _cpu()
        for m in msgs:
            acc ^= handler(m.value())  # type: ignore[arg-type]
        n += len(msgs)
    c.commit_sync(60)  # accepts the last batch and waits for every marker
    assert t0 is not None  # set at the first batch
    took, cpu = time.perf_counter() - t0, _cpu() - c0
    assert c.kmq_consumer is not None  # opened by the first poll
    markers = c.kmq_consumer.writer.markers_sent
    c.close()
    return {"messages": n, "seconds": took, "cpu_seconds": cpu, "markers": markers}


def _child(variant: str, bootstrap: str, queue: str, messages: int, batch: int, flush_interval: str,
           fetch: int | None = None, client: str = "kafka-python") -> None:
    import logging

    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    ordering = "key" if variant == "kmq-key" else "none"
    cfg = _config(bootstrap, queue, f"bench-{variant}-{uuid.uuid4().hex[:8]}", flush_interval, client, ordering,
                  auto_renew=variant != "kmq-no-renew")
    if variant == "kmq-gc":  # KmqConsumer in a process tuned as kmq's own are (kmq work)
        from kmq.config.process import tune_collector

        tune_collector()
    if variant == "plain":
        out = _child_plain(cfg, messages, batch)
    elif variant == "plain-tuned":
        out = _child_plain_confluent(cfg, messages, batch, tuned=True)
    elif variant == "share":
        out = _child_share(cfg, messages, batch, flush_interval)
    elif variant == "kmq-iter":
        out = _child_kmq_iter(cfg, messages, batch, fetch)
    else:
        out = _child_kmq(cfg, messages, batch, fetch, tuned=variant == "kmq-gc")
    out["rss_mb"] = _rss_mb()
    out["gc_gen0"] = gc.get_threshold()[0]  # the collector's threshold the run had (--tuned-gc)
    print("RESULT " + json.dumps(out), flush=True)


def _spawn(variant: str, bootstrap: str, queue: str, messages: int, batch: int, flush_interval: str,
           profile: str | None, fetch: int | None, client: str = "kafka-python") -> dict:
    code = (
        "import sys; from kmq.bench.consumer import _child; "
        f"_child({variant!r}, {bootstrap!r}, {queue!r}, {messages}, {batch}, {flush_interval!r}, {fetch!r}, "
        f"{client!r})"
    )
    cmd = [sys.executable, "-c", code]
    if profile and variant in ("kmq", "kmq-key"):
        import shutil

        spy = shutil.which("py-spy")
        if spy is None:
            raise click.ClickException("--profile needs py-spy on PATH (pip install py-spy)")
        cmd = [spy, "record", "--threads", "-o", profile, "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise click.ClickException(f"{variant} run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


def _produce(bootstrap: str, queue: str, messages: int, size: int, partitions: int, client: str,
             keys: int = 0) -> None:
    from kmq import client as client_api
    from kmq.client.topics import ensure_topics

    cfg = _config(bootstrap, queue, "unused", "100ms", client)
    ensure_topics(cfg.kafka, cfg.queues[0], partitions)
    p = client_api.producer(cfg.kafka, linger=0.02, batch_size=512 * 1024, compression="none")
    value = b"x" * size
    for i in range(messages):
        key = b"k%d" % (i % keys) if keys else None
        p.send(queue, key=key, value=value, partition=(i % keys if keys else i) % partitions)
    p.flush()
    client_api.close_producer(p)


def run(messages: int | None = None, size: int = 100, batch: int = 500, rounds: int = 3, partitions: int = 1,
        flush_interval: str = "100ms", bootstrap: str | None = None, profile: str | None = None,
        fetch: int | None = None, echo: Any = None, client: str = "kafka-python",
        clients: tuple[str, ...] | None = None, share: bool = False, ordering: str = "none",
        keys: int = 1000, no_renew: bool = False, tuned_gc: bool = False, iterate: bool = False) -> dict:
    """Run the A/B benchmark on ``client``; returns the figures (also printed through ``echo``).
    With ``clients``, one A/B run per client: ``{client: figures}``. ``messages`` defaults
    to :data:`DEFAULT_MESSAGES` of the client."""
    if clients:
        return per_client(clients, lambda c: run(messages, size, batch, rounds, partitions, flush_interval, bootstrap,
                                                  profile, fetch, echo, c, None, share, ordering, keys, no_renew,
                                                  tuned_gc, iterate))
    messages = messages or DEFAULT_MESSAGES[client]
    say = echo or (lambda *_: None)
    bootstrap, broker = broker_unless(bootstrap)
    try:
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        t = time.perf_counter()
        keyed = ordering == "key"
        _produce(bootstrap, queue, messages, size, partitions, client, keys if keyed else 0)
        fetch_size = fetch or FETCH_BATCHES * batch  # what KmqConsumer fetches per START (fetch=None: its default)
        say(f"[{client}] produced {messages} x {size} B to {queue} ({partitions} partition(s)) in "
            f"{time.perf_counter() - t:.1f}s; both poll {batch} at a time, KmqConsumer fetches up to "
            f"{fetch_size} per START (default settings)")
        if keyed and (share or no_renew or tuned_gc or iterate):
            raise click.ClickException("--ordering key is a comparison of its own: run it without --share, "
                                       "--no-renew, --tuned-gc and --iterate")
        if keyed:
            base, test = "kmq", "kmq-key"
            say(f"ordering: key ({keys} key(s)) against ordering: none, both KmqConsumer")
            variants: tuple[str, ...] = (base, test)
        else:
            variants = (("plain", "kmq") + (("plain-tuned",) if client == "confluent" else ())
                        + (("share",) if share else ()) + (("kmq-no-renew",) if no_renew else ())
                        + (("kmq-gc",) if tuned_gc else ()) + (("kmq-iter",) if iterate else ()))
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for r in range(rounds):
            for variant in variants:
                res = _spawn(variant, bootstrap, queue, messages, batch, flush_interval,
                             profile if r == rounds - 1 else None, fetch, client)
                res["rate"] = res["messages"] / res["seconds"]
                runs[variant].append(res)
                full = f", full collections {said(res['full_gc'])}" if "full_gc" in res else ""
                say(f"round {r + 1} {variant:7s}: {res['rate']:>9,.0f} msg/s  ({res['seconds']:.2f}s, cpu {res['cpu_seconds']:.2f}s, "
                    f"markers {res['markers']}, peak RSS {res['rss_mb']:.0f} MB{full})")
        if keyed:
            return _ordering_result(runs, client, messages, keys, partitions, say)
        plain = [x["rate"] for x in runs["plain"]]
        kmq = [x["rate"] for x in runs["kmq"]]
        ratios = [k / p for k, p in zip(kmq, plain)]
        result = {
            "client": client, "messages": messages, "size": size, "batch": batch, "fetch": fetch_size, "rounds": rounds,
            "partitions": partitions,
            "plain_msgs_per_s": plain, "kmq_msgs_per_s": kmq,
            "plain_median": statistics.median(plain), "kmq_median": statistics.median(kmq),
            "ratio_per_round": ratios, "ratio_median": statistics.median(ratios),
            "markers_per_message": statistics.median(x["markers"] / x["messages"] for x in runs["kmq"]),
            "peak_rss_mb": {"plain": max(x["rss_mb"] for x in runs["plain"]), "kmq": max(x["rss_mb"] for x in runs["kmq"])},
        }
        say(f"[{client}] plain median {result['plain_median']:,.0f} msg/s, kmq median {result['kmq_median']:,.0f} msg/s")
        say(f"ratio kmq/plain per round {', '.join(f'{x:.3f}' for x in ratios)}; median {result['ratio_median']:.3f}")
        say(f"marker records per message {result['markers_per_message']:.4f} (target <= 0.05 at batch 500)")
        say(f"peak RSS plain {result['peak_rss_mb']['plain']:.0f} MB, kmq {result['peak_rss_mb']['kmq']:.0f} MB")
        result["full_gc"] = {v: merge([x["full_gc"] for x in runs[v]]) for v in variants
                             if all("full_gc" in x for x in runs[v])}
        say(f"[{client}] full garbage collections at full speed (target: kmq's at most 5 ms, collector at "
            "defaults): " + "; ".join(f"{v} {said(f)}" for v, f in result["full_gc"].items()))
        if "plain-tuned" in runs:
            tuned = [x["rate"] for x in runs["plain-tuned"]]
            against = [k / t for k, t in zip(kmq, tuned)]
            result.update({"plain_tuned_msgs_per_s": tuned, "plain_tuned_median": statistics.median(tuned),
                           "ratio_to_tuned_plain_per_round": against,
                           "ratio_to_tuned_plain_median": statistics.median(against)})
            say(f"[{client}] plain loop with kmq's fetch.queue.backoff.ms median {result['plain_tuned_median']:,.0f} "
                f"msg/s; ratio kmq/that loop per round {', '.join(f'{x:.3f}' for x in against)}; median "
                f"{result['ratio_to_tuned_plain_median']:.3f}")
        if share:
            result.update(_against_kmq(runs, "share", "share"))
            result["share_markers_per_message"] = statistics.median(x["markers"] / x["messages"] for x in runs["share"])
            say(f"[{client}] share API median {result['share_median']:,.0f} msg/s; ratio share/kmq per round "
                f"{', '.join(f'{x:.3f}' for x in result['share_ratio_per_round'])}; median "
                f"{result['share_ratio_median']:.3f} (target >= 0.9); CPU per message share/kmq "
                f"{result['share_cpu_per_message_ratio_median']:.3f}")
        if no_renew:
            off = _against_kmq(runs, "kmq-no-renew", "no_renew")
            on_off = [1 / r for r in off["no_renew_ratio_per_round"]]  # reported as on/off: the default against the old one
            result.update({"no_renew_msgs_per_s": off["no_renew_msgs_per_s"], "no_renew_median": off["no_renew_median"],
                           "renew_ratio_per_round": on_off, "renew_ratio_median": statistics.median(on_off)})
            say(f"[{client}] consumer.auto_renew false median {result['no_renew_median']:,.0f} msg/s; ratio "
                f"auto_renew on/off per round {', '.join(f'{x:.3f}' for x in on_off)}; median "
                f"{result['renew_ratio_median']:.3f}")
        if tuned_gc:
            result.update(_against_kmq(runs, "kmq-gc", "gc"))
            result["gc_gen0"] = {"kmq": runs["kmq"][0]["gc_gen0"], "kmq-gc": runs["kmq-gc"][0]["gc_gen0"]}
            say(f"[{client}] KmqConsumer with the collector tuned (as in kmq work) median {result['gc_median']:,.0f} "
                f"msg/s; ratio tuned/default per round {', '.join(f'{x:.3f}' for x in result['gc_ratio_per_round'])}; "
                f"median {result['gc_ratio_median']:.3f}; CPU per message tuned/default "
                f"{result['gc_cpu_per_message_ratio_median']:.3f}")
        if iterate:
            result.update(_against_kmq(runs, "kmq-iter", "iter"))
            say(f"[{client}] KmqConsumer iterated (for msg in consumer) median {result['iter_median']:,.0f} msg/s; "
                f"ratio iteration/poll loop per round {', '.join(f'{x:.3f}' for x in result['iter_ratio_per_round'])}; "
                f"median {result['iter_ratio_median']:.3f}; CPU per message {result['iter_cpu_per_message_ratio_median']:.3f}")
        return result
    finally:
        if broker is not None:
            broker.stop()


def _against_kmq(runs: dict[str, list[dict]], variant: str, prefix: str) -> dict:
    """A second variant's runs against the default KmqConsumer runs of the same rounds, as
    ``{prefix}_...`` figures: throughput, its ratio per round, and the CPU seconds per message
    ratio (steadier than wall time on a loaded machine)."""
    rates = [x["rate"] for x in runs[variant]]
    ratios = [v / k["rate"] for v, k in zip(rates, runs["kmq"])]
    cpu = [(v["cpu_seconds"] / v["messages"]) / (k["cpu_seconds"] / k["messages"]) for v, k in zip(runs[variant], runs["kmq"])]
    return {f"{prefix}_msgs_per_s": rates, f"{prefix}_median": statistics.median(rates),
            f"{prefix}_ratio_per_round": ratios, f"{prefix}_ratio_median": statistics.median(ratios),
            f"{prefix}_cpu_per_message_ratio_median": statistics.median(cpu)}


def _ordering_result(runs: dict[str, list[dict]], client: str, messages: int, keys: int, partitions: int,
                     say: Any) -> dict:
    """The figures of ``--ordering key``: key/none throughput, the most of one key out at once."""
    none = [x["rate"] for x in runs["kmq"]]
    key = [x["rate"] for x in runs["kmq-key"]]
    ratios = [k / n for k, n in zip(key, none)]
    most = max(x.get("most_per_key", 0) for x in runs["kmq-key"])
    result = {"client": client, "messages": messages, "keys": keys, "partitions": partitions,
              "none_msgs_per_s": none, "key_msgs_per_s": key, "ratio_per_round": ratios,
              "ratio_median": statistics.median(ratios), "most_per_key_at_once": most,
              "most_per_key_at_once_unordered": max(x.get("most_per_key", 0) for x in runs["kmq"])}
    say(f"[{client}] ordering none median {statistics.median(none):,.0f} msg/s, key median "
        f"{statistics.median(key):,.0f} msg/s; ratio key/none per round {', '.join(f'{x:.3f}' for x in ratios)}; "
        f"median {result['ratio_median']:.3f} (target >= 0.8 with 1,000 keys)")
    say(f"most messages of one key handed out at once: {most} with ordering: key (contract: 1), "
        f"{result['most_per_key_at_once_unordered']} with ordering: none")
    return result


@click.command("consumer")
@click.option("--client", type=click.Choice(CLIENTS), default="kafka-python", show_default=True,
              help="Kafka client of both variants (kafka.client).")
@click.option("--messages", type=click.IntRange(min=1), default=None,
              help="Messages to read (default 200,000 on kafka-python, 1,000,000 on confluent).")
@click.option("--size", type=click.IntRange(min=1), default=100, show_default=True, help="Payload bytes.")
@click.option("--batch", type=click.IntRange(min=1), default=500, show_default=True,
              help="Records per poll (plain: max_records and commit; kmq: poll(max_records)).")
@click.option("--fetch", type=click.IntRange(min=1), default=None,
              help="KmqConsumer fetch_size: records per Kafka poll and START (default 8 x batch).")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True, help="A/B alternations.")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--flush-interval", default="100ms", show_default=True, help="consumer.ack_flush_interval for kmq.")
@click.option("--bootstrap", default=None, help="Use this broker instead of an embedded one.")
@click.option("--profile", default=None, help="Write a py-spy flame graph (SVG) of the last kmq run here.")
@click.option("--share", is_flag=True,
              help="Also run kmq.share.ShareConsumer (the share-consumer API) each round; reports share/kmq.")
@click.option("--no-renew", is_flag=True,
              help="Also run KmqConsumer with consumer.auto_renew false each round; reports auto_renew on/off "
                   "(the default, on, against the earlier default).")
@click.option("--tuned-gc", is_flag=True,
              help="Also run KmqConsumer in a process whose garbage collector is tuned as kmq work's is "
                   "(kmq.config.process.tune_collector); reports tuned/default and CPU per message.")
@click.option("--iterate", is_flag=True,
              help="Also run KmqConsumer iterated (for msg in consumer) each round; reports it against the "
                   "poll(max_records=batch) loop.")
@click.option("--ordering", type=click.Choice(("none", "key")), default="none", show_default=True,
              help="key: compare consumer.ordering key with none (keyed records) instead of plain with kmq.")
@click.option("--keys", type=click.IntRange(min=1), default=1000, show_default=True,
              help="With --ordering key: distinct record keys, round robin.")
@click.option("--latency-rate", type=click.IntRange(min=1), default=None,
              help="Measure delivery latency instead of throughput: records/s produced live while each variant "
                   "consumes (p50/p95/p99, see kmq.bench.consumer_latency).")
@click.option("--latency-seconds", type=click.FloatRange(min=1), default=10.0, show_default=True,
              help="With --latency-rate: seconds of records measured per run.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON too.")
def command(as_json: bool, latency_rate: int | None, latency_seconds: float, **opts: Any) -> None:
    """Plain consumer group loop vs KmqConsumer (and with --share the share-consumer API) on one
    embedded broker, side by side (either client)."""
    if latency_rate:

        result = run_latency(latency_rate, latency_seconds, opts["client"], opts["batch"], opts["rounds"],
                             opts["bootstrap"], click.echo)
    else:
        result = run(echo=click.echo, **opts)
    if as_json:
        click.echo(json.dumps(result))
