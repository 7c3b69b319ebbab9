"""The settings kmq passes at the seam are kmq's names, translated for each client by one table."""

from __future__ import annotations

import pytest

from kmq.client.api import CONFLUENT, KAFKA_PYTHON
from kmq.client.overrides import CONSUMER, PRODUCER, native


def test_kmq_names_become_each_clients_own_with_milliseconds():
    kmq = {"linger": 0.02, "delivery_timeout": 31.0, "compression": "zstd", "max_request_size": 2_000_000}
    assert native(kmq, PRODUCER, KAFKA_PYTHON) == {"linger_ms": 20, "delivery_timeout_ms": 31_000,
                                                   "compression_type": "zstd", "max_request_size": 2_000_000}
    assert native(kmq, PRODUCER, CONFLUENT) == {"linger.ms": 20, "delivery.timeout.ms": 31_000,
                                                "compression.type": "zstd", "message.max.bytes": 2_000_000}


def test_a_setting_one_client_lacks_is_left_out_there_and_none_is_the_clients_default():
    kmq = {"fetch_wait": 0.1, "max_poll_records": 500, "prefetch_max_kbytes": 4096, "group_instance_id": None}
    assert native(kmq, CONSUMER, KAFKA_PYTHON) == {"fetch_max_wait_ms": 100, "max_poll_records": 500}
    assert native(kmq, CONSUMER, CONFLUENT) == {"fetch.wait.max.ms": 100, "queued.max.messages.kbytes": 4096}


def test_a_clients_own_name_is_refused_at_the_seam():
    with pytest.raises(TypeError, match="'linger_ms' is no client setting kmq passes"):
        native({"linger_ms": 5}, PRODUCER, KAFKA_PYTHON)
    with pytest.raises(TypeError, match="'fetch.wait.max.ms'"):
        native({"fetch.wait.max.ms": 5}, CONSUMER, CONFLUENT)


def test_librdkafka_takes_every_property_the_table_names():
    # Built without a broker (librdkafka connects later): a name it does not know fails construction.
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
    from kmq.client import factory
    from kmq.config import Config
    from kmq.spark.source_confluent import BATCH, SETTINGS

    kafka = Config.from_dict({"kafka": {"client": "confluent", "bootstrap_servers": "127.0.0.1:9"}}).kafka
    values = {"fetch_wait": 0.1, "metadata_max_age": 5.0, "max_poll_interval": 300.0, "group_instance_id": "i",
              "max_partition_fetch_bytes": 1, "fetch_max_bytes": 1 << 20, "reconnect_backoff_max": 1.0,
              "prefetch_max_kbytes": 1024, "max_poll_records": 10}
    assert set(values) == set(CONSUMER)
    factory.group_consumer(kafka, "g", "RANGE", 10, **values).close()
    reader = factory.open_log_reader(kafka, 1.0, max_poll_records=BATCH, **SETTINGS)
    reader.close()
    producer_values = {"linger": 0.005, "delivery_timeout": 30.0, "request_timeout": 10.0, "retry_backoff": 0.1,
                       "reconnect_backoff_max": 1.0, "batch_size": 1 << 16, "compression": "zstd",
                       "max_request_size": 1 << 20}
    assert set(producer_values) == set(PRODUCER)
    factory.close_producer(factory.producer(kafka, **producer_values), 0)
