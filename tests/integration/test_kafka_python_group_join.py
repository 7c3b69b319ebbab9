"""A kafka-python group join that finishes between two polls is kept, not thrown away."""

from __future__ import annotations

import time

import pytest
from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.errors import MemberIdRequiredError

from kmq.client.kafka_python import clients
from tests.helpers.kafka import wait_until

pytestmark = pytest.mark.integration


def _short_polls_until_a_join_is_in_flight(consumer: KafkaConsumer):
    """10 ms polls until one leaves its JoinGroup in flight. On a loaded machine the first polls may
    spend their 10 ms finding the group coordinator, before any JoinGroup is sent."""
    coordinator = consumer._coordinator
    deadline = time.monotonic() + 30
    while True:
        assert consumer.poll(timeout_ms=10, update_offsets=False) == {}
        if coordinator._join_task is not None:
            return coordinator._join_task
        assert coordinator.need_rejoin(), "the join finished inside one 10 ms poll: nothing was left in flight"
        assert time.monotonic() < deadline, "no 10 ms poll sent a JoinGroup in 30 s (coordinator never found?)"


def _join_between_polls(consumer: KafkaConsumer) -> tuple[int, str]:
    """Start a join with short polls, then let it finish on the I/O thread with no poll waiting.
    (A first JoinGroup may only hand out a member id; the next poll sends the real one.)"""
    coordinator = consumer._coordinator
    for _ in range(3):
        task = _short_polls_until_a_join_is_in_flight(consumer)
        wait_until(lambda: task.is_done, timeout=30, what="the join to finish on the I/O thread")
        if task.succeeded():
            gen = coordinator._generation
            return gen.generation_id, gen.member_id
        assert isinstance(task.exception, MemberIdRequiredError), task.exception
    raise AssertionError("no join succeeded in three rounds")


def test_a_join_that_finished_between_polls_is_kept_by_the_next_short_poll(queue_topics):
    cfg, q = queue_topics(partitions=2)
    assigned: list[set] = []

    class Listener(ConsumerRebalanceListener):
        def on_partitions_assigned(self, tps):
            assigned.append({tp.partition for tp in tps})

        def on_partitions_revoked(self, tps):
            pass

    consumer = clients.consumer(cfg.kafka, group_id=cfg.consumer.group_id)
    try:
        consumer.subscribe([q.name], listener=Listener())
        joined = _join_between_polls(consumer)
        consumer.poll(timeout_ms=10, update_offsets=False)
        # Without the workaround this poll sends a second JoinGroup and holds nothing for another join.
        assert {tp.partition for tp in consumer.assignment()} == {0, 1}
        assert assigned == [{0, 1}]
        gen = consumer._coordinator._generation
        assert (gen.generation_id, gen.member_id) == joined
        assert consumer._coordinator._join_task is None
    finally:
        consumer.close()


def test_a_plain_kafka_python_consumer_still_throws_the_finished_join_away(queue_topics, bootstrap):
    """The defect the workaround exists for, shown on a consumer kmq did not build: if this starts
    failing, kafka-python fixed it and :mod:`kmq.client.kafka_python.group_join` can go."""
    cfg, q = queue_topics(partitions=1)
    consumer = KafkaConsumer(q.name, bootstrap_servers=bootstrap, group_id=cfg.consumer.group_id,
                             enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=1000)
    try:
        joined = _join_between_polls(consumer)
        consumer.poll(timeout_ms=10, update_offsets=False)
        gen = consumer._coordinator._generation
        kept = bool(consumer.assignment()) and (gen.generation_id, gen.member_id) == joined
        assert not kept, "kafka-python kept the finished join by itself"
    finally:
        consumer.close()
