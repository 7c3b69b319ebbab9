"""The tracker's producer on confluent-kafka gives verdicts at flush from failure reports alone:
on the real broker, a record the broker side refuses is named, the others are acknowledged and in the log."""

from __future__ import annotations

import pytest

from kmq.client import UNDECIDED, OutRecord, close_producer
from kmq.client.api import ReportedBatch
from tests.helpers.kafka import read_all

pytestmark = pytest.mark.integration


@pytest.fixture
def settling_producer(queue_topics):
    pytest.importorskip("confluent_kafka", reason="the confluent extra (kmq[confluent]) is not installed")
    from kmq.client.confluent.consumer import producer

    cfg, q = queue_topics(1, kafka={"client": "confluent"})
    prod = producer(cfg.kafka, settle_on_flush=True, **{"delivery.timeout.ms": 10_000})
    try:
        yield prod, q
    finally:
        close_producer(prod)


def test_verdicts_at_flush_name_the_refused_record_and_acknowledge_the_others(settling_producer, bootstrap):
    prod, q = settling_producer
    good = [OutRecord(q.name, 0, b"k", b"v%d" % i, [("kmq-origin", b"%s/0/%d" % (q.name.encode(), i))])
            for i in range(2000)]
    # Partition 5 of a 1-partition topic: librdkafka fails it in a delivery report, not in produce().
    refused = OutRecord(q.name, 5, None, b"nowhere", None)
    batch = prod.send_many(good[:1000] + [refused] + good[1000:])
    assert isinstance(batch, ReportedBatch)
    ok_marker = prod.send(q.markers_topic, value=b"m", key=b"\x00", partition=0)
    # A partition the topic does not have: refused in send() when the client already has the topic's
    # metadata (raised, as without settling), else reported as a failure and given at the flush.
    try:
        bad_marker, refused = prod.send(q.markers_topic, value=b"m", key=b"\x00", partition=9), None
    except Exception as exc:  # noqa: BLE001 - asserted below
        bad_marker, refused = None, exc
    assert batch.verdict(0) is UNDECIDED and not ok_marker.is_done  # nothing is vouched for before the flush
    prod.flush(30)
    verdicts = [batch.verdict(i) for i in range(len(batch))]
    assert verdicts[:1000] == [None] * 1000 and verdicts[1001:] == [None] * 1000
    assert isinstance(verdicts[1000], Exception) and "partition" in str(verdicts[1000]).lower()
    assert ok_marker.succeeded()
    assert (refused is not None and "partition" in str(refused).lower()) or bad_marker.failed()
    assert sorted(r.value for r in read_all(bootstrap, q.name, expect=2000)) == sorted(r.value for r in good)


def test_a_flush_that_times_out_vouches_for_nothing(settling_producer):
    prod, q = settling_producer
    batch = prod.send_many([OutRecord(q.name, 0, None, b"x" * 100, None) for _ in range(20_000)])
    with pytest.raises(Exception, match="not delivered within"):
        prod.flush(0)
    assert all(batch.verdict(i) is UNDECIDED for i in range(len(batch)))
    prod.flush(30)  # the next complete flush settles them
    assert all(batch.verdict(i) is None for i in range(len(batch)))
