"""The consumer side of the public surface: exported names, no pyspark on import."""

from __future__ import annotations

import subprocess
import sys

import kmq


def test_consumer_names_are_exported():
    for name in ("KmqConsumer", "KmqMessage", "MarkerWriter", "marked", "IdempotencyGuard"):
        assert name in kmq.__all__
        assert getattr(kmq, name).__module__.startswith("kmq.")
    assert sorted(set(kmq.__all__)) == sorted(kmq.__all__)


def test_import_kmq_never_imports_pyspark():
    code = "import sys, kmq; assert 'pyspark' not in sys.modules, 'pyspark imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_work_fates_are_deterministic_and_near_their_rates():
    from kmq.dev.workload import fate, is_poison, is_poison_index, payload

    fates = [fate(f"orders/0/{i}", 1, 0.3, 0.2) for i in range(2000)]
    assert fates == [fate(f"orders/0/{i}", 1, 0.3, 0.2) for i in range(2000)]
    assert 0.25 < fates.count("fail") / 2000 < 0.35 and 0.15 < fates.count("hang") / 2000 < 0.25
    poison = [i for i in range(100) if is_poison_index(i, 0.05)]
    assert len(poison) == 5
    assert all(is_poison(payload(i, 100, True)) for i in poison)
    assert not is_poison(payload(3, 100, False)) and is_poison(payload(19, 100, False), 0.05)
    assert len(payload(7, 100, False)) == 100


def test_kmq_on_confluent_kafka_or_aiokafka_never_imports_kafka_python():
    # kafka-python's modules are some 25,000 objects every full garbage collection visits: a process
    # on another client must not carry them.
    code = ("import sys, kmq, kmq.consumer.aio, kmq.client.confluent.consumer, kmq.client.aiokafka.consumer; "
            "from kmq.config import KafkaConfig; from kmq.client.confluent.settings import settings; "
            "settings(KafkaConfig(bootstrap_servers='localhost:9092', client='confluent')); "
            "assert 'kafka' not in sys.modules, 'kafka-python imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
