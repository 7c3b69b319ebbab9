"""The lag job's sinks talk to Kafka through the client ``kafka.client`` names: the marker lag column
(the tracker group's committed offsets, one request) and the metrics topic's creation."""

from __future__ import annotations

import pytest

from kmq.client import open_log_reader
from kmq.client import open_admin
from kmq.spark.sinks import BatchSinks
from tests.conftest import unique

pytestmark = pytest.mark.integration


def test_marker_lag_and_metrics_topic_on_each_client(queue_topics, kafka_client):
    cfg, q = queue_topics(2, kafka={"client": kafka_client})
    reader = open_log_reader(cfg.kafka)
    try:
        reader.commit(cfg.tracker.group_id, {(q.markers_topic, 0): 7})
    finally:
        reader.close()
    sinks = BatchSinks(None, cfg, "unused", ())
    try:
        rows = [{"queue": q.label, "partition": 0, "markers_high_water": 10},
                {"queue": q.label, "partition": 1, "markers_high_water": 4}]
        sinks._add_marker_lag(rows)
        assert [r["marker_lag"] for r in rows] == [3, 4]  # partition 1: nothing committed
        topic = unique("metrics")
        sinks._ensure_topic(topic)
        sinks._ensure_topic(topic)  # once known, not asked again
    finally:
        sinks.close()
    admin = open_admin(cfg.kafka)
    try:
        assert admin.describe([topic])[topic].partitions == 1
    finally:
        admin.close()
