"""The client seam without a broker: records of either client, delivery futures,
the kafka.client key, the missing-extra error, and the kafka-python pin."""

from __future__ import annotations

import importlib.metadata
import logging
import importlib.util
import re
import threading
from pathlib import Path

import pytest

from kmq import client as client_api
from kmq.client import Delivery, ProduceFailed, Record, coordinates, headers_of, record_of
from kmq.config import LIBRDKAFKA_DEBUG_CONTEXTS, Config, ConfigError
from kmq.core.errors import ClientNotInstalled, UnsupportedConsumer

confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")


def test_records_of_both_clients_read_the_same():
    from kafka.consumer.fetcher import ConsumerRecord

    kp = ConsumerRecord(topic="q", partition=2, leader_epoch=0, offset=7, timestamp=1234, timestamp_type=0, key=b"k",
                        value=b"v", headers=[("kmq-delivery-count", b"3")], checksum=None, serialized_key_size=1,
                        serialized_value_size=1, serialized_header_size=-1)
    cf = confluent_kafka.Message(topic="q", partition=2, offset=7, key=b"k", value=b"v",
                                 headers=[("kmq-delivery-count", b"3")], timestamp=(1, 1234))
    expected = Record("q", 2, 7, b"k", b"v", [("kmq-delivery-count", b"3")], 1234)
    assert record_of(kp) == record_of(cf) == expected
    assert coordinates(kp) == coordinates(cf) == coordinates(expected) == ("q", 2, 7)
    assert headers_of(confluent_kafka.Message(topic="q")) == []  # confluent: None for no headers


def test_delivery_runs_callbacks_added_before_and_after_it_completes():
    ok, failed = Delivery(), Delivery()
    seen = []
    ok.add_callback(lambda tag, v: seen.append((tag, v)), "early")
    ok.add_errback(lambda tag, e: seen.append(("never", e)), "x")
    ok.success("meta")
    ok.add_both(lambda tag, v: seen.append((tag, v)), "late")
    assert seen == [("early", "meta"), ("late", "meta")] and ok.get(0) == "meta" and ok.succeeded()
    failed.add_errback(lambda e: seen.append(e))
    exc = ProduceFailed("broker gone")
    failed.failure(exc)
    failed.success("ignored: settles once")
    assert seen[-1] is exc and failed.failed()
    with pytest.raises(ProduceFailed):
        failed.get(0)
    pending = Delivery()
    with pytest.raises(ProduceFailed, match="no delivery report within 0.01s"):
        pending.get(0.01)
    threading.Timer(0.05, pending.success, ("later",)).start()
    assert pending.get(5) == "later"


def test_kafka_client_key_defaults_to_kafka_python_and_takes_confluent_from_env():
    assert Config.from_dict({"queues": [{"name": "q"}]}).kafka.client == "kafka-python"
    assert Config.from_dict({"kafka": {"client": "Confluent"}, "queues": [{"name": "q"}]}).kafka.client == "confluent"
    with pytest.raises(ConfigError, match=r"kafka\.client: expected one of KAFKA-PYTHON, CONFLUENT, AIOKAFKA"):
        Config.from_dict({"kafka": {"client": "librdkafka"}, "queues": [{"name": "q"}]})
    env = {"KMQ_KAFKA__CLIENT": "confluent"}
    assert Config.from_dict({"queues": [{"name": "q"}]}, env=env).kafka.client == "confluent"


def test_choosing_confluent_without_the_extra_is_one_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "confluent_kafka" else real(name, *a))
    with pytest.raises(ClientNotInstalled) as err:
        client_api.require_client("confluent")
    assert str(err.value).count("\n") == 0 and "with its confluent extra (pip install '.[confluent]'" in str(err.value)
    client_api.require_client("kafka-python")  # the base install needs nothing more


def test_unknown_consumers_are_refused_by_name():
    with pytest.raises(UnsupportedConsumer, match="builtins.object is not a consumer kmq can drive"):
        client_api.adapt_consumer(object())
    c = confluent_kafka.Consumer({"group.id": "g", "bootstrap.servers": "127.0.0.1:1"})
    try:
        assert client_api.adapt_consumer(c).client == "confluent"
    finally:
        c.close()


def test_confluent_settings_map_the_security_keys(tmp_path):
    from kmq.client.confluent.settings import settings

    ca, cert, key, pw = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem", "pw"))
    for f in (ca, cert, key):
        f.write_text("-----BEGIN CERTIFICATE-----\n")
    pw.write_text("s3cret\n")
    cfg = Config.from_dict({"kafka": {
        "client": "confluent", "bootstrap_servers": "a:9093, b:9093", "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "kmq", "sasl_password_file": str(pw),
        "ssl_cafile": str(ca), "ssl_certfile": str(cert), "ssl_keyfile": str(key), "ssl_check_hostname": False,
    }, "queues": [{"name": "q"}]})
    conf = settings(cfg.kafka)
    assert {k: v for k, v in conf.items() if k != "logger"} == {
        "bootstrap.servers": "a:9093,b:9093", "client.id": "kmq", "security.protocol": "SASL_SSL",
        "socket.connection.setup.timeout.ms": 10000, "ssl.ca.location": str(ca),
        "ssl.certificate.location": str(cert), "ssl.key.location": str(key),
        "ssl.endpoint.identification.algorithm": "none", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "kmq", "sasl.password": "s3cret",
    }


def test_librdkafka_debug_contexts_reach_librdkafka_and_unknown_ones_are_named():
    from kmq.client.confluent.settings import settings

    assert "debug" not in settings(Config.from_dict({"kafka": {"client": "confluent"}}).kafka)
    cfg = Config.from_dict({"kafka": {"client": "confluent"}}, {"KMQ_KAFKA__LIBRDKAFKA_DEBUG": " eos,msg, "})
    assert settings(cfg.kafka)["debug"] == "eos,msg"
    # The installed librdkafka knows every context kmq accepts.
    confluent_kafka.Producer({"debug": ",".join(LIBRDKAFKA_DEBUG_CONTEXTS), "logger": logging.getLogger("t")}).flush(0)
    with pytest.raises(ConfigError, match=r"kafka.librdkafka_debug: unknown librdkafka debug context\(s\) bogus; use "):
        Config.from_dict({"kafka": {"librdkafka_debug": "eos,bogus"}})
    with pytest.raises(ConfigError, match=r"kafka.librdkafka_debug: unknown .* EOS"):  # librdkafka's are lower case
        Config.from_dict({"kafka": {"librdkafka_debug": "EOS"}})


def test_confluent_oauthbearer_uses_kmqs_token_provider(tmp_path):
    from kmq.client.confluent.settings import settings

    token = tmp_path / "token"
    token.write_text("opaque-token\n")
    cfg = Config.from_dict({"kafka": {"client": "confluent", "security_protocol": "SASL_PLAINTEXT",
                                      "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_file": str(token)},
                            "queues": [{"name": "q"}]})
    value, expires = settings(cfg.kafka)["oauth_cb"]("")
    assert value == "opaque-token" and expires > 0


def test_installed_kafka_python_satisfies_the_pin_and_still_has_the_internals_kmq_reads():
    from kmq.client.kafka_python.consumer import installed_private_attributes

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    pin = re.search(r'"kafka-python>=([\d.]+),<(\d+)"', text)
    assert pin, "pyproject pins kafka-python to one major version"
    low, major_bound = tuple(int(x) for x in pin.group(1).split(".")), int(pin.group(2))
    installed = tuple(int(x) for x in re.findall(r"\d+", importlib.metadata.version("kafka-python"))[:3])
    assert low <= installed and installed[0] < major_bound
    assert installed_private_attributes() == {name: True for name in installed_private_attributes()}
    assert installed_private_attributes()  # not vacuous


@pytest.mark.parametrize("member", ["kmq.consumer.consumer", "tracker.service"])
def test_the_group_members_import_no_kafka_client_and_both_adapters_serve_them(member):
    import ast
    import importlib

    from kmq.client import GroupConsumerAdapter
    from kmq.client.confluent.consumer import ConfluentConsumer
    from kmq.client.kafka_python.consumer import KafkaPythonConsumer

    src = Path(importlib.import_module(member).__file__).read_text()
    modules = {a.name for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in modules if m.split(".")[0] in ("kafka", "confluent_kafka")}, modules
    needed = [name for name in vars(GroupConsumerAdapter) if not name.startswith("_") and callable(
        getattr(GroupConsumerAdapter, name))]
    for adapter in (KafkaPythonConsumer, ConfluentConsumer):
        assert all(callable(getattr(adapter, name, None)) for name in needed), adapter


def test_client_errors_of_either_client_become_kmq_errors():
    from kafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

    from kmq.core.errors import AuthorizationFailed, BrokerUnavailable

    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "queues": [{"name": "q"}]})
    assert isinstance(client_api.client_error(cfg.kafka, KafkaConnectionError(), "consuming q"), BrokerUnavailable)
    assert isinstance(client_api.client_error(cfg.kafka, TopicAuthorizationFailedError(), "x"), AuthorizationFailed)
    rd = confluent_kafka.KafkaException(confluent_kafka.KafkaError(confluent_kafka.KafkaError._ALL_BROKERS_DOWN))
    assert isinstance(client_api.client_error(cfg.kafka, rd, "consuming q"), BrokerUnavailable)
    assert client_api.client_error(cfg.kafka, ZeroDivisionError(), "x") is None  # a bug stays a bug


class _Librdkafka:
    """The calls the confluent adapter's position() makes, answered as librdkafka answers them."""

    def __init__(self, consumed: int = -1001, committed: int = -1001, cached_low: int = -1, log_start: int = 0) -> None:
        self.consumed, self.committed_at, self.cached_low, self.log_start = consumed, committed, cached_low, log_start

    def position(self, tps):
        return [confluent_kafka.TopicPartition(tp.topic, tp.partition, self.consumed) for tp in tps]

    def committed(self, tps, timeout=None):
        return [confluent_kafka.TopicPartition(tp.topic, tp.partition, self.committed_at) for tp in tps]

    def seek(self, tp):
        self.consumed = -1001  # librdkafka forgets the position until a record is consumed again

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        if cached:
            return (self.cached_low, -1 if self.cached_low < 0 else self.cached_low + 10)
        return (self.log_start, 99)


@pytest.mark.parametrize("raw, seek, expected", [
    (_Librdkafka(consumed=12), None, 12),  # a record was consumed: librdkafka knows
    (_Librdkafka(consumed=12), 4, 4),  # a seek makes librdkafka forget; the adapter remembers the target
    (_Librdkafka(committed=7), None, 7),  # nothing consumed or sought: the fetch starts at the commit
    (_Librdkafka(committed=7, cached_low=20), None, 20),  # below the log start: the broker resets to it
    (_Librdkafka(committed=70, cached_low=20), None, 70),  # past the end: left to the caller (tansu never resets)
    (_Librdkafka(log_start=3), None, 3),  # no commit, nothing fetched yet: the broker's log start
    (_Librdkafka(committed=7, log_start=3), "beginning", 3),
])
def test_confluent_position_is_where_the_next_fetch_starts(raw, seek, expected):
    from kmq.client.confluent.consumer import ConfluentConsumer

    c = ConfluentConsumer(raw)
    if seek == "beginning":
        c.seek_to_beginning([("m", 0)])
    elif seek is not None:
        c.seek("m", 0, seek)
    assert c.position("m", 0) == expected


def test_the_trackers_group_consumer_settings_reach_either_client(monkeypatch):
    import kmq.client.confluent.consumer as confluent_adapter
    from kmq.client.kafka_python import clients

    seen: dict = {}

    class Stub:
        def __init__(self, *args, **kwargs) -> None:
            seen.update(args[0] if args and isinstance(args[0], dict) else kwargs)

    monkeypatch.setattr(confluent_adapter.ck, "Consumer", Stub)
    monkeypatch.setattr(clients, "KafkaConsumer", Stub)
    overrides = {"group_instance_id": "tracker-0", "fetch_wait": 0.05, "metadata_max_age": 30.0,
                 "max_poll_interval": 300.0}  # kmq's names, in seconds
    for client, expected in [
        ("confluent", {"group.id": "g", "group.instance.id": "tracker-0", "fetch.wait.max.ms": 50,
                       "topic.metadata.refresh.interval.ms": 30_000, "max.poll.interval.ms": 300_000, "enable.auto.commit": False,
                       "partition.assignment.strategy": "range,roundrobin", "session.timeout.ms": 6000}),
        ("kafka-python", {"group_id": "g", "group_instance_id": "tracker-0", "fetch_max_wait_ms": 50,
                          "metadata_max_age_ms": 30_000, "max_poll_interval_ms": 300_000,
                          "enable_auto_commit": False, "max_poll_records": 10,
                          "session_timeout_ms": 6000}),
    ]:
        seen.clear()
        cfg = Config.from_dict({"kafka": {"client": client, "bootstrap_servers": "127.0.0.1:1", "session_timeout": "6s"},
                                "queues": [{"name": "q"}]})
        adapter = client_api.group_consumer(cfg.kafka, "g", "RANGE", 10, **overrides)
        assert adapter.client == client
        assert {k: seen.get(k) for k in expected} == expected, client


def test_the_seams_broker_errors_map_kafka_python_failures_it_imports_only_when_they_happen():
    from kafka.errors import GroupAuthorizationFailedError, KafkaError

    from kmq.client.factory import broker_errors
    from kmq.config import Config
    from kmq.core.errors import AuthorizationFailed, BrokerUnavailable

    kafka = Config.from_dict({"kafka": {"bootstrap_servers": "k:9092"}}).kafka
    with pytest.raises(AuthorizationFailed, match="a group operation"), broker_errors(kafka):
        raise GroupAuthorizationFailedError("kmq-tracker")
    with pytest.raises(BrokerUnavailable, match="reading the log failed: KafkaError"), broker_errors(kafka, "reading the log"):
        raise KafkaError("odd")
    with pytest.raises(ZeroDivisionError), broker_errors(kafka):  # no client's: a bug, unchanged
        raise ZeroDivisionError()
