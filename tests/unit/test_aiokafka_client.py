"""``kafka.client: aiokafka``: only kmq.aio's consumer runs on it; its settings from kmq's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kmq.client import factory
from kmq.client.aiokafka.settings import consumer_settings, producer_settings
from kmq.config import Config
from kmq.core.errors import ConfigError


def config(**kafka) -> Config:
    return Config.from_dict({"kafka": {"bootstrap_servers": "a:9092,b:9092", "client": "aiokafka", **kafka},
                             "queues": [{"name": "orders"}]})


def test_the_config_takes_aiokafka():
    assert config().kafka.client == "aiokafka"


@pytest.mark.parametrize("build", [lambda k: factory.producer(k),
                                   lambda k: factory.group_consumer(k, "g", "RANGE", 10)])
def test_any_other_component_on_aiokafka_is_told_the_fix(build):
    # The tracker, the threaded KmqConsumer, the CLI tools build their clients here.
    with pytest.raises(ConfigError) as err:
        build(config().kafka)
    assert err.value.path == "kafka.client"
    assert "AsyncKmqConsumer" in str(err.value) and "kafka-python or confluent" in str(err.value)


def test_producer_settings_are_kmqs_names_for_aiokafka():
    kw = producer_settings(config().kafka, 3.0, {"linger": 0.005, "delivery_timeout": 3.0, "retry_backoff": 0.1,
                                                 "reconnect_backoff_max": 1.0, "compression": "none",
                                                 "batch_size": 1000})
    assert kw["bootstrap_servers"] == ["a:9092", "b:9092"] and kw["acks"] == "all"
    assert kw["linger_ms"] == 5 and kw["retry_backoff_ms"] == 100 and kw["request_timeout_ms"] == 3000
    assert kw["compression_type"] is None and kw["max_batch_size"] == 1000
    assert "delivery_timeout_ms" not in kw and "reconnect_backoff_max_ms" not in kw  # no aiokafka counterpart


def test_consumer_settings_keep_kmqs_group_timing():
    kw = consumer_settings(config(session_timeout="6s", heartbeat_interval="500ms").kafka, "workers", 4000,
                           {"metadata_max_age": 30.0, "fetch_wait": 0.1})
    assert kw["group_id"] == "workers" and kw["enable_auto_commit"] is False and kw["max_poll_records"] == 4000
    assert kw["session_timeout_ms"] == 6000 and kw["heartbeat_interval_ms"] == 500
    assert kw["fetch_max_wait_ms"] == 100 and kw["auto_offset_reset"] == "earliest"


def test_a_sasl_mechanism_aiokafka_lacks_is_a_config_error():
    cfg = config(security_protocol="SASL_PLAINTEXT", sasl_mechanism="AWS_MSK_IAM")
    with pytest.raises(ConfigError, match="kafka.client: confluent"):
        producer_settings(cfg.kafka, None, {})


def test_an_async_consumers_clients_and_topic_checks_never_import_kafka_python():
    # kafka-python's modules are some 17,000 objects every full collection visits: the topic checks
    # of a consumer on aiokafka run on aiokafka's admin client. No broker listens at the port, so
    # the check ends in kmq's error after the admin client was built and tried.
    code = textwrap.dedent("""
        import asyncio, socket, sys
        from kmq.client.loop import loop_clients
        from kmq.config import Config
        from kmq.core.errors import BrokerUnavailable
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = Config.from_dict({"kafka": {"bootstrap_servers": f"127.0.0.1:{port}", "client": "aiokafka",
                                          "connect_timeout": "2s"}, "queues": [{"name": "orders"}]})
        loop = asyncio.new_event_loop()
        cfg, clients = loop_clients(cfg, loop)
        try:
            clients.require_aligned(cfg.kafka, cfg.queue("orders"))
            raise SystemExit("no error from a broker that is not there")
        except BrokerUnavailable as exc:
            print(type(exc).__name__, exc)
        assert "kafka" not in sys.modules, "kafka-python imported"
        assert "kmq.client.aiokafka.admin" in sys.modules, "the aiokafka admin was not used"
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
