"""Configuration: defaults, durations, validation errors naming the key path, env overrides."""

from __future__ import annotations

import pytest

from kmq.client.secrets import sasl_password
from kmq.client.kafka_python.settings import client_kwargs
from kmq.config import Config, parse_duration
from kmq.core.errors import ConfigError


def test_defaults_match_the_design():
    cfg = Config.from_dict({"queues": [{"name": "orders"}]})
    q = cfg.queue("orders")
    assert (q.markers_topic, q.dlq_topic, q.lease, q.max_deliveries) == ("orders__markers", "orders__dlq", 30.0, 5)
    assert (q.backoff.initial, q.backoff.max, q.backoff.multiplier) == (1.0, 60.0, 2.0)
    assert cfg.consumer.max_in_flight_per_partition == 10_000 and cfg.consumer.ack_flush_interval == 0.1
    assert cfg.consumer.max_lease == 600.0 and cfg.consumer.auto_renew is True  # on by default, bounded by max_lease
    assert (cfg.tracker.group_id, cfg.tracker.tick, cfg.tracker.http_port) == ("kmq-tracker", 0.05, 9108)
    assert cfg.kafka.bootstrap_servers == "localhost:9092" and cfg.redis.url is None


@pytest.mark.parametrize("text,seconds", [("250ms", 0.25), ("30s", 30), ("5m", 300), ("1h", 3600), (2, 2.0), ("1.5s", 1.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_design_example_yaml_loads(tmp_path):
    path = tmp_path / "kmq.yaml"
    path.write_text(
        """
kafka: {bootstrap_servers: "localhost:9092", security_protocol: PLAINTEXT,
        sasl_mechanism: null, sasl_username: null, sasl_password: null,
        ssl_cafile: null, client_id: kmq}
queues:
  - name: orders
    markers_topic: orders__markers
    dlq_topic: orders__dlq
    lease: 30s
    max_deliveries: 5
    backoff: {initial: 1s, max: 60s, multiplier: 2.0}
consumer: {group_id: orders-workers, max_in_flight_per_partition: 2000,
           ack_flush_interval: 100ms, auto_renew: false, max_lease: 10m}
tracker: {group_id: kmq-tracker, tick: 50ms, http_port: 9108}
redis: {url: null}
"""
    )
    cfg = Config.load(path, env={})
    assert cfg.consumer.group_id == "orders-workers" and cfg.consumer.max_lease == 600
    assert cfg.queues[0].backoff.delay(1) == 1 and cfg.queues[0].backoff.delay(3) == 4 and cfg.queues[0].backoff.delay(20) == 60


@pytest.mark.parametrize(
    "data,message",
    [
        ({"queues": [{"name": "q", "lease": "soon"}]}, "queues[0].lease: expected a duration like 30s, got 'soon'"),
        ({"queues": [{"name": "q", "max_deliveries": 0}]}, "queues[0].max_deliveries: expected at least 1"),
        ({"queues": [{"name": "q", "max_deliveries": "five"}]}, "queues[0].max_deliveries: expected an integer"),
        ({"queues": [{"name": "q", "backoff": {"multiplier": 0.5}}]}, "queues[0].backoff.multiplier: expected at least 1.0"),
        ({"queues": [{"name": "q", "backoff": {"initial": "10s", "max": "1s"}}]}, "queues[0].backoff.max: must be at least"),
        ({"queues": [{"name": "q", "colour": "red"}]}, "queues[0].colour: unknown key"),
        ({"queues": [{"lease": "1s"}]}, "queues[0].name: missing"),
        ({"queues": [{"name": "bad name!"}]}, "queues[0].name: expected a Kafka topic name"),
        ({"queues": [{"name": "q"}, {"name": "q"}]}, "queues[1].name: queue 'q' is configured twice"),
        ({"queues": [{"name": "q", "markers_topic": "q"}]}, "queues[0]: queue, markers_topic and dlq_topic must be three"),
        ({"queues": "orders"}, "queues: expected a list"),
        ({"kafak": {}}, "kafak: unknown key"),
        ({"kafka": {"bootstrap": "x"}}, "kafka.bootstrap: unknown key"),
        ({"kafka": {"security_protocol": "TLS"}}, "kafka.security_protocol: expected one of"),
        ({"kafka": {"security_protocol": "SASL_SSL"}}, "kafka.sasl_mechanism: required"),
        ({"kafka": {"sasl_mechanism": "PLAIN"}}, "kafka.sasl_mechanism: is set but"),
        ({"consumer": {"auto_renew": "yes"}}, "consumer.auto_renew: expected true or false"),
        ({"consumer": {"ack_flush_interval": -1}}, "consumer.ack_flush_interval: expected a non-negative duration"),
        ({"tracker": {"http_port": 70000}}, "tracker.http_port: expected at most 65535"),
        ({"tracker": {"tick": "0ms"}}, "tracker.tick: expected at least 1ms"),
        ({"tracker": {"fetch_wait": "1m"}}, "tracker.fetch_wait: expected at most 10s"),
        ({"tracker": {"outage_grace": "2h"}}, "tracker.outage_grace: expected at most 1h"),
        ({"tracker": "fast"}, "tracker: expected a mapping"),
    ],
)
def test_validation_errors_name_the_key_path(data, message):
    with pytest.raises(ConfigError) as info:
        Config.from_dict(data)
    assert str(info.value).startswith(message), str(info.value)


def test_env_overrides_take_precedence_over_the_file(tmp_path):
    path = tmp_path / "kmq.yaml"
    path.write_text("kafka: {bootstrap_servers: 'file:9092'}\nqueues: [{name: orders, lease: 30s}]\nconsumer: {auto_renew: false}\n")
    env = {
        "KMQ_KAFKA__BOOTSTRAP_SERVERS": "env:9092",
        "KMQ_QUEUES__0__LEASE": "5s",
        "KMQ_QUEUES__0__BACKOFF__MAX": "2m",
        "KMQ_CONSUMER__AUTO_RENEW": "true",
        "KMQ_TRACKER__HTTP_PORT": "9200",
        "KMQ_TEST_BOOTSTRAP": "ignored:1",  # not a config key: the test suite's own variable
        "OTHER": "x",
    }
    cfg = Config.load(path, env=env)
    assert cfg.kafka.bootstrap_servers == "env:9092"
    assert cfg.queues[0].lease == 5.0 and cfg.queues[0].backoff.max == 120.0
    assert cfg.consumer.auto_renew is True and cfg.tracker.http_port == 9200
    # without env the file wins over defaults
    assert Config.load(path, env={}).kafka.bootstrap_servers == "file:9092"


def test_env_can_add_a_queue_and_bad_env_values_name_the_path():
    cfg = Config.from_dict({}, env={"KMQ_QUEUES__0__NAME": "jobs"})
    assert cfg.queues[0].name == "jobs" and cfg.queues[0].markers_topic == "jobs__markers"
    with pytest.raises(ConfigError, match=r"queues\[0\].lease: expected a duration"):
        Config.from_dict({"queues": [{"name": "q"}]}, env={"KMQ_QUEUES__0__LEASE": "later"})
    with pytest.raises(ConfigError, match="unknown key"):
        Config.from_dict({}, env={"KMQ_KAFKA__BOOTSTRAPSERVERS": "x:1"})


def test_secrets_only_from_env_or_file_and_never_shown(tmp_path):
    path = tmp_path / "kmq.yaml"
    path.write_text("kafka: {security_protocol: SASL_SSL, sasl_mechanism: PLAIN, sasl_username: u, sasl_password: hunter2}\n")
    with pytest.raises(ConfigError) as info:
        Config.load(path, env={})
    assert "hunter2" not in str(info.value) and "KMQ_KAFKA__SASL_PASSWORD" in str(info.value)

    path.write_text("kafka: {security_protocol: SASL_SSL, sasl_mechanism: PLAIN, sasl_username: u}\n")
    cfg = Config.load(path, env={"KMQ_KAFKA__SASL_PASSWORD": "12345"})
    assert sasl_password(cfg.kafka) == "12345"  # kept verbatim as a string
    assert "12345" not in repr(cfg) and "12345" not in str(cfg.to_dict())
    assert client_kwargs(cfg.kafka)["sasl_plain_password"] == "12345"

    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    cfg = Config.from_dict({"kafka": {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_password_file": str(secret)}})
    assert sasl_password(cfg.kafka) == "from-file"


def test_bad_yaml_and_missing_file_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        Config.load(tmp_path / "nope.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        Config.load(bad, env={})


def test_unconfigured_queue_gets_defaults_and_bad_names_fail():
    cfg = Config()
    assert cfg.queue("jobs").dlq_topic == "jobs__dlq"
    with pytest.raises(ConfigError):
        cfg.queue("no spaces")


@pytest.mark.parametrize("data, path", [
    ({"queues": [{"name": "q", "lease": "100h"}]}, "queues[0].lease"),
    ({"queues": [{"name": "q", "lease": "1h", "markers_retention": "2h", "backoff": {"max": "1m"}}]}, "queues[0].lease"),
    ({"queues": [{"name": "q", "max_deliveries": 10**9}]}, "queues[0].max_deliveries"),
    ({"queues": [{"name": "q", "backoff": {"multiplier": 1e9}}]}, "queues[0].backoff.multiplier"),
    ({"queues": [{"name": "q", "markers_retention": "10m"}]}, "queues[0].markers_retention"),
    ({"consumer": {"max_lease": "200h"}}, "consumer.max_lease"),
    ({"consumer": {"handoff_lease": "200h"}}, "consumer.handoff_lease"),
    ({"tracker": {"max_request_size": 10}}, "tracker.max_request_size"),
])
def test_bounds_that_keep_open_starts_inside_the_markers_retention(data, path):
    with pytest.raises(ConfigError) as err:
        Config.from_dict(data)
    assert err.value.path == path


def test_backoff_never_overflows_and_retention_default_matches_topics_create():
    from kmq.config import MARKERS_RETENTION_S, BackoffConfig
    from kmq.client.topics import MARKERS_RETENTION_MS

    assert BackoffConfig(multiplier=100.0).delay(10**9) == 60.0
    assert MARKERS_RETENTION_S * 1000 == MARKERS_RETENTION_MS
    q = Config.from_dict({"queues": [{"name": "q"}]}).queues[0]
    assert q.max_hold == MARKERS_RETENTION_S / 2 and Config.from_dict({}).tracker.max_request_size == 1_048_576


def test_consumer_ordering_is_none_by_default_key_on_request_and_anything_else_is_named():
    assert Config.from_dict({}).consumer.ordering == "none"
    assert Config.from_dict({"consumer": {"ordering": "KEY"}}).consumer.ordering == "key"
    with pytest.raises(ConfigError, match=r"consumer\.ordering"):
        Config.from_dict({"consumer": {"ordering": "partition"}})


@pytest.mark.parametrize("tracker, wait_ms", [
    ({}, 50),  # the tick (50ms)
    ({"tick": "1ms"}, 10), ({"tick": "2s"}, 500),  # the tick, kept within 10-500 ms
    ({"fetch_wait": "500ms"}, 500), ({"tick": "1s", "fetch_wait": "2s"}, 2000), ({"fetch_wait": "1ms"}, 1),
])
def test_the_markers_fetch_wait_is_the_tick_unless_set(tracker, wait_ms):
    assert Config.from_dict({"tracker": tracker}).tracker.markers_fetch_wait_ms() == wait_ms
