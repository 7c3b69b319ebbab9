"""consumer.max_poll_interval: an application that stops taking messages gives its partitions to
the rest of the group (as a Kafka consumer not polled for max.poll.interval.ms leaves it), and
joins again when it takes again; a kmq.share.ShareConsumer dropped without close() leaves too."""

from __future__ import annotations

import gc
import logging
import time

import pytest

from kmq.consumer.consumer import KmqConsumer
from kmq.core.markers import Nack
from kmq.telemetry.metrics import ConsumerMetrics
from tests.helpers.kafka import produce, wait_until
from tests.helpers.workers import markers_by_partition

pytestmark = pytest.mark.integration

INTERVAL = 3.0
#: What a rebalance may take on top of the interval: the stalled member's close (its commit back may
#: wait for a rebalance in progress: two session timeouts at most), then the healthy member's join.
REBALANCE = 3 * 6.0 + 10.0


def _exceeded(consumer: KmqConsumer) -> float:
    return consumer.metrics.registry.get_sample_value(
        "kmq_consumer_poll_interval_exceeded_total", {"queue": consumer.queue.name}) or 0.0


def test_a_stalled_application_gives_its_partitions_to_a_healthy_member_and_rejoins_when_it_polls_again(
        queue_topics, bootstrap, kafka_client, caplog):
    cfg, q = queue_topics(partitions=2, consumer={"ack_flush_interval": "50ms", "max_poll_interval": f"{INTERVAL:g}s",
                                                  "max_in_flight_per_partition": 200},
                          kafka={"client": kafka_client})
    produce(cfg, q.name, 400, keys=b"%d", partitions=2)
    stalled = KmqConsumer(cfg, queue=q.name, batch_size=10, metrics=ConsumerMetrics())  # a registry each
    healthy = KmqConsumer(cfg, queue=q.name, batch_size=10, metrics=ConsumerMetrics())
    acked: dict[tuple[int, int], str] = {}
    deliveries: list = []

    def take(c: KmqConsumer, who: str) -> None:
        for m in c.poll(timeout=0.1):
            deliveries.append(m)
            acked[(m.partition, m.offset)] = who
            m.ack()

    try:
        # Both take and hold what they get until each has taken messages (with nothing settled, flow
        # control keeps each at one batch, so neither drains the topic before the other joins).
        held: list = []

        def hold(c: KmqConsumer, who: str) -> None:
            for m in c.poll(timeout=0.1):
                deliveries.append(m)
                held.append((m, who))

        wait_until(lambda: hold(stalled, "stalled") or hold(healthy, "healthy")
                   or {who for _, who in held} == {"stalled", "healthy"}, 60, what="both members taking messages")
        for m, who in held:
            acked[(m.partition, m.offset)] = who
            m.ack()
        # From now on the stalled member's application takes nothing, with messages fetched for it.
        stalled_at = time.monotonic()
        first = list(acked.values()).count("stalled")
        wait_until(lambda: take(healthy, "healthy") or stalled.in_flight(), 30, what="messages ready on the stalled member")
        # The healthy member takes everything else: the stalled member's partition comes to it past the interval.
        with caplog.at_level(logging.WARNING, logger="kmq.consumer.consumer"):
            try:
                wait_until(lambda: take(healthy, "healthy") or len(acked) >= 400, INTERVAL + REBALANCE,
                           what="every message acked by the healthy member past the stalled one's interval")
            except AssertionError as exc:
                by: dict = {}
                for (p, o), who in acked.items():
                    by.setdefault((p, who), []).append(o)
                raise AssertionError(f"{exc}: acked {[(k, len(v), min(v), max(v)) for k, v in sorted(by.items())]}; "
                                     f"healthy holds {healthy._pipeline.owned}, in flight {healthy.in_flight()}; "
                                     f"stalled in flight {stalled.in_flight()}") from None
        assert time.monotonic() - stalled_at >= INTERVAL  # not before the interval: a message was its own
        assert _exceeded(stalled) == 1 and _exceeded(healthy) == 0
        assert any("consumer.max_poll_interval" in r.getMessage() and "gives its partitions" in r.getMessage()
                   for r in caplog.records)
        assert list(acked.values()).count("stalled") == first > 0
        assert {m.delivery_count for m in deliveries} == {1}  # given back by a commit back: no copy

        # The stalled member polls again: it joins the group again and gets work.
        wait_until(lambda: take(stalled, "stalled") or take(healthy, "healthy") or stalled._pipeline.owned,
                   REBALANCE, what="the stalled member holding a partition again")
        produce(cfg, q.name, 200, keys=b"%d", partitions=2)
        wait_until(lambda: take(stalled, "stalled") or take(healthy, "healthy") or len(acked) >= 600, REBALANCE,
                   what="600 messages acked")
        assert list(acked.values()).count("stalled") > first
        stalled.writer.flush()
        healthy.writer.flush()
        markers = markers_by_partition(bootstrap, q.markers_topic)
    finally:
        healthy.close()
        stalled.close()
    keys = [(m.partition, m.offset) for m in deliveries]
    assert len(keys) == len(set(keys)) == 600  # each message handed exactly once: nothing lost, none twice
    assert {m.delivery_count for m in deliveries} == {1}
    assert not [m for ms in markers.values() for m in ms if isinstance(m, Nack)]


def test_a_share_consumer_dropped_without_close_leaves_its_group(queue_topics, bootstrap, kafka_client):
    from kmq.share import ShareConsumer

    cfg, q = queue_topics(partitions=2, kafka={"client": kafka_client})
    produce(cfg, q.name, 200, keys=b"%d", partitions=2)
    conf = {"bootstrap.servers": bootstrap, "group.id": cfg.consumer.group_id, "kmq.kafka.client": kafka_client,
            "kmq.session.timeout.ms": 6000, "kmq.heartbeat.interval.ms": 1000, "max.poll.records": 10}
    got: dict[tuple[int, int], int] = {}

    def take(c: ShareConsumer) -> None:
        for m in c.poll(timeout=0.1):
            got[(m.partition(), m.offset())] = m.kmq_message.delivery_count

    dropped = ShareConsumer(conf)
    dropped.subscribe([q.name])
    wait_until(lambda c=dropped: take(c) or got, 30, what="the first member's first records")
    dropped.commit_sync()  # what it returned is accepted; the rest it fetched was never returned
    first = dict(got)
    queue = dropped.kmq_consumer
    del dropped
    gc.collect()
    wait_until(lambda: queue._closed and not queue._fetcher.is_alive(), 30, what="the dropped consumer closed")
    # The default max.poll.interval.ms (5 min) is far away: only the close gives the partitions up.
    with ShareConsumer(conf) as second:
        second.subscribe([q.name])
        wait_until(lambda: take(second) or len(got) >= 200, REBALANCE, what="every record returned")
    assert set(got) == {(p, o) for p in range(2) for o in range(100)} and set(first) < set(got)
    assert set(got.values()) == {1}

