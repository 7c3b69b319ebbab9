"""Records Kafka accepts and kafka-python refuses, against a real ``kmq tracker run`` process.

confluent-kafka (librdkafka) produces what kafka-python's producer refuses: null
header values and tombstones. The tracker must stay up, and give every record an
outcome with a reason, without holding back the ordinary records behind them.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from kmq.cli import cli
from kmq.core.markers import Closed, Outcome, Reject, Start, decode
from tests.helpers.kafka import produce_records, read_all, set_max_message_bytes, wait_until
from tests.integration.tracker_util import MarkerProducer, Tail, TrackerProcess, http_status, metric

pytestmark = pytest.mark.integration

confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")

QUEUE = {"lease": "1s", "max_deliveries": 3, "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0}}
MAX_REQUEST = 20_000


HOSTILE = [
    {"key": b"nh", "value": b"null header", "headers": [("trace", None), ("app", b"1")]},
    {"key": None, "value": None},  # tombstone
    {"key": b"big", "value": b"x" * (3 * MAX_REQUEST)},  # larger than the tracker's max_request_size
    {"key": b"bad-count", "value": b"v", "headers": [("kmq-delivery-count", b"\xff\xfe"), ("kmq-origin", None)]},
    {"key": b"huge-count", "value": b"v", "headers": [("kmq-delivery-count", b"9" * 40)]},
]
ORDINARY = [{"key": f"k{i}".encode(), "value": f"v{i}".encode(), "headers": [("app", b"2")]} for i in range(5)]


def _hdrs(rec) -> dict:
    return {k: v for k, v in (rec.headers or [])}


# kafka_client: of the tracker's reader and producer.
def test_each_hostile_record_gets_an_outcome_with_a_reason_and_the_tracker_stays_up(bootstrap, queue_topics, tmp_path,
                                                                                    kafka_client):
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"max_request_size": MAX_REQUEST}, kafka={"client": kafka_client})
    offsets = produce_records(bootstrap, q.name, HOSTILE + ORDINARY)
    assert offsets == list(range(10))
    # The oversize record as a broker that reports topic configs makes one: the topics' limit lowered
    # after it was written (the tracker's producer follows the topics' max.message.bytes).
    set_max_message_bytes(bootstrap, MAX_REQUEST, q.name, q.dlq_topic)
    tracker = TrackerProcess(cfg, tmp_path)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail, dlq = Tail(bootstrap, q.name), Tail(bootstrap, q.dlq_topic)
    try:
        port = tracker.wait_ready()
        markers.send(0, Start([(0, 10)], lease_ms=1000, owner="w"))
        # 10 originals + copies of: null header, bad count, 5 ordinary. DLQ: tombstone, huge count, and a
        # reference to the oversize record.
        copies = tail.wait_for(17, what="redelivered copies")[10:]
        dead = dlq.wait_for(3, what="dead letters")
        wait_until(lambda: metric(port, "kmq_tracker_in_flight", queue=q.name) == 0, 15, what="all closed")
        assert tracker.proc.poll() is None and http_status(port, "/healthz") == 200

        by_key = {c.key: c for c in copies}
        assert sorted(by_key, key=lambda k: k or b"") == sorted([b"nh", b"bad-count"] + [o["key"] for o in ORDINARY])
        nh = _hdrs(by_key[b"nh"])
        assert nh["trace"] == b"" and nh["kmq-null-header"] == b"trace" and nh["app"] == b"1"
        assert nh["kmq-delivery-count"] == b"2" and nh["kmq-origin"] == f"{q.name}/0/0".encode()
        bad = _hdrs(by_key[b"bad-count"])
        assert bad["kmq-delivery-count"] == b"2" and bad["kmq-origin"] == f"{q.name}/0/3".encode()
        for i, o in enumerate(ORDINARY):  # the ordinary records behind them: redelivered as usual
            h = _hdrs(by_key[o["key"]])
            assert by_key[o["key"]].value == o["value"] and h["kmq-delivery-count"] == b"2" and h["app"] == b"2"
            assert h["kmq-origin"] == f"{q.name}/0/{5 + i}".encode()

        tomb, big, huge = sorted(dead, key=lambda d: d.key or b"")
        assert tomb.key is None and tomb.value == b""
        assert _hdrs(tomb)["kmq-dlq-reason"] == b"undeliverable" and b"tombstone" in _hdrs(tomb)["kmq-dlq-error"]
        assert huge.key == b"huge-count" and _hdrs(huge)["kmq-dlq-reason"] == b"timeout"

        # The oversize record fits neither the queue nor the DLQ copy: a reference dead letter names it (no
        # payload), and it is closed with outcome 4, counted.
        assert big.key == b"big" and not big.value and _hdrs(big)["kmq-dlq-reference"] == f"{q.name}/0/2".encode()
        assert int(_hdrs(big)["kmq-dlq-size"]) == 3 + 3 * MAX_REQUEST and _hdrs(big)["kmq-dlq-reason"] == b"undeliverable"
        closed = [decode(r.value) for r in read_all(bootstrap, q.markers_topic) if decode(r.value).TYPE.name == "CLOSED"]
        assert Closed([(2, 1)], Outcome.UNDELIVERABLE) in closed
        assert metric(port, "kmq_tracker_undeliverable_total", queue=q.name, cause="too_large") == 1
        assert metric(port, "kmq_tracker_record_failures_total", queue=q.name, cause="too_large") == 2
        assert metric(port, "kmq_tracker_redelivered_total", queue=q.name) == 7
        assert metric(port, "kmq_tracker_dead_lettered_total", queue=q.name) == 2
        # Nothing is retried afterwards: no further copies, no failing offsets.
        assert metric(port, "kmq_tracker_failing_offsets", queue=q.name) == 0
        assert len(tail.poll()) == 17 and len(dlq.poll()) == 3
    finally:
        tracker.close()
        markers.close()
        tail.close()
        dlq.close()


def test_a_missing_dlq_topic_holds_dead_letters_open_without_duplicating_the_copies(bootstrap, queue_topics, tmp_path,
                                                                                     kafka_client):
    # kafka_client: the tracker's producer meets a topic that does not exist (a failure path of each client).
    cfg, q = queue_topics(1, queue=QUEUE, kafka={"client": kafka_client})
    produce_records(bootstrap, q.name, ORDINARY[:2])
    tracker = TrackerProcess(cfg, tmp_path)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail = Tail(bootstrap, q.name)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        port = tracker.wait_ready()
        admin.delete_topics([q.dlq_topic])
        markers.send(0, Start([(0, 2)], lease_ms=1000, owner="w"))
        markers.send(0, Reject([(0, 1)], reason="bad"))
        tail.wait_for(3, what="the copy of offset 1")
        wait_until(lambda: metric(port, "kmq_tracker_record_failures_total", queue=q.name, cause="dlq_missing") >= 2,
                   30, what="dead-letter attempts counted as dlq_missing")
        # Gauges are published once a second: wait for the view after the copy was closed.
        wait_until(lambda: metric(port, "kmq_tracker_in_flight", queue=q.name) == 1, 10, what="offset 1 closed")
        assert metric(port, "kmq_tracker_failing_offsets", queue=q.name) == 1
        assert tracker.proc.poll() is None
        assert b"does not exist or this tracker may not see it" in tracker.log_path.read_bytes()
        # Visible in `kmq status --tracker-url`, next to the per-partition view.
        res = CliRunner().invoke(cli, ["status", q.name, "--bootstrap", bootstrap,
                                       "--tracker-url", f"http://127.0.0.1:{port}"])
        assert res.exit_code == 0, res.output
        assert f"DLQ topic {q.dlq_topic} does not exist" in res.output
        assert f'kmq_tracker_record_failures_total{{cause="dlq_missing",queue="{q.name}"}}' in res.output
        assert f'kmq_tracker_failing_offsets{{partition="0",queue="{q.name}"}} 1.0' in res.output
        admin.create_topics([NewTopic(q.dlq_topic, 1, 1)])
        dead = Tail(bootstrap, q.dlq_topic)
        try:
            (d,) = dead.wait_for(1, timeout=40, what="the dead letter once the DLQ exists")
            assert d.key == b"k0" and _hdrs(d)["kmq-dlq-reason"] == b"rejected"
            wait_until(lambda: metric(port, "kmq_tracker_in_flight", queue=q.name) == 0, 15, what="closed")
            assert len(dead.poll()) == 1
        finally:
            dead.close()
        assert [r.key for r in tail.poll()] == [b"k0", b"k1", b"k1"]  # offset 1 copied once, never again
    finally:
        admin.close()
        tracker.close()
        markers.close()
        tail.close()
