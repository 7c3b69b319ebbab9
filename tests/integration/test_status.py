"""``kmq status`` on the real broker, with and without a running tracker."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from kmq.cli import cli
from kmq.core.markers import End, Start, encode_key
from tests.helpers.cli import status_rows
from tests.helpers.kafka import APP_RECORD, produce
from tests.integration.tracker_util import MarkerProducer, running_tracker

pytestmark = pytest.mark.integration


def test_status_reads_kafka_directly_and_shows_tracker_metrics(bootstrap, queue_topics):
    cfg, q = queue_topics(2, queue={"lease": "60s"})
    produce(bootstrap, q.name, 10, partition=0, **APP_RECORD)
    produce(bootstrap, q.name, 5, partition=1, **APP_RECORD)
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=cfg.consumer.group_id, enable_auto_commit=False)
    c.commit({TopicPartition(q.name, 0): OffsetAndMetadata(4, "", -1)})
    c.close()
    markers = MarkerProducer(bootstrap, q.markers_topic)
    markers.send(0, Start([(0, 4)], lease_ms=60_000, owner="w"), ts_ms=int(time.time() * 1000) - 5_000)
    markers.send(0, End([(0, 2)]))
    markers.producer.send(q.markers_topic, key=encode_key(0), value=b"\x01\x63", partition=0).get(10)
    markers.close()
    produce(bootstrap, q.dlq_topic, 2, values=b"dead", headers=[("kmq-dlq-reason", b"rejected")], partition=1,
            flush_each=True)
    args = ["status", q.name, "--bootstrap", bootstrap, "--workers-group", cfg.consumer.group_id,
            "--tracker-group", cfg.tracker.group_id]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    rows = status_rows(res.output)
    # partition: in-flight, oldest, queue-lag, marker-lag, dlq
    assert rows["0"][0] == "2" and rows["0"][2:] == ["6", "3", "0"]
    assert 5.0 <= float(rows["0"][1].rstrip("s")) < 60
    assert rows["1"] == ["0", "-", "5", "0", "2"]
    assert rows["total"][0] == "2" and rows["total"][-1] == "2"
    assert "1 undecodable marker" in res.output
    with running_tracker(cfg) as t:
        res = CliRunner().invoke(cli, args + ["--tracker-url", f"http://127.0.0.1:{t.http_port}"])
        assert res.exit_code == 0, res.output
        assert f'kmq_tracker_in_flight{{partition="0",queue="{q.name}"}} 2.0' in res.output
        assert "kmq_tracker_bad_markers_total 1.0" in res.output
        assert "_created" not in res.output  # prometheus_client's creation timestamps are not shown


def test_status_of_a_missing_queue_is_one_clear_line(bootstrap):
    res = CliRunner().invoke(cli, ["status", "nope-not-here", "--bootstrap", bootstrap])
    assert res.exit_code == 1
    assert "kmq topics create nope-not-here" in res.output and "Traceback" not in res.output
