"""A revoked partition's given-back messages are not copied while the group is slow to give the
partition to its next owner: their leases are handed off (a RENEW with ``consumer.handoff_lease``)
before the commit back, and the next owner's START supersedes that."""

from __future__ import annotations

import threading

import pytest

from kmq.consumer.consumer import KmqConsumer
from kmq.core.markers import End, Renew, Start, decode
from tests.helpers.kafka import produce, read_all, wait_until
from tests.helpers.workers import logged_partitions
from tests.integration.tracker_util import MarkerProducer, Tail, metric
from tracker import Tracker

pytestmark = pytest.mark.integration

SENTINEL = 1_000_000  # an offset past the queue's end: once it is due the tracker holds it and counts it as past the end


def _covers(marker, offsets: set[int]) -> bool:
    return any(r.first <= o < r.first + r.count for r in marker.ranges for o in offsets)


def test_a_given_back_message_is_not_copied_while_its_partition_waits_for_the_next_owner(
        queue_topics, bootstrap, kafka_client, caplog):
    # a holds committed, never-handed messages of both partitions; one partition moves to b, whose
    # fetcher is held before its START for longer than the lease (a slow reassignment, as a stalled
    # group or a broker outage makes). Without the hand-off the tracker copied a's given-back
    # messages when a's last lease on them ran out, and b then processed the originals too.
    caplog.set_level("INFO", logger="kmq.consumer.consumer")
    cfg, q = queue_topics(partitions=2, queue={"lease": "2s", "backoff": {"initial": "100ms"}},
                          consumer={"ack_flush_interval": "50ms", "handoff_lease": "60s"},
                          kafka={"client": kafka_client})
    tracker = Tracker(cfg, http_host="127.0.0.1").start()
    produce(cfg, q.name, 20, keys=b"%d", partitions=2)
    hold, held = threading.Event(), threading.Event()

    def hold_the_first_start(stage: str, spans: dict) -> None:
        if stage == "polled" and not held.is_set():
            held.set()
            hold.wait(60)

    a = KmqConsumer(cfg, queue=q.name)
    b = None
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail = None
    try:
        first: list = []
        wait_until(lambda: first.extend(a.poll(timeout=0.2, max_records=1)) or first, 30, what="a's first message")
        first[0].ack()  # a's fetcher committed all 20; 19 wait in its ready queue
        b = KmqConsumer(cfg, queue=q.name, stage_hook=hold_the_first_start)
        got: list = []
        wait_until(lambda: got.extend(b.poll(timeout=0.2)) or logged_partitions(caplog.records, "revoked"), 60,
                   what="a partition moving to b")
        [moved] = logged_partitions(caplog.records, "revoked")
        wait_until(held.is_set, 60, what="b fetching the moved partition (and holding its START)")
        given = set(range(1 if first[0].partition == moved else 0, 10))

        # a's last lease on the given-back messages: the deadline they would have without the hand-off.
        # (a renews ready messages every half lease until the revocation takes them out.)
        tail = Tail(bootstrap, q.markers_topic, partitions=(moved,))
        end = tail.consumer.end_offsets(tail.tps)[tail.tps[0]]
        wait_until(lambda: tail.poll() is not None and tail.consumer.position(tail.tps[0]) >= end, 30,
                   what="the markers written up to the revocation")
        recs = [(r.timestamp, decode(r.value)) for r in tail.records]
        last_ts = max(ts for ts, m in recs if isinstance(m, (Start, Renew)) and _covers(m, given)
                      and not (isinstance(m, Renew) and m.lease_ms == 60_000))
        assert len({m.owner for _, m in recs if isinstance(m, Start)}) == 1, "b wrote a START while it was held"

        # A sentinel with that same deadline (or later: the tracker counts a marker from when it could have
        # been written): once the tracker finds it due, past the log's end, its time is past a's lease.
        markers.send(moved, Start([(SENTINEL, 1)], lease_ms=2000, owner="sentinel"), ts_ms=last_ts)
        wait_until(lambda: metric(tracker.http_port, "kmq_tracker_offsets_past_log_end_total", queue=q.name) >= 1, 60,
                   what="the tracker finding the sentinel due (a's old deadline passed)")
        markers.send(moved, End([(SENTINEL, 1)]))  # held, never closed: settled like any message
        assert metric(tracker.http_port, "kmq_tracker_redelivered_total", queue=q.name) == 0

        # The hand-off: a RENEW for 60 s covering them, written before the commit back (so before b's START).
        handoffs = [m for _, m in recs if isinstance(m, Renew) and m.lease_ms == 60_000]
        assert handoffs and {o for m in handoffs for r in m.ranges for o in range(r.first, r.first + r.count)} >= given

        hold.set()  # b STARTs, commits and gets the originals
        wait_until(lambda: got.extend(b.poll(timeout=0.2)) or {m.offset for m in got} >= given, 60,
                   what="b getting a's given-back messages")
        for m in got:
            m.ack()
        assert {m.partition for m in got} == {moved} and all(m.delivery_count == 1 for m in got)
        rest: list = []
        wait_until(lambda: rest.extend(a.poll(timeout=0.2)) or len(rest) >= 10 - (first[0].partition != moved), 30,
                   what="a's messages of the partition it kept")
        for m in rest:
            m.ack()
        wait_until(lambda: metric(tracker.http_port, "kmq_tracker_in_flight", queue=q.name) == 0, 60,
                   what="every message settled at the tracker")
        assert metric(tracker.http_port, "kmq_tracker_redelivered_total", queue=q.name) == 0
        assert len(read_all(bootstrap, q.name)) == 20  # no copy in the queue
    finally:
        hold.set()
        if tail is not None:
            tail.close()
        markers.close()
        if b is not None:
            b.close()
        a.close()
        tracker.stop()
