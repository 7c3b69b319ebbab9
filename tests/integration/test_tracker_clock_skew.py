"""Clock skew between a worker host and the tracker host, on the real broker.

The markers are written with explicit record timestamps (CreateTime) from a
worker clock 10 s off the tracker's; the tracker judges leases on its own
clock (docs/protocol.md, "Clocks"). Each test waits on what the tracker has
read (its marker counter), never on a sleep.
"""

from __future__ import annotations

import time

import pytest

from kmq.core.markers import End, Start
from tests.helpers.kafka import APP_RECORD, produce, wait_until
from tests.integration.tracker_util import MarkerProducer, Tail, http_status, metric, running_tracker
from tracker.service import Tracker

pytestmark = pytest.mark.integration

LEASE_MS = 2000
MESSAGES = 20
QUEUE = {"lease": "2s", "max_deliveries": 3, "backoff": {"initial": "200ms", "max": "2s", "multiplier": 2.0}}


def worker_ms(skew_s: float) -> int:
    return int((time.time() + skew_s) * 1000)


# kafka_client: whether the tracker read a partition to its end comes from each client's high-water mark.
def test_a_worker_clock_10s_behind_costs_no_copy_and_no_dead_letter(bootstrap, queue_topics, kafka_client):
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, MESSAGES, **APP_RECORD)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail, dlq = Tail(bootstrap, q.name), Tail(bootstrap, q.dlq_topic)
    try:
        with running_tracker(cfg) as t:
            def read(mtype: str) -> float:
                return metric(t.http_port, "kmq_tracker_markers_total", queue=q.name, type=mtype)

            for o in range(MESSAGES):
                markers.send(0, Start([(o, 1)], lease_ms=LEASE_MS, owner="w-behind"), ts_ms=worker_ms(-10))
                # The handler acks once the tracker holds the START: on the worker's clock its lease
                # ended 8 s before it began.
                wait_until(lambda o=o: read("start") == o + 1, 10, what=f"START {o} read")
                markers.send(0, End([(o, 1)]), ts_ms=worker_ms(-10))
            wait_until(lambda: read("end") == MESSAGES, 10, what="every END read")
            wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 0, 10,
                       what="nothing in flight")
            assert metric(t.http_port, "kmq_tracker_redelivered_total", queue=q.name) == 0
            assert metric(t.http_port, "kmq_tracker_dead_lettered_total", queue=q.name) == 0
            # Measured: read time minus record time, the worker's 10 s and a little read latency.
            wait_until(lambda: metric(t.http_port, "kmq_tracker_clock_skew_seconds", queue=q.name,
                                      owner="w-behind") > 0, 10, what="skew published")
            assert 9.9 <= metric(t.http_port, "kmq_tracker_clock_skew_seconds", queue=q.name, owner="w-behind") < 11
        # The originals only, read to the end (one 100 ms poll of a new reader may not have fetched yet).
        assert len(tail.wait_for(MESSAGES, what="the originals")) == MESSAGES and dlq.poll() == []
    finally:
        markers.close()
        tail.close()
        dlq.close()


def test_a_worker_clock_10s_ahead_does_not_hold_the_lease_of_a_message_whose_worker_died(
        bootstrap, queue_topics, kafka_client):
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, 1, **APP_RECORD)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tail = Tail(bootstrap, q.name)
    try:
        with running_tracker(cfg):
            written = time.time() * 1000
            markers.send(0, Start([(0, 1)], lease_ms=LEASE_MS, owner="w-ahead"), ts_ms=worker_ms(10))
            copy = tail.wait_for(2, timeout=30, what="the copy")[1]
            # The lease and the first backoff on the tracker's clock (the copy's timestamp is the
            # tracker's), a step or two more; on the worker's clock it would be 10 s later.
            assert written + LEASE_MS + 200 - 100 <= copy.timestamp <= written + LEASE_MS + 200 + 2000
    finally:
        markers.close()
        tail.close()


class SettableClock:
    """The tracker's wall clock: the host's, moved by ``offset_s`` (an operator's `date -s`, a broken
    time sync); its monotonic clock is untouched."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


def test_a_tracker_whose_clock_is_set_back_re_reads_its_markers_and_copies_only_the_abandoned_message(
        bootstrap, queue_topics):
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"})
    produce(bootstrap, q.name, 2, **APP_RECORD)
    markers, tail = MarkerProducer(bootstrap, q.markers_topic), Tail(bootstrap, q.name)
    clock = SettableClock()
    t = Tracker(cfg, http_host="127.0.0.1", clock=clock).start()
    try:
        wait_until(lambda: http_status(t.http_port, "/readyz") == 200, 30, what="tracker ready")

        def read(mtype: str) -> float:
            return metric(t.http_port, "kmq_tracker_markers_total", queue=q.name, type=mtype)

        markers.send(0, Start([(0, 2)], lease_ms=LEASE_MS, owner="w"), ts_ms=worker_ms(0))
        markers.send(0, End([(0, 1)]), ts_ms=worker_ms(0))  # the first acked; the second's worker died
        wait_until(lambda: read("end") == 1, 10, what="the END read")
        clock.offset_s = -30.0
        set_back = time.monotonic()
        # Counted on the old clock, the lease would end 30 s late. Re-read on the new one, it ends a
        # lease (2 s) and a backoff (0.2 s) after the re-read.
        copies = tail.wait_for(3, timeout=15, what="the abandoned message's copy")[2:]
        assert time.monotonic() - set_back < LEASE_MS / 1000 + 3.0
        assert [c.key for c in copies] == [b"k1"]
        wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 0, 10, what="all closed")
        assert metric(t.http_port, "kmq_tracker_clock_jumps_total", direction="back") == 1
        assert 29.5 < metric(t.http_port, "kmq_tracker_clock_jump_seconds_total", direction="back") < 30.5
        assert read("start") == 2 and read("end") == 2  # read again from the committed offset
        assert metric(t.http_port, "kmq_tracker_redelivered_total", queue=q.name) == 1
        assert len(tail.poll()) == 3
    finally:
        t.stop()
        markers.close()
        tail.close()
