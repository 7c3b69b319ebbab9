"""Tracker crash recovery, SIGTERM hand-over and broker restart, with real processes."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaProducer

from kmq.config import Config
from tests.helpers.kafka import APP_RECORD, own_broker, produce
from kmq.core.markers import End, Start, encode, encode_key
from kmq.client.topics import ensure_topics
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import wait_until
from tests.integration.tracker_util import QUEUE, MarkerProducer, Tail, TrackerProcess, committed, headers, metric, running_tracker

pytestmark = pytest.mark.integration


def _markers(bootstrap: str, topic: str, items) -> None:
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10)
    for m in items:
        p.send(topic, key=encode_key(0), value=encode(m), partition=0)
    p.flush()
    p.close()


# kafka_client: the killed tracker's commits and the next owner's replay, on each client's group membership.
def test_sigkill_new_owner_replays_only_from_the_oldest_open_start(bootstrap, queue_topics, tmp_path, kafka_client):
    cfg, q = queue_topics(1, queue={**QUEUE, "lease": "60s"}, kafka={"client": kafka_client})
    closed_pairs = 1000
    # markers 0..1999: started and acked; 2000: START of offset 1000, never acked; 2001..4000: more acked pairs
    items = []
    for i in range(closed_pairs):
        items += [Start([(i, 1)], lease_ms=60_000, owner="w"), End([(i, 1)])]
    items.append(Start([(closed_pairs, 1)], lease_ms=60_000, owner="w"))
    for i in range(closed_pairs + 1, 2 * closed_pairs + 1):
        items += [Start([(i, 1)], lease_ms=60_000, owner="w"), End([(i, 1)])]
    _markers(bootstrap, q.markers_topic, items)
    total = len(items)
    open_start = 2 * closed_pairs
    a = TrackerProcess(cfg, tmp_path)
    try:
        port = a.wait_ready()
        wait_until(lambda: metric(port, "kmq_tracker_in_flight", queue=q.name) == 1, 5, what="in-flight gauge")
        wait_until(lambda: committed(bootstrap, cfg.tracker.group_id, q.markers_topic) == open_start, 15,
                   what="commit at the open START")
        a.kill()
        t0 = time.monotonic()
        with running_tracker(cfg) as b:
            replay_s = time.monotonic() - t0
            replayed = metric(b.http_port, "kmq_tracker_markers_total", queue=q.name)
            assert replayed == total - open_start  # 2001 of 4001: never the acked history before the START
            assert metric(b.http_port, "kmq_tracker_in_flight", queue=q.name) == 1
        print(f"recovery: replayed {replayed:.0f} of {total} markers, ready {replay_s:.1f}s after the SIGKILL")
    finally:
        a.close()


def test_sigterm_commits_and_leaves_so_the_next_owner_redelivers(bootstrap, queue_topics, tmp_path, kafka_client):
    # kafka_client: a tracker process that commits and leaves and one that joins, on each client.
    cfg, q = queue_topics(2, queue={**QUEUE, "lease": "3s"}, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    produce(bootstrap, q.name, 2, partition=0, **APP_RECORD)
    produce(bootstrap, q.name, 2, partition=1, **APP_RECORD)
    a = TrackerProcess(cfg, tmp_path)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tails = [Tail(bootstrap, q.name, (0,)), Tail(bootstrap, q.name, (1,))]
    try:
        a.wait_ready()
        for p in (0, 1):
            markers.send(p, Start([(0, 2)], lease_ms=3000, owner="w"))
        assert a.terminate() == 0  # drains, commits, leaves the group
        with running_tracker(cfg):
            for tail in tails:
                recs = tail.wait_for(4, what="redelivery by the next owner")
                assert [headers(r)["kmq-delivery-count"] for r in recs[2:]] == ["2", "2"]
    finally:
        a.close()
        markers.close()
        for t in tails:
            t.close()


def test_broker_restart_mid_run_loses_nothing(tmp_path, kafka_client):
    broker = own_broker(tmp_path)
    broker.start()
    try:
        name = unique("q")
        cfg = Config.from_dict({
            # kafka_client: the tracker's group, reads and redeliveries ride through the outage on each client.
            "kafka": {"bootstrap_servers": broker.bootstrap, **TEST_GROUP_TIMING, "client": kafka_client},
            "queues": [{"name": name, **QUEUE, "lease": "2s"}],
            "tracker": {"group_id": unique("tracker"), "http_port": 0, "tick": "50ms"},
        })
        q = cfg.queues[0]
        ensure_topics(cfg.kafka, q, 1)
        n = 200
        produce(broker.bootstrap, q.name, n, **APP_RECORD)
        with running_tracker(cfg) as t:
            markers = MarkerProducer(broker.bootstrap, q.markers_topic)
            for b in range(4):
                markers.send(0, Start([(b * 50, 50)], lease_ms=2000, owner="w"))
            markers.close()
            broker.restart()
            tail = Tail(broker.bootstrap, q.name)
            try:
                recs = tail.wait_for(2 * n, timeout=90, what="every message redelivered after the restart")
            finally:
                tail.close()
            origins = {headers(r)["kmq-origin"] for r in recs[n:]}
            assert origins == {f"{q.name}/0/{i}" for i in range(n)}  # 0 lost
            dups = len(recs) - 2 * n
            print(f"broker restart: {n} redelivered, {dups} duplicate copies, "
                  f"{metric(t.http_port, 'kmq_tracker_redelivery_failures_total', queue=q.name):.0f} failed attempts retried")
    finally:
        broker.stop()


# kafka_client: a rebalance between two trackers, with the commit made inside the revoke, on each client.
def test_a_joining_tracker_takes_partitions_and_nothing_is_redelivered_twice(bootstrap, queue_topics, kafka_client):
    cfg, q = queue_topics(2, queue={**QUEUE, "lease": "4s"}, tracker={"tick": "50ms"}, kafka={"client": kafka_client})
    for p in (0, 1):
        produce(bootstrap, q.name, 2, partition=p, **APP_RECORD)
    markers = MarkerProducer(bootstrap, q.markers_topic)
    tails = [Tail(bootstrap, q.name, (0,)), Tail(bootstrap, q.name, (1,))]
    try:
        with running_tracker(cfg) as a:
            for p in (0, 1):
                markers.send(p, Start([(0, 2)], lease_ms=4000, owner="w"))
            wait_until(lambda: metric(a.http_port, "kmq_tracker_in_flight", queue=q.name) == 4, 10, what="tracked")
            with running_tracker(cfg) as b:
                # The rebalance moved a partition: A committed before the revoke, B replayed it.
                wait_until(lambda: a.ready()[1].startswith("ready: 1") and b.ready()[1].startswith("ready: 1"), 30,
                           what="one partition each")
                for tail in tails:
                    recs = tail.wait_for(4, what="redelivery after the rebalance")
                    assert [headers(r)["kmq-delivery-count"] for r in recs[2:]] == ["2", "2"]
                # Counted once the copy's CLOSED marker is acknowledged, a little after the copy is readable.
                def total() -> float:
                    return sum(metric(t.http_port, "kmq_tracker_redelivered_total", queue=q.name) for t in (a, b))

                wait_until(lambda: total() >= 4, 10, what="the copies counted")
                assert total() == 4
        assert [len(t.poll()) for t in tails] == [4, 4]  # no second copy from either owner
    finally:
        markers.close()
        for t in tails:
            t.close()
