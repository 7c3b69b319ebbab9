"""Session fixtures: a real Kafka-protocol broker and a real Redis.

Kafka, in this order: ``KMQ_TEST_BOOTSTRAP=host:port``; ``KMQ_TEST_BROKER=kafka`` -> Apache
Kafka from Maven Central (kmq.dev.kafka; ``KMQ_TEST_KAFKA_BROKERS``, default 1); a running
Docker engine -> testcontainers ``apache/kafka``; else the embedded tansu broker
(kmq.dev.broker). Redis: ``KMQ_TEST_REDIS_URL``; else a local
``redis-server`` on a random port; else testcontainers. In CI (``CI=true``)
a missing Redis fails instead of skipping.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import uuid

import pytest

from kmq.config import Config
from kmq.dev.broker import DevBroker
from kmq.dev.kafka import KafkaCluster
from tests.helpers.kafka import broker_kind

# kmq.testing's kmq_queue fixture (installed kmq registers it through its pytest11 entry point as well).
pytest_plugins = ["kmq.testing.pytest_plugin"]

TEST_GROUP_TIMING = {"session_timeout": "6s", "heartbeat_interval": "1s"}


@pytest.fixture(autouse=True)
def _collector_thresholds_restored():
    """A test that runs `kmq work` or `kmq tracker run` in-process tunes the garbage collector
    (kmq.config.process); the tests after it keep the interpreter's thresholds."""
    before = gc.get_threshold()
    yield
    if gc.get_threshold() != before:
        gc.set_threshold(*before)


def _docker_engine_running() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class BrokerHandle:
    """What tests know about the broker: its address and whether it is tansu."""

    def __init__(self, bootstrap: str, kind: str, dev: DevBroker | KafkaCluster | None = None) -> None:
        self.bootstrap = bootstrap
        self.kind = kind  # "tansu", "kafka", "external" or "testcontainers"
        self.dev = dev

    @property
    def is_tansu(self) -> bool:
        return self.kind == "tansu"


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    env = os.environ.get("KMQ_TEST_BOOTSTRAP")
    if env:
        yield BrokerHandle(env, "external")
        return
    if broker_kind() == "kafka":
        brokers = int(os.environ.get("KMQ_TEST_KAFKA_BROKERS", "1"))
        cluster = KafkaCluster(brokers=brokers, workdir=str(tmp_path_factory.mktemp("kafka")))
        cluster.start()
        try:
            yield BrokerHandle(cluster.bootstrap, "kafka", cluster)
            leaked = open_confluent_clients()
            assert not leaked, f"confluent-kafka clients never closed (close them where they are created): {leaked}"
        finally:
            cluster.stop()
        return
    if _docker_engine_running():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer("apache/kafka:3.9.0") as kc:
            yield BrokerHandle(kc.get_bootstrap_server(), "testcontainers")
        return
    broker = DevBroker()
    broker.start()
    try:
        yield BrokerHandle(broker.bootstrap, "tansu", broker)
        leaked = open_confluent_clients()
        # Checked while the broker still runs: a client left open polls it after it stops, and
        # librdkafka prints "Connect to ipv4#... failed: Connection refused" to the end of the run.
        assert not leaked, f"confluent-kafka clients never closed (close them where they are created): {leaked}"
    finally:
        broker.stop()


def open_confluent_clients() -> list[str]:
    """The confluent-kafka consumers and producers of this process still open (none when the
    extra is not loaded). Found by the garbage collector, so kmq keeps no registry of clients;
    unreachable ones are collected first (their handles are destroyed with them)."""
    import gc
    import sys

    ck = sys.modules.get("confluent_kafka")
    if ck is None:
        return []
    gc.collect()
    found = []
    objects = gc.get_objects()
    for obj in objects:
        kind = type(obj)  # not isinstance(): it raises on a dead weak proxy
        probe = "assignment" if issubclass(kind, ck.Consumer) else "flush" if issubclass(kind, ck.Producer) else None
        if probe is None:
            continue
        try:
            getattr(obj, probe)(*(() if probe == "assignment" else (0,)))  # raises RuntimeError once closed
        except RuntimeError:
            continue
        held_by = [f"{type(r).__name__}[{k!r}]" for r in gc.get_referrers(obj) if isinstance(r, dict) and r is not objects
                   for k, v in r.items() if v is obj]
        found.append(f"{type(obj).__name__} held by {', '.join(held_by) or 'an object'}")
    return found


@pytest.fixture(scope="session")
def bootstrap(kafka_broker) -> str:
    return kafka_broker.bootstrap


@pytest.fixture
def skip_on_tansu(kafka_broker):
    """Use as ``skip_on_tansu("gap description")`` inside a test."""

    def skip(reason: str) -> None:
        if kafka_broker.is_tansu:
            pytest.skip(f"tansu gap: {reason}")

    return skip


KAFKA_CLIENTS = ("kafka-python", "confluent")


@pytest.fixture(params=KAFKA_CLIENTS)
def kafka_client(request) -> str:
    """Each Kafka client kmq supports (``kafka.client``): a test taking this fixture
    runs once per client; pass it on as ``make_config(kafka={"client": kafka_client})``."""
    return request.param


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_config(bootstrap):
    """Build a Config for one test: random queue/group names, fast group timing."""

    def make(queue: str | dict | None = None, **sections) -> Config:
        if isinstance(queue, dict):  # make_config(queue={"lease": "2s"}): queue settings, random name
            sections["queue"], queue = dict(queue), None
        queue = queue or unique("q")
        data = {
            "kafka": {"bootstrap_servers": bootstrap, **TEST_GROUP_TIMING, **sections.pop("kafka", {})},
            "queues": [{"name": queue, **sections.pop("queue", {})}],
            "consumer": {"group_id": unique("workers"), **sections.pop("consumer", {})},
            "tracker": {"group_id": unique("tracker"), "http_port": 0, **sections.pop("tracker", {})},
        }
        data.update(sections)
        return Config.from_dict(data)

    return make


def topics_creator(make):
    """``create(partitions, **sections) -> (cfg, queue_config)``: a config from ``make``
    (make_config or the TLS tier's tls_config) with its queue's three topics created."""
    from kmq.client.topics import ensure_topics

    def create(partitions: int = 1, **sections):
        cfg = make(**sections)
        q = cfg.queues[0]
        ensure_topics(cfg.kafka, q, partitions)
        return cfg, q

    return create


@pytest.fixture
def queue_topics(make_config):
    """Create a queue with its markers and DLQ topics; returns (cfg, queue_config)."""
    return topics_creator(make_config)


# ------------------------------------------------------------------ Redis
@pytest.fixture(scope="session")
def redis_url():
    env = os.environ.get("KMQ_TEST_REDIS_URL")
    if env:
        yield env
        return
    from kmq.dev.redis_server import DevRedis

    if DevRedis.available():
        server = DevRedis().start()
        try:
            yield server.url
        finally:
            server.stop()
        return
    if _docker_engine_running():
        from testcontainers.redis import RedisContainer

        with RedisContainer() as rc:
            yield f"redis://{rc.get_container_host_ip()}:{rc.get_exposed_port(6379)}/0"
        return
    if os.environ.get("CI"):
        pytest.fail("no Redis: install redis-server (scripts/test.sh does) or set KMQ_TEST_REDIS_URL")
    pytest.skip("no Redis available: install redis-server or set KMQ_TEST_REDIS_URL")
