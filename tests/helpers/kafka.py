"""Helpers for integration tests: wait on real conditions, never sleep-and-hope."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from kafka import KafkaConsumer, TopicPartition

from kmq.config import Config, KafkaConfig
from kmq.dev.broker import DevBroker
from kmq.dev.kafka import KafkaCluster

T = TypeVar("T")

#: A tansu gap seen after a broker SIGKILL, in its words for a skip.
LATEST_OFFSET_GAP = ("latest-offset look-ups (ListOffsets LATEST, what Spark's Kafka connector plans micro-batches "
                     "with) answer the first offset of the last produced batch plus one, so the connector never "
                     "reads the rest of the last batch")
DUPLICATE_SEQUENCE_GAP = ("after a SIGKILL, an idempotent producer's retry of the batch being written is answered "
                          "DUPLICATE_SEQUENCE_NUMBER (error 46, which Kafka's clients count as delivered) though the "
                          "batch is not in the log; Kafka rebuilds a producer's sequence state from the log itself, "
                          "so there a duplicate is always in the log")


def recent_ms(align_ms: int = 10_000) -> int:
    """A record timestamp an hour ago, a multiple of ``align_ms``: what tests give records they
    time themselves. Not a fixed date: Kafka deletes records older than a topic's retention (7 days
    for markers) at its next retention check, seconds after they are written."""
    return (int(time.time() * 1000) - 3_600_000) // align_ms * align_ms


def set_max_message_bytes(bootstrap: str, size: int, *topics: str) -> None:
    """Set ``max.message.bytes`` of ``topics``; nothing on the embedded broker, which keeps no topic
    configs (it has no such limit, and answers AlterConfigs with an error)."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, t, configs={"max.message.bytes": str(size)})
                             for t in topics])
    except ValueError as exc:
        if "Unrecognized configs" not in str(exc):
            raise
    finally:
        admin.close()


def broker_kind() -> str:
    """The broker the suite runs on: ``KMQ_TEST_BROKER``, ``tansu`` (the default) or ``kafka``
    (Apache Kafka from Maven Central, kmq.dev.kafka)."""
    kind = os.environ.get("KMQ_TEST_BROKER", "tansu")
    if kind not in ("tansu", "kafka"):
        raise ValueError(f"KMQ_TEST_BROKER must be tansu or kafka, got {kind!r}")
    return kind


def own_broker(workdir: str | Path | None = None, durable: bool = True) -> DevBroker | KafkaCluster:
    """A broker of one test's own, not started, of the suite's kind: for tests that kill, stop
    or restart it. On real Kafka a one-broker cluster (its log is on disk, so it is always
    durable); on tansu the embedded broker, on S3 storage when ``durable``."""
    workdir = None if workdir is None else str(workdir)
    if broker_kind() == "kafka":
        return KafkaCluster(brokers=1, workdir=workdir)
    return DevBroker(storage="s3" if durable else "memory", workdir=workdir)


class Produced(NamedTuple):
    """Where one record of :func:`produce` was written."""

    topic: str
    partition: int
    offset: int


#: What one field (key, value, headers, timestamp) of the records of :func:`produce` is: one constant
#: (None too; a list of header tuples is one), a sequence (one item a record), a function of the
#: record's number, or bytes with ``%d`` (formatted with the number: ``b"m%d"`` gives ``m0``, ``m1``...).
PerRecord = Any


def _field(spec: PerRecord, index: int, number: int) -> Any:
    if callable(spec):
        return spec(number)
    if isinstance(spec, bytes):
        return spec % number if b"%d" in spec else spec
    if isinstance(spec, (list, tuple)):
        if spec and not isinstance(spec[0], tuple):
            return spec[index]  # one item a record
        return list(spec)  # header tuples: the same headers on every record
    return spec


#: The records the tracker's tests produce: key ``k<i>``, value ``v<i>`` and an application's
#: header, which a redelivered copy keeps.
APP_RECORD = {"keys": b"k%d", "values": b"v%d", "headers": [("app", b"x")]}


def produce(
    target: str | KafkaConfig | Config,
    topic: str,
    n: int | None = None,
    *,
    values: PerRecord = b"m%d",
    keys: PerRecord = None,
    headers: PerRecord = None,
    timestamps: PerRecord = None,
    partition: int | None = 0,
    partitions: int = 1,
    start: int = 0,
    client: str = "kafka-python",
    flush_each: bool = False,
    settings: Mapping[str, Any] | None = None,
) -> list[Produced]:
    """Produce ``n`` records (numbered ``start``, ``start + 1``...; without ``n``, one per item of the
    ``values`` or ``keys`` sequence) to ``topic``, in order, every one acknowledged; returns where
    each was written.

    ``target`` is a bootstrap address (a plain ``KafkaProducer``, acks=all) or a config (kmq's
    kafka-python producer for ``kafka``, with its TLS/SASL settings). Record ``i`` goes to partition
    ``partition + i % partitions``; ``partition=None`` leaves it to the producer's partitioner (by
    key). ``timestamps`` are milliseconds (None: the producer's clock). ``client="confluent"``
    produces with librdkafka (from a bootstrap address only). ``flush_each`` flushes after every
    record; ``settings`` are the producer's own (kafka-python keyword arguments, or librdkafka
    properties)."""
    if n is None:
        n = next((len(s) for s in (values, keys) if isinstance(s, (list, tuple))), None)
        if n is None:
            raise ValueError("produce() needs n, or values or keys as a sequence")
    records = [(_field(keys, i, start + i), _field(values, i, start + i), _field(headers, i, start + i),
                _field(timestamps, i, start + i)) for i in range(n)]
    settings = dict(settings or {})
    if client == "confluent":
        return _produce_confluent(target, topic, records, partition, partitions, flush_each, settings)
    if client != "kafka-python":
        raise ValueError(f"client must be kafka-python or confluent, got {client!r}")
    if isinstance(target, str):
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=target, **{"acks": "all", **settings})
    else:
        from kmq.client.kafka_python import clients

        producer = clients.producer(target.kafka if isinstance(target, Config) else target, **settings)
    try:
        futures = []
        for i, (key, value, hdrs, ts) in enumerate(records):
            part = None if partition is None else partition + i % partitions
            futures.append(producer.send(topic, key=key, value=value, headers=hdrs, partition=part, timestamp_ms=ts))
            if flush_each:
                producer.flush()
        producer.flush()
        return [Produced(topic, m.partition, m.offset) for m in (f.get(10) for f in futures)]
    finally:
        producer.close()


def _produce_confluent(bootstrap, topic, records, partition, partitions, flush_each, settings) -> list[Produced]:
    import confluent_kafka

    if not isinstance(bootstrap, str):
        raise TypeError("produce(client='confluent') takes a bootstrap address")
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **settings})
    done: dict[int, Produced] = {}

    def report(i: int) -> Callable:
        def on_delivery(err, msg) -> None:
            assert err is None, err
            done[i] = Produced(topic, msg.partition(), msg.offset())
        return on_delivery

    for i, (key, value, hdrs, ts) in enumerate(records):
        kw: dict[str, Any] = {"key": key, "value": value, "on_delivery": report(i)}
        if ts is not None:
            kw["timestamp"] = ts
        if partition is not None:
            kw["partition"] = partition + i % partitions
        if hdrs is not None:
            kw["headers"] = hdrs
        producer.produce(topic, **kw)
        if flush_each:
            producer.flush(10)
    assert producer.flush(30) == 0, "records left undelivered after 30 s"
    return [done[i] for i in range(len(records))]


def produce_records(bootstrap: str, topic: str, records: list[dict]) -> list[int]:
    """Records given whole (a dict of ``key``, ``value`` and ``headers``, each may be absent or None,
    header values too), produced with librdkafka one at a time to partition 0, so they are written
    as given; returns their offsets."""
    done = produce(bootstrap, topic, values=[r.get("value") for r in records], keys=[r.get("key") for r in records],
                   headers=[r.get("headers") for r in records], client="confluent", flush_each=True,
                   settings={"message.max.bytes": 5_000_000, "enable.idempotence": True})
    return [p.offset for p in done]


def wait_until(cond: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "condition") -> T:
    """Poll ``cond`` until it returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_for_assignment(consumer: KafkaConsumer, timeout: float = 30.0) -> set[TopicPartition]:
    """Poll until the group assigned partitions. Call it before producing: it does not
    advance positions, but it is meant for empty topics."""

    def assigned():
        if not consumer.assignment():
            consumer.poll(timeout_ms=100, max_records=1, update_offsets=False)
        return consumer.assignment()

    return wait_until(assigned, timeout, what="consumer group assignment")


def read_all(bootstrap: str, topic: str, timeout: float = 10.0, expect: int | None = None) -> list:
    """Every record of ``topic`` from the beginning (no group). Stops when ``expect``
    records were read or when a poll returns nothing after the end of all partitions."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out = []
        deadline = time.monotonic() + timeout
        idle = 0
        while time.monotonic() < deadline:
            batch = c.poll(timeout_ms=200)
            got = [r for recs in batch.values() for r in recs]
            out.extend(got)
            if expect is not None and len(out) >= expect:
                break
            if not got:
                idle += 1
                # End of all partitions: the high-water mark from the last fetch equals the position.
                if expect is None and idle >= 2 and all(
                    c.highwater(tp) is not None and c.position(tp) >= c.highwater(tp) for tp in tps
                ):
                    break
            else:
                idle = 0
        return out
    finally:
        c.close()


#: A record batch's codec (its attributes & 7) by number, named as ``queues[].compression`` names it.
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def stored_codecs(bootstrap: str, topic: str, partition: int = 0, timeout: float = 10.0) -> dict[int, str]:
    """The codec each record of one partition is stored with, by offset: the attributes of the record
    batches the broker serves, seen in a kafka-python fetch before the records are decoded (its
    fetcher's ``PartitionRecords`` receives the batches of one partition as they came)."""
    from kafka.record import MemoryRecords

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      fetch_max_wait_ms=50)
    tp = TopicPartition(topic, partition)
    codecs: dict[int, str] = {}
    fetcher = c._fetcher  # kafka-python internals, pinned below 4 (see pyproject.toml)
    parse = fetcher.PartitionRecords

    def spy(fetch_offset, fetched_tp, records, **kw):
        batches = MemoryRecords(records._buffer)
        while (batch := batches.next_batch()) is not None:
            for offset in range(batch.base_offset, batch.next_offset):
                codecs[offset] = CODEC_NAMES.get(batch.compression_type, str(batch.compression_type))
        return parse(fetch_offset, fetched_tp, records, **kw)

    fetcher.PartitionRecords = spy
    try:
        c.assign([tp])
        c.seek_to_beginning(tp)
        deadline = time.monotonic() + timeout
        while c.highwater(tp) is None or c.position(tp) < c.highwater(tp):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s reading {topic}[{partition}]")
            c.poll(timeout_ms=100)
        high = c.highwater(tp)
        return {offset: codec for offset, codec in codecs.items() if offset < high}
    finally:
        c.close()
