"""The redelivery tracker on the real broker: timeout, RENEW, NACK, REJECT,
backoff, DLQ, bad markers. Markers are written directly with the codec, so
each test controls exactly what a consumer would have written."""

from __future__ import annotations

import random

import pytest
from kafka import KafkaProducer

from kmq.core.markers import End, MarkerDecodeError, Nack, Reject, Renew, Start, decode, encode, encode_key
from tests.helpers.kafka import APP_RECORD, produce, read_all, wait_until
from tests.integration.tracker_util import QUEUE, MarkerProducer, Tail, headers, http_status, metric, running_tracker

pytestmark = pytest.mark.integration

LEASE_MS = 1000
TICK = 0.05



# kafka_client: the tracker's markers group, its reads of originals and its copies and CLOSED markers on either client.
def test_timeout_redelivers_with_headers_then_dead_letters(bootstrap, queue_topics, kafka_client):
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, 3, **APP_RECORD)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail, dlq = Tail(bootstrap, q.name), Tail(bootstrap, q.dlq_topic)
    try:
        with running_tracker(cfg) as t:
            assert http_status(t.http_port, "/healthz") == 200
            first = 0
            for delivery in (1, 2):
                meta = markers.send(0, Start([(first, 3)], lease_ms=LEASE_MS, owner="w1"))
                start_ts = meta.timestamp
                recs = tail.wait_for(first + 6, what=f"redelivery {delivery}")
                copies = recs[first + 3:first + 6]
                backoff_ms = 200 * 2 ** (delivery - 1)
                for i, c in enumerate(copies):
                    h = headers(c)
                    assert h["kmq-delivery-count"] == str(delivery + 1)
                    assert h["kmq-origin"] == f"{q.name}/0/{i}"  # the FIRST delivery, kept across copies
                    assert h["app"] == "x" and c.key == f"k{i}".encode() and c.value == f"v{i}".encode()
                    # Due at lease end + backoff(count); redelivered within tick + 1 s of that.
                    due = start_ts + LEASE_MS + backoff_ms
                    assert due <= c.timestamp <= due + (TICK + 1.0) * 1000, (delivery, c.timestamp - start_ts)
                first += 3
            # Third delivery times out: max_deliveries = 3 -> DLQ, reason timeout, origin kept.
            markers.send(0, Start([(6, 3)], lease_ms=LEASE_MS, owner="w1"))
            dead = dlq.wait_for(3, what="dead letters")
            for i, d in enumerate(dead):
                h = headers(d)
                assert h["kmq-dlq-reason"] == "timeout" and h["kmq-delivery-count"] == "3"
                assert h["kmq-origin"] == f"{q.name}/0/{i}" and h["app"] == "x"
                assert abs(int(h["kmq-dlq-ts"]) - d.timestamp) < 5000
            wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 0, 10,
                       what="nothing in flight")
            assert metric(t.http_port, "kmq_tracker_redelivered_total", queue=q.name, reason="timeout") == 6
            assert metric(t.http_port, "kmq_tracker_dead_lettered_total", queue=q.name, reason="timeout") == 3
            assert len(tail.poll()) == 9  # nothing redelivered twice
    finally:
        markers.close()
        tail.close()
        dlq.close()


def test_renew_nack_reject_and_end(bootstrap, queue_topics, kafka_client):
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, 4, **APP_RECORD)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail, dlq = Tail(bootstrap, q.name), Tail(bootstrap, q.dlq_topic)
    try:
        with running_tracker(cfg) as t:
            start = markers.send(0, Start([(0, 4)], lease_ms=LEASE_MS, owner="w1")).timestamp
            markers.send(0, End([(0, 1)]))                                  # 0: acked
            renew = markers.send(0, Renew([(1, 1)], lease_ms=4000)).timestamp  # 1: kept alive
            nack = markers.send(0, Nack([(2, 1)], delay_ms=1500)).timestamp    # 2: redeliver after 1.5 s
            markers.send(0, Reject([(3, 1)], reason="bad payload"))          # 3: DLQ at once
            (dead,) = dlq.wait_for(1, what="rejected message")
            h = headers(dead)
            assert (h["kmq-dlq-reason"], h["kmq-dlq-error"], h["kmq-origin"]) == ("rejected", "bad payload", f"{q.name}/0/3")
            recs = tail.wait_for(5, what="nacked copy")
            nacked = recs[4]
            assert headers(nacked)["kmq-origin"] == f"{q.name}/0/2"
            assert nack + 1500 <= nacked.timestamp <= nack + 1500 + (TICK + 1.0) * 1000
            # The original lease (+ backoff) of offset 1 is long over; RENEW kept it open.
            assert nacked.timestamp > start + LEASE_MS + 200
            recs = tail.wait_for(6, what="renewed message after its new lease")
            renewed = recs[5]
            assert headers(renewed)["kmq-origin"] == f"{q.name}/0/1"
            assert renewed.timestamp >= renew + 4000 + 200
            # A late END for the redelivered offset is counted, not applied.
            markers.send(0, End([(1, 1)]))
            wait_until(lambda: metric(t.http_port, "kmq_tracker_late_acks_total", queue=q.name) == 1, 10,
                       what="late ack counted")
            assert len(tail.poll()) == 6  # offset 0 (acked) was never redelivered
    finally:
        markers.close()
        tail.close()
        dlq.close()


def _fuzz_values(n: int, seed: int = 7) -> list[bytes]:
    """Mutations of valid markers and random bytes, each one undecodable."""
    rnd = random.Random(seed)
    valid = [encode(Start([(5, 3)], lease_ms=100, owner="w")), encode(End([(1, 2), (9, 1)])),
             encode(Renew([(0, 1)], lease_ms=5)), encode(Reject([(2, 2)], reason="r"))]
    out: list[bytes] = []
    while len(out) < n:
        base = bytearray(rnd.choice(valid))
        k = rnd.randrange(4)
        if k == 0:
            base = base[: rnd.randrange(len(base))]
        elif k == 1:
            base += bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
        elif k == 2:
            base[rnd.randrange(len(base))] = rnd.randrange(256)
        else:
            base = bytearray(rnd.randbytes(rnd.randint(0, 24)))
        try:
            decode(bytes(base))
        except MarkerDecodeError:
            out.append(bytes(base))
    return out


# kafka_client: the markers group consumer reads the bad records on each client.
def test_bad_markers_are_counted_and_skipped(bootstrap, queue_topics, kafka_client):
    """100,000 undecodable values (plus bad keys) never stop the tracker."""
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, 1, **APP_RECORD)
    values = _fuzz_values(100_000)
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 * 1024)
    good_start = encode(Start([(0, 1)], lease_ms=LEASE_MS))
    for v in values:
        p.send(q.markers_topic, key=encode_key(0), value=v, partition=0)
    p.send(q.markers_topic, key=b"\x00", value=good_start, partition=0)  # bad key length
    p.send(q.markers_topic, key=encode_key(3), value=good_start, partition=0)  # key names another partition
    p.send(q.markers_topic, key=encode_key(0), value=good_start, partition=0)  # the one valid marker
    p.flush()
    p.close()
    tail = Tail(bootstrap, q.name)
    try:
        with running_tracker(cfg) as t:
            # Ready can also mean "in a rebalance, no partition yet": the count is waited for, then exact.
            wait_until(lambda: metric(t.http_port, "kmq_tracker_bad_markers_total") >= 100_002, 30,
                       what="every bad marker counted")
            assert metric(t.http_port, "kmq_tracker_bad_markers_total") == 100_002
            (_, copy) = tail.wait_for(2, what="redelivery after the bad markers")
            assert headers(copy)["kmq-delivery-count"] == "2"
    finally:
        tail.close()


def test_offsets_past_the_end_of_the_queue_log_are_held_never_closed_and_copied_once_there(bootstrap, queue_topics,
                                                                                           kafka_client):
    """A START names offsets 3..4 while the log as the tracker reads it ends at 3 (a reader stopped at
    an open transaction, a new leader's lagging high-water mark): a consumer fetched them, so they
    exist. They are held with a backoff, counted and never closed; once the log reaches them they are
    copied. (The old rule closed them as missing at once: never copied, never dead-lettered.)"""
    from kmq.core.markers import Closed, Outcome

    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, 3, **APP_RECORD)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail = Tail(bootstrap, q.name)
    try:
        with running_tracker(cfg) as t:
            port = t.http_port
            markers.send(0, Start([(3, 2)], lease_ms=LEASE_MS))
            wait_until(lambda: metric(port, "kmq_tracker_offsets_past_log_end_total", queue=q.name) >= 4, 15,
                       what="the offsets past the log end held twice (read again after a backoff)")
            assert metric(port, "kmq_tracker_missing_offsets_total", queue=q.name) == 0
            assert metric(port, "kmq_tracker_in_flight", queue=q.name) == 2
            produce(bootstrap, q.name, 2, **APP_RECORD)  # offsets 3 and 4 reach the log as read
            recs = tail.wait_for(7, what="copies of offsets 3 and 4")
            assert sorted(headers(r)["kmq-origin"] for r in recs[5:]) == [f"{q.name}/0/3", f"{q.name}/0/4"]
            wait_until(lambda: metric(port, "kmq_tracker_in_flight", queue=q.name) == 0, 10, what="closed")
            assert metric(port, "kmq_tracker_missing_offsets_total", queue=q.name) == 0
        closed = [m for m in (decode(r.value) for r in read_all(bootstrap, q.markers_topic)) if isinstance(m, Closed)]
        assert closed == [Closed([(3, 2)], Outcome.REDELIVERED)]
        assert len(tail.poll()) == 7
    finally:
        markers.close()
        tail.close()


def test_records_of_an_open_transaction_a_worker_was_handed_are_copied_not_closed(bootstrap, queue_topics,
                                                                                  kafka_client):
    """Workers on kafka-python read uncommitted (its default): they are handed the records of a
    transaction still open, and START them. The tracker's reader must see them too: read committed
    (librdkafka's default) its read stopped at the last stable offset below them. On Kafka it then
    closed them as missing (never copied, never dead-lettered once the producer committed); on the
    embedded broker its read waited there until it timed out, again and again: no copy either."""
    import uuid

    from kafka import KafkaConsumer, TopicPartition

    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, 5, **APP_RECORD)  # committed, outside any transaction: offsets 0..4
    tx = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"kmq-test-{uuid.uuid4().hex[:8]}")
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail = Tail(bootstrap, q.name)
    try:
        tx.init_transactions()
        tx.begin_transaction()
        for i in range(5):
            tx.send(q.name, key=b"t%d" % i, value=b"tx%d" % i, partition=0)
        tx.flush()  # in the log, not committed: offsets 5..9
        worker = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                               isolation_level="read_uncommitted")
        try:
            worker.assign([TopicPartition(q.name, 0)])
            handed: list = []
            wait_until(lambda: handed.extend(r for rs in worker.poll(timeout_ms=100).values() for r in rs)
                       or len(handed) >= 10, 15, what="the worker handed the open transaction's records")
        finally:
            worker.close()
        markers.send(0, Start([(0, 10)], lease_ms=LEASE_MS, owner="kafka-python-worker"))
        with running_tracker(cfg) as t:
            port = t.http_port
            recs = tail.wait_for(10 + 10, what="a copy of each of the 10 started records")
            assert sorted(headers(r)["kmq-origin"] for r in recs[10:]) == sorted(f"{q.name}/0/{i}" for i in range(10))
            wait_until(lambda: metric(port, "kmq_tracker_in_flight", queue=q.name) == 0, 10, what="closed")
            assert metric(port, "kmq_tracker_missing_offsets_total", queue=q.name) == 0
        tx.commit_transaction()
    finally:
        tx.close()
        markers.close()
        tail.close()
