"""``kmq bench trace``: what a ``kmq trace`` scan costs, next to a plain read of the same records.

Writes ``markers`` marker records (alternating START/END, one offset each, the
worst case: no coalescing) and ``queue`` queue records to one partition, then,
in the same run, times (a) a bare kafka-python read of both partitions to
their ends and (b) :func:`kmq.ops.trace_reader.trace` of the first message,
which reads the same records and decodes every marker. The ratio says how much
the trace's decoding and bookkeeping add to the read itself.
"""

from __future__ import annotations

import json
import time

import click
from kafka import TopicPartition

from kmq.dev.broker import broker_unless

__all__ = ["run", "command"]


def _plain_read(cfg, tps: list[TopicPartition], expect: int) -> float:
    from kmq.client.kafka_python.clients import consumer

    c = consumer(cfg.kafka, enable_auto_commit=False, max_poll_records=5000, fetch_max_wait_ms=50)
    try:
        t0 = time.perf_counter()
        n = 0
        for tp in tps:
            c.assign([tp])
            c.seek_to_beginning(tp)
            while True:
                n += sum(len(v) for v in c.poll(timeout_ms=100).values())
                hw = c.highwater(tp)
                if hw is not None and c.position(tp) >= hw:
                    break
        elapsed = time.perf_counter() - t0
        if n != expect:
            raise click.ClickException(f"plain read saw {n} records, expected {expect}")
        return elapsed
    finally:
        c.close()


def run(bootstrap: str | None = None, markers: int = 200_000, queue: int = 20_000) -> dict:
    from kafka import KafkaProducer

    from kmq.config import Config
    from kmq.core.markers import End, Start, encode, encode_key
    from kmq.core.ranges import OffsetRange
    from kmq.client.topics import ensure_topics
    from kmq.ops.trace_reader import trace

    bootstrap, broker = broker_unless(bootstrap)
    try:
        name = f"bench-trace-{int(time.time())}"
        cfg = Config.from_dict({"kafka": {"bootstrap_servers": bootstrap}, "queues": [{"name": name}]})
        ensure_topics(cfg.kafka, cfg.queues[0], 1)
        p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024)
        for i in range(queue):
            p.send(name, key=b"k%d" % i, value=b"x" * 100, partition=0)
        for i in range(markers):
            m = Start((OffsetRange(i // 2, 1),), 30_000, "w") if i % 2 == 0 else End((OffsetRange(i // 2, 1),))
            p.send(cfg.queues[0].markers_topic, key=encode_key(0), value=encode(m), partition=0)
        p.flush()
        p.close()
        total = queue + markers
        tps = [TopicPartition(name, 0), TopicPartition(cfg.queues[0].markers_topic, 0)]
        plain_s = _plain_read(cfg, tps, total)
        t0 = time.perf_counter()
        (t,) = trace(cfg, name, origin=f"{name}/0/0")
        trace_s = time.perf_counter() - t0
        return {
            "records": total, "markers": markers, "queue_records": queue,
            "plain_read_s": round(plain_s, 2), "plain_records_per_s": int(total / plain_s),
            "trace_s": round(trace_s, 2), "trace_records_per_s": int(t.scan["records_read"] / trace_s),
            "trace_records_read": t.scan["records_read"], "trace_over_plain": round(trace_s / plain_s, 2),
            "state": t.state,
        }
    finally:
        if broker is not None:
            broker.stop()


@click.command("trace")
@click.option("--bootstrap", help="Kafka to measure on (default: an embedded broker).")
@click.option("--markers", default=200_000, show_default=True, help="Marker records to scan.")
@click.option("--queue", "queue_records", default=20_000, show_default=True, help="Queue records to scan.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def command(bootstrap: str | None, markers: int, queue_records: int, as_json: bool) -> None:
    """Cost of a `kmq trace` scan next to a plain read of the same records."""
    f = run(bootstrap, markers, queue_records)
    if as_json:
        click.echo(json.dumps(f, indent=2))
        return
    click.echo(f"plain read  {f['records']:,} records in {f['plain_read_s']}s ({f['plain_records_per_s']:,}/s)")
    click.echo(f"kmq trace   {f['trace_records_read']:,} records in {f['trace_s']}s ({f['trace_records_per_s']:,}/s), "
               f"{f['trace_over_plain']}x the plain read; final state {f['state']}")
