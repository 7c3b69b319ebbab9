"""The TLS tier: kmq against a real TLS endpoint that requires client certificates.

One session-wide broker with a TLS listener that requires client certificates: on Apache Kafka
(``KMQ_TEST_BROKER=kafka``) the broker's own TLS listener, with a SASL/SCRAM listener beside it
(:class:`~tests.helpers.tls.KafkaTlsBroker`); on tansu, tansu behind stunnel4
(:class:`~tests.helpers.tls.TlsBroker`). Without stunnel4 the tansu tier is skipped on a laptop
and fails in CI, like Redis.
"""

from __future__ import annotations

import os

import pytest

from kmq.config import Config
from tests.conftest import topics_creator
from tests.helpers.tls import KafkaTlsBroker, TlsBroker, stunnel_binary


@pytest.fixture(scope="session")
def tls_broker(tmp_path_factory, kafka_broker):
    if kafka_broker.kind == "kafka":
        kafka = KafkaTlsBroker(tmp_path_factory.mktemp("tls")).start()
        try:
            yield kafka
        finally:
            kafka.stop()
        return
    if not kafka_broker.is_tansu:
        pytest.skip("the TLS tier starts its own broker (Apache Kafka, or tansu behind stunnel); "
                    "KMQ_TEST_BOOTSTRAP points elsewhere")
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
