"""A committed marker offset that is no longer in the markers log is detected, logged and counted.

tansu cannot delete records (no retention, no DeleteRecords), so its log start
never moves. On tansu the resume check is driven with a committed offset past
the log end (a recreated topic): the tracker compares the committed offset with
a fresh high-water mark, resets to the log start itself (tansu also does not
answer such a fetch with OFFSET_OUT_OF_RANGE, which real Kafka does) and counts
it. The loss case proper (committed offset below the log start, seen through
the consumer's offset-out-of-range reset) runs against a real Kafka
(``KMQ_TEST_BOOTSTRAP``) and is skipped on tansu with the gap named; the
classification itself is unit-tested in tests/unit/test_retention.py.
"""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from kmq.core.markers import End, Start
from tests.helpers.kafka import wait_until
from tests.integration.tracker_util import (
    QUEUE,
    MarkerProducer,
    metric,
    running_tracker,
)

pytestmark = pytest.mark.integration


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        c.commit({TopicPartition(topic, 0): OffsetAndMetadata(offset, "", -1)})
    finally:
        c.close()


# kafka_client: where the markers group consumer resumes (committed offset, position, seek to the log start).
def test_committed_offset_past_the_log_end_is_detected_and_replayed_from_the_log_start(bootstrap, queue_topics,
                                                                                      caplog, kafka_client):
    cfg, q = queue_topics(1, queue={**QUEUE, "lease": "60s"}, kafka={"client": kafka_client})
    markers = MarkerProducer(bootstrap, q.markers_topic)
    try:
        markers.send(0, Start([(0, 3)], lease_ms=60_000, owner="w"))
        markers.send(0, End([(1, 1)]))
    finally:
        markers.close()
    _commit(bootstrap, cfg.tracker.group_id, q.markers_topic, 50)  # e.g. the topic was recreated
    with running_tracker(cfg) as t:
        port = t.http_port
        wait_until(lambda: metric(port, "kmq_tracker_marker_offset_resets_total", queue=q.name,
                                  kind="beyond_log_end") == 1, 15, what="the reset counted")
        # Replayed from the log start: the open START is known again (never "caught up" on an empty view).
        wait_until(lambda: metric(port, "kmq_tracker_in_flight", queue=q.name) == 2, 10, what="START replayed")
        assert metric(port, "kmq_tracker_markers_lost_total", queue=q.name) == 0
    assert "is past the end of the markers log" in caplog.text


def test_committed_offset_below_the_log_start_counts_the_lost_markers(bootstrap, queue_topics, caplog, skip_on_tansu,
                                                                       kafka_client):
    skip_on_tansu("cannot delete records: no retention and no DeleteRecords, so the log start never moves")
    cfg, q = queue_topics(1, queue={**QUEUE, "lease": "60s"}, kafka={"client": kafka_client})
    markers = MarkerProducer(bootstrap, q.markers_topic)
    try:
        for i in range(10):
            markers.send(0, Start([(i, 1)], lease_ms=60_000, owner="w"))
    finally:
        markers.close()
    _commit(bootstrap, cfg.tracker.group_id, q.markers_topic, 2)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(q.markers_topic, 0): 6})  # what retention does
    finally:
        admin.close()
    from kmq.ops.status import collect

    assert [r.markers_lost for r in collect(cfg, q.name)] == [4]  # kmq status shows it with the tracker down
    with running_tracker(cfg) as t:
        port = t.http_port
        wait_until(lambda: metric(port, "kmq_tracker_markers_lost_total", queue=q.name) == 4, 15,
                   what="markers 2..5 counted as lost")
        assert metric(port, "kmq_tracker_marker_offset_resets_total", queue=q.name, kind="below_log_start") == 1
        assert metric(port, "kmq_tracker_in_flight", queue=q.name) == 4  # STARTs 6..9 survive
    assert "were deleted by retention before the tracker closed them" in caplog.text


def test_queue_records_deleted_below_the_log_start_are_closed_as_missing_counted_and_traced(
        bootstrap, queue_topics, skip_on_tansu, kafka_client):
    """The one case a due message is closed without a copy: its record was deleted from the queue log
    (retention, DeleteRecords) before the tracker read it. Closed with outcome 3, counted in
    kmq_tracker_missing_offsets_total (the KmqOffsetsMissingFromQueueLog alert) and shown by kmq trace."""
    from click.testing import CliRunner

    from kmq.cli import cli
    from kmq.core.markers import Closed, Outcome, decode
    from tests.helpers.kafka import APP_RECORD, produce, read_all
    from tests.integration.tracker_util import Tail, headers

    skip_on_tansu("cannot delete records: no retention and no DeleteRecords, so the log start never moves")
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, 5, **APP_RECORD)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(q.name, 0): 3})  # what retention does
    finally:
        admin.close()
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail = Tail(bootstrap, q.name)
    try:
        markers.send(0, Start([(0, 5)], lease_ms=1000, owner="w"))
        with running_tracker(cfg) as t:
            port = t.http_port
            wait_until(lambda: metric(port, "kmq_tracker_missing_offsets_total", queue=q.name) == 3, 15,
                       what="offsets 0..2 closed as missing")
            recs = tail.wait_for(4, what="copies of offsets 3 and 4")
            assert sorted(headers(r)["kmq-origin"] for r in recs[2:]) == [f"{q.name}/0/3", f"{q.name}/0/4"]
            assert metric(port, "kmq_tracker_offsets_past_log_end_total", queue=q.name) == 0
        closed = [m for m in (decode(r.value) for r in read_all(bootstrap, q.markers_topic)) if isinstance(m, Closed)]
        assert Closed([(0, 3)], Outcome.MISSING) in closed
        res = CliRunner().invoke(cli, ["trace", q.name, f"{q.name}/0/1", "--since", "10m", "--bootstrap", bootstrap,
                                       "--tracker-group", cfg.tracker.group_id])
        assert res.exit_code == 0 and "missing" in res.output, res.output
    finally:
        markers.close()
        tail.close()
