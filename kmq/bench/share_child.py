"""The consumer side of ``kmq bench share``: one variant, one phase, in its own process.

Each entry point prints one ``RESULT {json}`` line (and ``READY`` when its consumer has joined,
for the latency phase). Variants:

* ``native``: ``confluent_kafka.ShareConsumer`` in explicit mode (the broker's share group);
* ``kmq-share``: :class:`kmq.share.ShareConsumer` in explicit mode, ``kmq.kafka.client`` confluent;
* ``kmq``: :class:`kmq.KmqConsumer` on confluent-kafka, ``ack()`` per message.

The handler is the same in all of them: a CRC of the value, then ``processing_ms`` of sleep, then
the acknowledgement (ACCEPT / ``ack()``). Every loop stops at its count or at its deadline.
"""

from __future__ import annotations

import json
import logging
import resource
import time
import zlib
from typing import Any, Callable

__all__ = ["VARIANTS", "child"]

VARIANTS = ("native", "kmq-share", "kmq")
#: Records sent this long after the consumer has joined are measured (join and warm-up excluded).
WARM_UP = 1.0


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _handler(processing_ms: float) -> Callable[[bytes], int]:
    pause = processing_ms / 1000.0

    def handle(value: bytes) -> int:
        crc = zlib.crc32(value)
        if pause:
            time.sleep(pause)
        return crc

    return handle


def _sent_at(value: bytes) -> float:
    return float(value[:20])


class _Consumer:
    """One variant behind three calls: ``poll()`` -> [(value, delivery count, handle)], ``ack(handle)``, ``close()``."""

    def __init__(self, variant: str, a: dict) -> None:
        self.variant = variant
        group, topic = a["group"], a["topic"]
        if variant == "native":
            from confluent_kafka import AcknowledgeType, ShareConsumer

            self._accept = AcknowledgeType.ACCEPT
            self.c: Any = ShareConsumer({"bootstrap.servers": a["bootstrap"], "group.id": group,
                                         "share.acknowledgement.mode": "explicit", "log_level": 3, **a.get("native_extra", {})})
            self.c.subscribe([topic])
        elif variant == "kmq-share":
            from kmq.share import AcknowledgeType, ShareConsumer  # type: ignore[assignment]  # confluent_kafka's API

            self._accept = AcknowledgeType.ACCEPT
            self.c = ShareConsumer({
                "bootstrap.servers": a["bootstrap"], "group.id": group, "share.acknowledgement.mode": "explicit",
                "kmq.kafka.client": "confluent", "kmq.lease.ms": int(a["lease_s"] * 1000),
                "kmq.session.timeout.ms": 6000, "kmq.heartbeat.interval.ms": 1000,
                "kmq.config": _kmq_config(a)})
            self.c.subscribe([topic])
        else:
            from kmq.consumer.consumer import KmqConsumer

            self.c = KmqConsumer(_kmq_config(a), batch_size=500)

    def poll(self, timeout: float) -> list[tuple[bytes, int, Any]]:
        if self.variant == "kmq":
            return [(m.value, m.delivery_count, m) for m in self.c.poll(timeout=timeout, max_records=500)]
        return [(m.value(), m.delivery_count() or 1, m) for m in self.c.poll(timeout) if m.error() is None]

    def ack(self, handle: Any) -> None:
        if self.variant == "kmq":
            handle.ack()
        else:
            self.c.acknowledge(handle, self._accept)

    def finish(self) -> None:
        """Every acknowledgement sent (and for kmq in Kafka): the clock of a throughput run stops after it."""
        if self.variant == "kmq":
            self.c.writer.flush()
        else:
            self.c.commit_sync(60)

    def close(self) -> None:
        self.c.close()


def _kmq_config(a: dict) -> Any:
    from kmq.config import Config

    return Config.from_dict({
        "kafka": {"bootstrap_servers": a["bootstrap"], "session_timeout": "6s", "heartbeat_interval": "1s",
                  "client": "confluent"},
        "queues": [{"name": a["topic"], "lease": f"{a['lease_s']}s"}],
        # auto_renew off in the redelivery phase: a held message's lease runs out, as a native lock does.
        "consumer": {"group_id": a["group"], "auto_renew": a.get("auto_renew", True)},
    })


def throughput(variant: str, a: dict) -> dict:
    """Read ``messages`` pre-produced records; the clock runs from the first record to the last acknowledgement sent."""
    handle = _handler(a["processing_ms"])
    c = _Consumer(variant, a)
    n = redelivered = 0
    t0: float | None = None
    c0 = 0.0
    deadline = time.monotonic() + a["timeout"]
    while n < a["messages"] and time.monotonic() < deadline:
        batch = c.poll(0.5)
        if batch and t0 is None:
            t0, c0 = time.perf_counter(), _cpu()
        for value, count, h in batch:
            handle(value)
            c.ack(h)
            n += 1
            redelivered += count > 1
    if t0 is None:
        c.close()
        raise SystemExit(f"{variant}: no record within {a['timeout']}s")
    c.finish()
    took, cpu = time.perf_counter() - t0, _cpu() - c0
    c.close()
    return {"messages": n, "seconds": took, "cpu_seconds": cpu, "redelivered": redelivered,
            "complete": n >= a["messages"]}


def latency(variant: str, a: dict) -> dict:
    """Produce-to-handler latency of the records sent from :data:`WARM_UP` after the probe for ``seconds``."""
    handle = _handler(a["processing_ms"])
    c = _Consumer(variant, a)
    lat: list[float] = []
    start: float | None = None
    until = 0.0  # set with start
    seen = 0
    deadline = time.monotonic() + a["timeout"]
    cpu0 = _cpu()
    while time.monotonic() < deadline:
        done = False
        for value, _count, h in c.poll(0.2):
            now = time.time()
            handle(value)
            c.ack(h)
            seen += 1
            if start is None:  # the probe: joined, the producer starts now
                print("READY", flush=True)
                start, until = now + WARM_UP, now + WARM_UP + a["seconds"]
                continue
            sent = _sent_at(value)
            if sent >= until:
                done = True
            elif sent >= start:
                lat.append(now - sent)
        if done:
            break
    cpu = _cpu() - cpu0
    c.finish()
    c.close()
    lat.sort()

    def pct(q: float) -> float | None:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else None

    return {"measured": len(lat), "p50_ms": pct(0.5), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
            "max_ms": lat[-1] * 1000 if lat else None, "handled": seen, "cpu_seconds": cpu}


def redelivery(variant: str, a: dict) -> dict:
    """For each of ``samples`` records: deliver it, never acknowledge it, and time its redelivery.

    The delay is the redelivered record's arrival at a handler minus (first arrival + lock), the
    same estimate for every variant: the lock (lease) really starts a little before the first
    arrival (when the broker acquires the record; when kmq's START is written), so the figure is
    below the true delay by that first fetch-to-handler time (and can be a little below zero).

    ``native``: two consumers of the group; the one that got the record stops polling (a stuck
    worker) and the other receives it after the lock expires. ``kmq``: one KmqConsumer that keeps
    polling, with ``consumer.auto_renew`` off (else it would renew the lease of the held message);
    the tracker's copy arrives on the same partition."""
    from confluent_kafka import Producer

    lease = a["lease_s"]
    a = {**a, "auto_renew": False}
    consumers = [_Consumer(variant, a)] + ([_Consumer(variant, {**a})] if variant == "native" else [])
    p = Producer({"bootstrap.servers": a["bootstrap"], "linger.ms": 0})
    samples: list[dict] = []
    try:
        _warm_up(consumers, p, a["topic"], a["partitions"])
        for i in range(a["samples"]):
            key = b"held-%d-%s" % (i, a["group"].encode())
            p.produce(a["topic"], value=key, partition=i % a["partitions"])
            p.flush(10)
            first_at = copy_at = None
            holder = held = None
            deadline = time.monotonic() + lease + a["timeout"]
            while copy_at is None and time.monotonic() < deadline:
                for idx, c in enumerate(consumers):
                    if idx == holder and len(consumers) > 1:
                        continue  # the stuck worker polls no more
                    for value, count, h in c.poll(0.1):
                        if value != key:
                            c.ack(h)
                        elif first_at is None:
                            first_at, holder, held = time.time(), idx, h  # never acknowledged
                        elif count > 1:
                            copy_at = time.time()
                            c.ack(h)
            if first_at is None or copy_at is None:
                raise SystemExit(f"{variant}: sample {i} was {'not delivered' if first_at is None else 'not redelivered'} "
                                 f"within {lease + a['timeout']:.0f}s")
            samples.append({"delay_ms": (copy_at - (first_at + lease)) * 1000,
                            "first_to_copy_ms": (copy_at - first_at) * 1000})
            if len(consumers) > 1 and held is not None:
                # The stuck worker comes back: its acknowledgement of the lost lock is refused by the
                # broker (the record is someone else's now); then it may poll again.
                consumers[holder].ack(held)  # type: ignore[index]
    finally:
        for c in consumers:
            c.close()
    return {"samples": samples}


def _warm_up(consumers: list[_Consumer], p: Any, topic: str, partitions: int) -> None:
    """Until every consumer has received a record (each is a member with partitions), at most 30 s."""
    got = [False] * len(consumers)
    deadline = time.monotonic() + 30
    while not all(got) and time.monotonic() < deadline:
        for i in range(partitions):
            p.produce(topic, value=b"warm-up", partition=i)
        p.flush(10)
        for idx, c in enumerate(consumers):
            for _value, _count, h in c.poll(0.2):
                c.ack(h)
                got[idx] = True
    if not all(got):
        raise SystemExit(f"{sum(not g for g in got)} consumer(s) received no record within 30 s of joining")


PHASES = {"throughput": throughput, "latency": latency, "redelivery": redelivery}


def child(phase: str, variant: str, args: str) -> None:
    """Entry point of a child process: run ``phase`` of ``variant`` with the JSON ``args``."""
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    out = PHASES[phase](variant, json.loads(args))
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("RESULT " + json.dumps(out), flush=True)
