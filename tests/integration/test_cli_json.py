"""``--output json`` of ``kmq status``, ``kmq dlq list`` and ``kmq topics describe``, parsed
as a script would; and ``kmq topics create`` applying the ``topics:`` settings."""

from __future__ import annotations

import base64
import json
import time

import pytest
from click.testing import CliRunner
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from kmq.cli import cli
from kmq.core.markers import End, Start
from tests.conftest import unique
from tests.helpers.kafka import APP_RECORD, produce
from tests.integration.tracker_util import MarkerProducer

pytestmark = pytest.mark.integration


def run_json(*args: str) -> dict:
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)  # stdout only: logs and notes go to stderr


def test_status_json_has_the_table_figures(bootstrap, queue_topics):
    cfg, q = queue_topics(2, queue={"lease": "60s"})
    produce(bootstrap, q.name, 10, partition=0, **APP_RECORD)
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=cfg.consumer.group_id, enable_auto_commit=False)
    c.commit({TopicPartition(q.name, 0): OffsetAndMetadata(4, "", -1)})
    c.close()
    markers = MarkerProducer(bootstrap, q.markers_topic)
    markers.send(0, Start([(0, 4)], lease_ms=60_000, owner="w"), ts_ms=int(time.time() * 1000) - 5_000)
    markers.send(0, End([(0, 1)]))
    markers.close()
    doc = run_json("status", q.name, "--bootstrap", bootstrap, "--workers-group", cfg.consumer.group_id,
                   "--tracker-group", cfg.tracker.group_id, "--output", "json")
    assert doc["queue"] == q.name and doc["workers_group"] == cfg.consumer.group_id
    p0, p1 = doc["partitions"]
    assert (p0["partition"], p0["in_flight"], p0["queue_lag"], p0["marker_lag"], p0["dlq_size"]) == (0, 3, 6, 2, 0)
    assert 5.0 <= p0["oldest_age_seconds"] < 60
    assert (p1["in_flight"], p1["oldest_age_seconds"], p1["queue_lag"]) == (0, 0.0, 0)
    assert doc["total"]["in_flight"] == 3 and doc["total"]["queue_lag"] == 6


def test_dlq_list_json_keeps_text_and_binary_apart(bootstrap, queue_topics):
    cfg, q = queue_topics(1)
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    p.send(q.dlq_topic, key=b"k1", value=b"plain text",
           headers=[("kmq-dlq-reason", b"rejected"), ("kmq-dlq-error", b"bad payload")]).get(10)
    p.send(q.dlq_topic, key=None, value=b"\xff\xfe\x00binary", headers=[("kmq-dlq-reason", b"timeout")]).get(10)
    p.close()
    doc = run_json("dlq", "list", q.name, "--bootstrap", bootstrap, "-o", "json")
    assert doc["queue"] == q.name and doc["count"] == 2
    first, second = doc["dead_letters"]
    assert (first["key"], first["value"], first["reason"], first["offset"]) == ("k1", "plain text", "rejected", 0)
    assert {"name": "kmq-dlq-error", "value": "bad payload"} in first["headers"]
    assert second["key"] is None and second["value"] is None
    assert base64.b64decode(second["value_base64"]) == b"\xff\xfe\x00binary"
    assert second["timestamp"].endswith("+00:00") and isinstance(second["timestamp_ms"], int)
    only = run_json("dlq", "list", q.name, "--bootstrap", bootstrap, "-o", "json", "--reason", "timeout")
    assert [d["offset"] for d in only["dead_letters"]] == [1]


def test_topics_describe_json_and_create_with_topic_settings(bootstrap, tmp_path):
    q = unique("q")
    config = tmp_path / "kmq.yaml"
    config.write_text(f"kafka: {{bootstrap_servers: '{bootstrap}'}}\n"
                      "topics: {min_insync_replicas: 1, markers_retention: 3d, dlq_retention: 30d}\n")
    res = CliRunner().invoke(cli, ["-v", "topics", "create", q, "--partitions", "3", "--config", str(config)])
    assert res.exit_code == 0, res.output
    # One broker here: the default replication factor falls back to the broker count. The broker
    # got the configs (tansu does not return topic configs to describe_configs: read the log line).
    assert f"created topic {q}__markers with 3 partitions, replication factor 1, min.insync.replicas=1, " \
           f"retention.ms={3 * 86400_000}" in res.stderr
    assert f"created topic {q}__dlq with 3 partitions, replication factor 1, min.insync.replicas=1, " \
           f"retention.ms={30 * 86400_000}" in res.stderr
    doc = run_json("topics", "describe", q, "--config", str(config), "--output", "json")
    assert doc == {
        "queue": q,
        "topics": [{"role": "queue", "name": q, "partitions": 3},
                   {"role": "markers", "name": f"{q}__markers", "partitions": 3},
                   {"role": "dlq", "name": f"{q}__dlq", "partitions": 3}],
        "aligned": True, "problems": [],
    }
    missing = CliRunner().invoke(cli, ["topics", "describe", unique("nope"), "--bootstrap", bootstrap, "-o", "json"])
    assert missing.exit_code == 1
    assert json.loads(missing.stdout)["aligned"] is False
