"""The consumer adapters of the client seam on the real broker, both clients:
poll as Records, commit of explicit offsets, seek, pause/resume, high-water marks;
the group consumer's committed offsets, positions and commit before a revoke."""

from __future__ import annotations

import pytest

from kmq.client.kafka_python import clients
from kmq.client import Record, adapt_consumer, group_consumer
from tests.helpers.kafka import recent_ms, wait_until
from tests.helpers.workers import committed

TS = recent_ms()

pytestmark = pytest.mark.integration


def _consumer(client, cfg, topic):
    if client == "confluent":
        ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
        c = ck.Consumer({"bootstrap.servers": cfg.kafka.bootstrap_servers, "group.id": cfg.consumer.group_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
        c.subscribe([topic])
        return c
    return clients.consumer(cfg.kafka, topic, group_id=cfg.consumer.group_id)


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_adapter_polls_commits_seeks_pauses_and_reports_the_high_water_mark(queue_topics, bootstrap, client):
    cfg, q = queue_topics(partitions=2)
    p = clients.producer(cfg.kafka)
    for i in range(20):
        p.send(q.name, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2, headers=[("h", b"1")], timestamp_ms=TS + i)
    p.flush()
    p.close()
    a = adapt_consumer(_consumer(client, cfg, q.name))
    try:
        got: list[Record] = []
        wait_until(lambda: got.extend(a.poll(0.5, 100)) or len(got) >= 20, 30, what="all records")
        assert a.assignment() == {(q.name, 0), (q.name, 1)}
        r = next(x for x in got if x.partition == 1 and x.offset == 3)
        assert (r.key, r.value, list(r.headers), r.timestamp) == (b"k7", b"v7", [("h", b"1")], TS + 7)
        assert a.highwater(q.name, 0) == 10 and a.highwater(q.name, 1) == 10
        a.commit({(q.name, 0): 10, (q.name, 1): 4})
        assert committed(bootstrap, cfg.consumer.group_id, q.name) == {0: 10, 1: 4}
        # Seek back on partition 1 and pause partition 0: only partition 1 comes again, from offset 4.
        a.seek(q.name, 1, 4)
        a.pause([(q.name, 0)])
        again: list[Record] = []
        wait_until(lambda: again.extend(a.poll(0.5, 100)) or len(again) >= 6, 30, what="partition 1 again")
        assert [(x.partition, x.offset) for x in again] == [(1, o) for o in range(4, 10)]
        a.resume([(q.name, 0)])
    finally:
        a.close()


def test_group_consumer_positions_commits_and_commits_before_a_revoke(queue_topics, bootstrap, kafka_client):
    # What the tracker needs of the seam, on each client: committed offsets, seeks, positions, a
    # synchronous commit, and a commit made inside the revoke (here: the one close() triggers).
    cfg, q = queue_topics(partitions=2, kafka={"client": kafka_client})
    p = clients.producer(cfg.kafka)
    for i in range(10):
        p.send(q.name, value=b"v%d" % i, partition=0)
    p.flush()
    p.close()
    group = cfg.tracker.group_id
    both = {(q.name, 0), (q.name, 1)}
    events: list = []  # (what, partitions); kafka-python also calls on_revoked with none at its first join
    failures: list = []
    c = group_consumer(cfg.kafka, group, "RANGE", 100, fetch_wait=0.05, metadata_max_age=30.0,
                       max_poll_interval=300.0)
    c.subscribe([q.name], lambda parts: events.append(("assigned", parts)), lambda parts: events.append(("revoked", parts)),
                commit_on_revoke=lambda parts: events.append(("commit", parts)) or {(q.name, 0): 8},
                on_commit_failed=failures.append)
    closed = False
    try:
        wait_until(lambda: c.fetch(0.1, 100) is not None and c.assignment() == both, 30, what="assignment")
        assert [e for e in events if e[1]] == [("assigned", both)]
        assert c.committed(both) == {(q.name, 0): None, (q.name, 1): None}
        c.seek_to_beginning(both)
        assert (c.position(q.name, 0), c.position(q.name, 1)) == (0, 0)
        c.seek(q.name, 0, 4)
        assert c.position(q.name, 0) == 4
        got: list[Record] = []
        wait_until(lambda: got.extend(c.fetch(0.2, 100)) or len(got) >= 6, 30, what="records from offset 4")
        assert [(r.partition, r.offset) for r in got] == [(0, o) for o in range(4, 10)]
        assert c.position(q.name, 0) == 10
        c.commit({(q.name, 0): 6})
        assert c.committed(both) == {(q.name, 0): 6, (q.name, 1): None}
        c.close()
        closed = True
        assert [e for e in events if e[1]][1:] == [("commit", both), ("revoked", both)] and failures == []
        assert committed(bootstrap, group, q.name) == {0: 8}
    finally:
        if not closed:
            c.close()
