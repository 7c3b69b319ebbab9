"""Closing gives back what user code never handled without counting a delivery.

A service that restarts often closes its consumers again and again; a record that was fetched,
never handled and given back by ``close()`` must come back with the delivery count it had, else
such a service dead-letters records no handler ever saw.
Each test restarts a consumer a few times with records it was given and did not handle, against
a real broker and a real tracker, then reads every record once more: each has its first delivery
count, and nothing reached the DLQ.
"""

from __future__ import annotations

import pytest

import kmq.share
from kmq.client.kafka_python import clients
from kmq.consumer.consumer import KmqConsumer
from tests.helpers.kafka import produce, read_all, wait_until
from tests.integration.tracker_util import metric, running_tracker

pytestmark = pytest.mark.integration

RESTARTS = 3
N = 12


def _settings(kafka_client: str, ordering: str = "none") -> dict:
    return {"queue": {"lease": "30s", "max_deliveries": 2, "backoff": {"initial": "100ms"}},
            "consumer": {"ack_flush_interval": "50ms", "ordering": ordering}, "kafka": {"client": kafka_client}}


def _drain_all(cfg, queue: str, tracker, expect: int) -> dict[bytes, int]:
    """The ``expect`` messages of ``queue`` not acked yet, handled by a fresh consumer and acked:
    value -> delivery count, once the tracker holds nothing open (so no copy is on its way)."""
    seen: dict[bytes, int] = {}
    with KmqConsumer(cfg, queue=queue) as c:
        def take() -> bool:
            for m in c.poll(timeout=0.2):
                seen[m.value] = max(seen.get(m.value, 0), m.delivery_count)
                m.ack()
            return len(seen) >= expect and metric(tracker.http_port, "kmq_tracker_in_flight", queue=queue) == 0
        wait_until(take, 60, what=f"{expect} messages once more, the tracker holding nothing open")
    return seen


def _one(consumer: KmqConsumer, handled: set[bytes], more=None) -> None:
    """Hand out one message of ``consumer`` (its fetch then runs on) and ack it; ``more()``
    produces a message per partition before each try (a new member owns only what its
    partition gets after the others fetched everything before it joined)."""
    def take() -> list:
        if more is not None:
            more()
        return consumer.poll(timeout=0.5, max_records=1)
    got = wait_until(take, 60, what="a message")
    assert got[0].delivery_count == 1, f"{got[0].value!r} came back as delivery {got[0].delivery_count}"
    handled.add(got[0].value)
    got[0].ack()


@pytest.mark.parametrize("ordering", ["none", "key"])
def test_a_rolling_restart_keeps_the_delivery_count_of_messages_no_handler_took(
        queue_topics, bootstrap, kafka_client, ordering):
    # Members fetch more than their handlers take. A new member joins (a partition moves to it),
    # then the old one stops, over and over. With ordering: key a revoked partition's fetched,
    # never-handed messages stay with the old member (the new owner would hold their keys), and
    # its close could only nack them: a copy with delivery count + 1 at every restart.
    cfg, q = queue_topics(partitions=2, **_settings(kafka_client, ordering))
    produce(cfg, q.name, N * 2, keys=b"%d", partitions=2)
    produced = [N * 2]
    handled: set[bytes] = set()

    def more() -> None:  # keys of their own: with ordering: key a key the old member holds waits
        p = clients.producer(cfg.kafka)
        for partition in (0, 1):
            p.send(q.name, key=b"k%d" % produced[0], value=b"r%d" % produced[0], partition=partition)
            produced[0] += 1
        p.flush()
        p.close()

    with running_tracker(cfg) as tracker:
        old = KmqConsumer(cfg, queue=q.name)
        try:
            _one(old, handled)
            for _ in range(RESTARTS):
                new = KmqConsumer(cfg, queue=q.name)
                try:
                    _one(new, handled, more)  # the rebalance moved a partition to it
                finally:
                    old.close()
                    old = new
        finally:
            old.close()
        seen = _drain_all(cfg, q.name, tracker, produced[0] - len(handled))
    fresh = {v: n for v, n in seen.items() if v not in handled}
    counted = {v: n for v, n in fresh.items() if n != 1}
    assert fresh and not counted, f"delivery counts above 1 after {RESTARTS} restarts: {counted}"
    assert read_all(bootstrap, q.dlq_topic, timeout=2) == []


@pytest.mark.parametrize("mode", ["implicit", "explicit"])
def test_share_consumer_closed_with_a_batch_in_hand_keeps_its_delivery_count(
        queue_topics, bootstrap, kafka_client, mode):
    # close() releases the records of the last poll that were not acknowledged (implicit mode: all
    # of them). kmq nacked them (count + 1 per restart, so a restart loop uses up max_deliveries on
    # records nobody acknowledged); now they keep their delivery count.
    cfg, q = queue_topics(partitions=1, **_settings(kafka_client))
    produce(cfg, q.name, N, keys=b"%d")
    conf = {"bootstrap.servers": bootstrap, "group.id": cfg.consumer.group_id, "share.acknowledgement.mode": mode,
            "max.poll.records": 4, "kmq.session.timeout.ms": 6000, "kmq.heartbeat.interval.ms": 1000,
            "kmq.kafka.client": kafka_client, "kmq.lease.ms": 30000, "kmq.ack.flush.interval.ms": 50}
    with running_tracker(cfg) as tracker:
        for _ in range(RESTARTS):
            with kmq.share.ShareConsumer(conf) as c:
                c.subscribe([q.name])
                batch = wait_until(lambda: list(c.poll(0.5)), 30, what="a batch")
                assert {m.delivery_count() for m in batch} == {1}, [(m.value(), m.delivery_count()) for m in batch]
        seen = _drain_all(cfg, q.name, tracker, N)
    assert set(seen.values()) == {1}, f"delivery counts after {RESTARTS} restarts: {seen}"
    assert read_all(bootstrap, q.dlq_topic, timeout=2) == []
