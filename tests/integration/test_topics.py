"""Topics on the real broker: create, idempotence, alignment errors."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kmq.cli import cli
from kmq.client import open_admin, open_log_reader
from kmq.config import Config
from kmq.core.errors import TopicMisaligned, TopicMissing
from kmq.client.topics import describe, ensure_topics, require_aligned
from tests.conftest import KAFKA_CLIENTS, unique
from tests.helpers.kafka import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(params=(*KAFKA_CLIENTS, "aiokafka"))
def kafka_client(request) -> str:
    """Every client that administers topics: aiokafka too (an AsyncKmqConsumer's topic checks)."""
    return request.param


def test_create_makes_three_aligned_topics_and_is_idempotent(bootstrap, kafka_client, monkeypatch):
    monkeypatch.setenv("KMQ_KAFKA__CLIENT", kafka_client)  # the CLI administers through kafka.client
    q = unique("orders")
    for _ in range(2):
        res = CliRunner().invoke(cli, ["topics", "create", q, "--partitions", "6", "--bootstrap", bootstrap])
        assert res.exit_code == 0, res.output
        assert "aligned: yes" in res.output
    kafka = Config.from_dict({"kafka": {"bootstrap_servers": bootstrap, "client": kafka_client}}).kafka
    layout = describe(kafka, Config().queue(q))
    assert (layout.queue_partitions, layout.markers_partitions, layout.dlq_partitions) == (6, 6, 6)
    admin = open_admin(kafka)
    try:
        assert {q, f"{q}__markers", f"{q}__dlq"} <= admin.topic_names()
        # New markers topics get the configured retention (topics.markers_retention, 7 days).
        assert admin.configs([f"{q}__markers"])[f"{q}__markers"]["retention.ms"] == str(7 * 24 * 3600 * 1000)
        assert admin.create(q, 6, 1, {}) is False  # exists: another process won the race
    finally:
        admin.close()


def test_markers_topic_with_fewer_partitions_is_a_clear_error(bootstrap, kafka_broker, kafka_client, monkeypatch):
    monkeypatch.setenv("KMQ_KAFKA__CLIENT", kafka_client)
    q = unique("orders")
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": bootstrap, "client": kafka_client}})
    admin = open_admin(cfg.kafka)
    try:
        made = {q: 4, f"{q}__markers": 2, f"{q}__dlq": 4}
        for name, partitions in made.items():
            assert admin.create(name, partitions, 1, {})
        # Kafka answers CreateTopics before every broker's metadata has the topics.
        wait_until(lambda: {n: s and s.partitions for n, s in admin.describe(made).items()} == made, 10,
                   what="the new topics in the metadata")
    finally:
        admin.close()
    res = CliRunner().invoke(cli, ["topics", "describe", q, "--bootstrap", bootstrap])
    assert res.exit_code == 1
    assert "has 2 partitions" in res.output and f"kmq topics create {q}" in res.output
    with pytest.raises(TopicMisaligned, match="grow it to 4"):
        require_aligned(cfg.kafka, cfg.queue(q))
    if kafka_broker.is_tansu:
        # tansu gap: no CreatePartitions; the error must say so and how to fix it.
        res = CliRunner().invoke(cli, ["topics", "create", q, "--bootstrap", bootstrap])
        assert res.exit_code == 1 and "CreatePartitions" in res.output
    else:
        layout = ensure_topics(cfg.kafka, cfg.queue(q))
        assert layout.markers_partitions == 4 and layout.aligned


def test_missing_topics_name_the_fix(bootstrap):
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": bootstrap}})
    q = unique("nothere")
    with pytest.raises(TopicMissing, match=f"kmq topics create {q}"):
        require_aligned(cfg.kafka, cfg.queue(q))


def test_group_offsets_on_the_aiokafka_admin(bootstrap):
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": bootstrap}})
    q, group = unique("offsets"), unique("group")
    aio = Config.from_dict({"kafka": {"bootstrap_servers": bootstrap, "client": "aiokafka"}}).kafka
    admin = open_admin(aio)
    try:
        assert admin.create(q, 2, 1, {})
        wait_until(lambda: (admin.describe([q])[q] or None) and admin.describe([q])[q].partitions == 2, 10,
                   what="the new topic in the metadata")
        reader = open_log_reader(cfg.kafka)
        try:
            reader.commit(group, {(q, 0): 7})
        finally:
            reader.close()
        assert admin.group_offsets(group, [(q, 0), (q, 1)]) == {(q, 0): 7, (q, 1): None}
        assert admin.brokers()
    finally:
        admin.close()
