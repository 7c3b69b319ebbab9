"""kafka.kafka_python and kafka.confluent reach the real clients kmq builds on the broker: a
confluent producer partitions as the passed-through ``partitioner`` says, and kafka-python's
consumers (group and log reader), producer and admin client run with the passed-through values."""

from __future__ import annotations

import dataclasses
import zlib

import pytest
from kafka.partitioner.default import murmur2

from kmq.client import factory
from kmq.client.kafka_python.clients import admin_client
from kmq.config.client_settings import ClientSettings

pytestmark = pytest.mark.integration

PARTITIONS = 8


def _key_partitioned_apart() -> tuple[bytes, int, int]:
    """A key that librdkafka's default partitioner (consistent_random: CRC32) and murmur2 (the Java
    clients' and kafka-python's) put on different partitions: (key, crc32's, murmur2's)."""
    for i in range(1000):
        key = b"key-%d" % i
        crc, mm = zlib.crc32(key) % PARTITIONS, (murmur2(key) & 0x7FFFFFFF) % PARTITIONS
        if crc != mm:
            return key, crc, mm
    raise AssertionError("no key found")  # pragma: no cover


def _partition_of(cfg, topic: str, key: bytes) -> int:
    prod = factory.producer(cfg.kafka)
    try:
        delivery = prod.send(topic, value=b"v", key=key)
        prod.flush(30)
        return delivery.get(30)[1]
    finally:
        factory.close_producer(prod)


def test_a_librdkafka_setting_in_kafka_confluent_reaches_kmqs_producer(queue_topics):
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
    cfg, q = queue_topics(partitions=PARTITIONS, kafka={"client": "confluent"})
    key, crc, mm = _key_partitioned_apart()
    assert _partition_of(cfg, q.name, key) == crc  # librdkafka's own default
    passed = cfg.replace(kafka=dataclasses.replace(cfg.kafka, confluent=ClientSettings({"partitioner": "murmur2"})))
    assert _partition_of(passed, q.name, key) == mm


def test_kafka_python_settings_reach_each_kafka_python_client_kmq_builds(queue_topics):
    cfg, q = queue_topics(partitions=1, kafka={"kafka_python": {"client_rack": "rack-a", "connections_max_idle_ms": 123_000,
                                                                 "linger_ms": 7}})
    group = factory.group_consumer(cfg.kafka, cfg.consumer.group_id, "RANGE", 10)
    reader = factory.open_log_reader(cfg.kafka)
    prod = factory.producer(cfg.kafka)
    admin = admin_client(cfg.kafka)
    try:
        for consumer in (group.raw, reader._consumer):
            assert (consumer.config["client_rack"], consumer.config["connections_max_idle_ms"]) == ("rack-a", 123_000)
        assert (prod.config["linger_ms"], prod.config["connections_max_idle_ms"]) == (7, 123_000)
        assert admin.config["connections_max_idle_ms"] == 123_000
    finally:
        group.close()
        reader.close()
        factory.close_producer(prod)
        admin.close()
