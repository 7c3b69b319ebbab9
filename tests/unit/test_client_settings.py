"""kafka.kafka_python and kafka.confluent: each client's own settings passed through to every client
kmq builds, except what kmq sets itself (refused, naming what kmq sets instead), checked against
what the client knows (kafka-python's DEFAULT_CONFIG; librdkafka at construction)."""

from __future__ import annotations

import logging

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from kmq.client.confluent.log_bridge import LibrdkafkaLogBridge
from kmq.client.kafka_python.settings import passthrough
from kmq.config import Config, ConfigError


def _kafka(**kafka):
    return Config.from_dict({"kafka": kafka}).kafka


@pytest.mark.parametrize("key, instead", [
    ("enable_auto_commit", "kmq commits offsets itself"),
    ("isolation_level", "isolation level"),
    ("acks", "all"),
    ("enable_idempotence", "on"),
    ("partition_assignment_strategy", "consumer.assignor"),
    ("value_deserializer", "raw bytes"),
    ("key_serializer", "raw bytes"),
    ("auto_offset_reset", "earliest"),
    ("client_id", "kafka.client_id"),
    ("session_timeout_ms", "kafka.session_timeout"),
    ("ssl_cafile", "kafka.ssl_cafile"),
])
def test_kafka_python_keys_kmq_relies_on_are_refused_naming_what_kmq_sets(key, instead):
    with pytest.raises(ConfigError) as err:
        _kafka(kafka_python={key: "x"})
    assert err.value.path == f"kafka.kafka_python.{key}"
    assert "cannot be overridden" in str(err.value) and instead in str(err.value)


@pytest.mark.parametrize("key, instead", [
    ("enable.auto.commit", "kmq commits offsets itself"),
    ("isolation.level", "isolation level"),
    ("acks", "all"),
    ("enable.idempotence", "on"),
    ("group.protocol", "classic group protocol"),
    ("partition.assignment.strategy", "consumer.assignor"),
    ("delivery.report.only.error", "settle on flush"),
    ("bootstrap.servers", "kafka.bootstrap_servers"),
    ("debug", "kafka.librdkafka_debug"),
    ("error_cb", "Python object"),
])
def test_confluent_keys_kmq_relies_on_are_refused_naming_what_kmq_sets(key, instead):
    with pytest.raises(ConfigError) as err:
        _kafka(confluent={key: "x"})
    assert err.value.path == f"kafka.confluent.{key}"
    assert "cannot be overridden" in str(err.value) and instead in str(err.value)


def test_tuning_settings_of_each_client_are_accepted_and_kept():
    kafka = _kafka(kafka_python={"client_rack": "use1-az1", "fetch_max_bytes": 1 << 20, "linger_ms": 20},
                   confluent={"client.rack": "use1-az1", "fetch.min.bytes": 1, "socket.keepalive.enable": True})
    assert kafka.kafka_python == {"client_rack": "use1-az1", "fetch_max_bytes": 1 << 20, "linger_ms": 20}
    assert kafka.confluent == {"client.rack": "use1-az1", "fetch.min.bytes": 1, "socket.keepalive.enable": True}


def test_a_dotted_name_under_kafka_python_is_pointed_to_kafka_confluent():
    with pytest.raises(ConfigError, match="librdkafka's dotted properties go under kafka.confluent"):
        _kafka(kafka_python={"client.rack": "a"})


def test_a_null_value_leaves_the_clients_default():
    assert _kafka(confluent={"client.rack": None}).confluent == {}


@pytest.mark.parametrize("value", [{"a": 1}, [1]])
def test_only_scalar_values_pass(value):
    with pytest.raises(ConfigError, match="expected a string, number or true/false"):
        _kafka(confluent={"client.rack": value})


def test_kafka_python_gives_each_client_the_keys_it_takes_and_refuses_names_none_takes():
    kafka = _kafka(kafka_python={"client_rack": "r", "linger_ms": 20, "connections_max_idle_ms": 60_000})
    assert passthrough(kafka, KafkaConsumer) == {"client_rack": "r", "connections_max_idle_ms": 60_000}
    assert passthrough(kafka, KafkaProducer) == {"linger_ms": 20, "connections_max_idle_ms": 60_000}
    assert passthrough(kafka, KafkaAdminClient) == {"connections_max_idle_ms": 60_000}
    with pytest.raises(ConfigError) as err:
        passthrough(_kafka(kafka_python={"fetch_wait_max": 5}), KafkaConsumer)
    assert err.value.path == "kafka.kafka_python.fetch_wait_max" and "no such setting" in str(err.value)
    with pytest.raises(ConfigError, match="Python object"):
        passthrough(_kafka(kafka_python={"partitioner": "murmur2"}), KafkaProducer)


def test_librdkafka_refusing_a_property_is_kmqs_error_naming_the_key():
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
    from kmq.client.confluent.consumer import consumer, producer

    for key, value, said in (("fetch.wait.maximum.ms", 5, "no such property"),
                             ("fetch.min.bytes", "lots", "refused the value 'lots'")):
        kafka = _kafka(client="confluent", confluent={key: value})
        for build in (consumer, producer):
            with pytest.raises(ConfigError) as err:
                build(kafka)
            assert err.value.path == f"kafka.confluent.{key}" and said in str(err.value)


def test_confluent_settings_reach_librdkafka(caplog):
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
    from kmq.client.confluent.consumer import consumer

    # librdkafka's "conf" debug context lists the configuration a handle was built with.
    kafka = _kafka(client="confluent", librdkafka_debug="conf", confluent={"client.rack": "rack-a"})
    with caplog.at_level(logging.DEBUG, logger="kmq.librdkafka"):
        consumer(kafka).close()
    assert any("client.rack = rack-a" in r.getMessage() for r in caplog.records)


def test_environment_reaches_both_sections_with_underscores_as_dots_for_librdkafka():
    cfg = Config.from_dict({}, env={"KMQ_KAFKA__CONFLUENT__CLIENT_RACK": "use1-az1",
                                    "KMQ_KAFKA__CONFLUENT__FETCH_MIN_BYTES": "1024",
                                    "KMQ_KAFKA__KAFKA_PYTHON__CLIENT_RACK": "use1-az2",
                                    "KMQ_KAFKA__KAFKA_PYTHON__FETCH_MAX_BYTES": "1048576"})
    assert cfg.kafka.confluent == {"client.rack": "use1-az1", "fetch.min.bytes": 1024}
    assert cfg.kafka.kafka_python == {"client_rack": "use1-az2", "fetch_max_bytes": 1048576}
    with pytest.raises(ConfigError) as err:
        Config.from_dict({}, env={"KMQ_KAFKA__CONFLUENT__ENABLE_AUTO_COMMIT": "true"})
    assert err.value.path == "kafka.confluent.enable.auto.commit"


def test_secret_settings_come_from_the_environment_only_and_are_never_shown(tmp_path):
    path = tmp_path / "kmq.yaml"
    path.write_text("kafka:\n  confluent:\n    sasl.oauthbearer.client.secret: s3cret\n")
    with pytest.raises(ConfigError) as err:
        Config.load(path, env={})
    assert "KMQ_KAFKA__CONFLUENT__SASL_OAUTHBEARER_CLIENT_SECRET" in str(err.value) and "s3cret" not in str(err.value)
    path.write_text("kafka:\n  confluent:\n    sasl.oauthbearer.client.id: kmq\n")
    cfg = Config.load(path, env={"KMQ_KAFKA__CONFLUENT__SASL_OAUTHBEARER_CLIENT_SECRET": "0123"})
    assert cfg.kafka.confluent["sasl.oauthbearer.client.secret"] == "0123"  # verbatim, not the number 123
    assert "0123" not in repr(cfg) and "0123" not in str(cfg.to_dict())


def test_librdkafka_oidc_login_needs_no_token_source_and_gets_no_token_callback():
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
    from kmq.client.confluent.settings import settings

    oidc = {"sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "kmq",
            "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token"}
    kafka = _kafka(client="confluent", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", confluent=oidc)
    assert "oauth_cb" not in settings(kafka)
    with pytest.raises(ConfigError, match="kafka.client: confluent"):
        _kafka(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", confluent=oidc)
    with pytest.raises(ConfigError, match="needs a token"):
        _kafka(client="confluent", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER")


def test_a_consumer_property_on_a_producer_is_logged_at_debug_only(caplog):
    bridge = LibrdkafkaLogBridge()
    with caplog.at_level(logging.DEBUG, logger="kmq.librdkafka"):
        bridge.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "kmq#producer-1",
                   "[thrd:app]: Configuration property fetch.min.bytes is a consumer property and will be "
                   "ignored by this producer instance")
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
