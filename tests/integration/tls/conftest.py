"""The TLS tier: kmq against a real TLS endpoint that requires client certificates.

One session-wide :class:`~tests.helpers.tls.TlsBroker` (tansu behind stunnel4).
Without stunnel4 the tier is skipped on a laptop and fails in CI, like Redis.
"""

from __future__ import annotations

import os

import pytest

from kmq.config import Config
from tests.conftest import topics_creator
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
def tls_config(tls_broker, make_config):
    """A Config for one test over mutual TLS: make_config's random names and group timing."""

    def make(queue: dict | None = None, kafka: dict | None = None, **sections) -> Config:
        return make_config(queue=queue, kafka={**tls_broker.kafka_settings(), **(kafka or {})}, **sections)

    return make


@pytest.fixture
def tls_queue(tls_config):
    """Create a queue's three topics over TLS; returns (cfg, queue_config)."""
    return topics_creator(tls_config)
