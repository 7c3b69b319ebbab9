"""The TLS tier: kmq against a real TLS endpoint that requires client certificates.

One session-wide :class:`~tests.helpers.tls.TlsBroker` (tansu behind stunnel4).
Without stunnel4 the tier is skipped on a laptop and fails in CI, like Redis.
"""

from __future__ import annotations

import os

import pytest

from kmq.config import Config
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.tls import TlsBroker, stunnel_binary


@pytest.fixture(scope="session")
def tls_broker(tmp_path_factory, kafka_broker):
    if not kafka_broker.is_tansu:
        pytest.skip("the TLS tier fronts the embedded broker with stunnel; KMQ_TEST_BOOTSTRAP points elsewhere")
    if stunnel_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("no stunnel4: scripts/test.sh installs it (as root), or apt-get install stunnel4")
        pytest.skip("stunnel4 is not installed: apt-get install stunnel4 (scripts/setup-env.sh does it as root)")
    broker = TlsBroker(tmp_path_factory.mktemp("tls")).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def tls_config(tls_broker):
    """A Config for one test over mutual TLS: random queue/group names, fast group timing."""

    def make(queue: dict | None = None, kafka: dict | None = None, **sections) -> Config:
        data = {
            "kafka": {**tls_broker.kafka_settings(), **TEST_GROUP_TIMING, **(kafka or {})},
            "queues": [{"name": unique("tlsq"), **(queue or {})}],
            "consumer": {"group_id": unique("workers")},
            "tracker": {"group_id": unique("tracker"), "http_port": 0},
            **sections,
        }
        return Config.from_dict(data)

    return make


@pytest.fixture
def tls_queue(tls_config):
    """Create a queue's three topics over TLS; returns (cfg, queue_config)."""
    from kmq.topics import ensure_topics

    def create(partitions: int = 1, **kw):
        cfg = tls_config(**kw)
        q = cfg.queues[0]
        ensure_topics(cfg.kafka, q, partitions)
        return cfg, q

    return create
