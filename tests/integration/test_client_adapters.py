"""The consumer adapters of the client seam on the real broker, both clients:
poll as Records, commit of explicit offsets, seek, pause/resume, high-water marks."""

from __future__ import annotations

import pytest

from kmq.client.kafka_python import clients
from kmq.client import Record, adapt_consumer
from tests.helpers.kafka import wait_until
from tests.helpers.workers import committed

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
        p.send(q.name, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2, headers=[("h", b"1")], timestamp_ms=1_700_000_000_000 + i)
    p.flush()
    p.close()
    a = adapt_consumer(_consumer(client, cfg, q.name))
    try:
        got: list[Record] = []
        wait_until(lambda: got.extend(a.poll(0.5, 100)) or len(got) >= 20, 30, what="all records")
        assert a.assignment() == {(q.name, 0), (q.name, 1)}
        r = next(x for x in got if x.partition == 1 and x.offset == 3)
        assert (r.key, r.value, list(r.headers), r.timestamp) == (b"k7", b"v7", [("h", b"1")], 1_700_000_000_007)
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
