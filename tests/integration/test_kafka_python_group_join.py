"""A kafka-python group join that finishes between two polls is kept, not thrown away."""

from __future__ import annotations

import time

import pytest
from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.errors import MemberIdRequiredError
from kafka.structs import MemberState, OffsetAndMetadata, TopicPartition

from kmq.client.kafka_python import clients
from tests.helpers.kafka import wait_until

pytestmark = pytest.mark.integration


def _short_polls_until_a_join_is_in_flight(consumer: KafkaConsumer):
    """Zero-timeout polls until one leaves its JoinGroup in flight (a poll that waits may see a fast
    broker finish the join inside it). The first polls only start finding the group coordinator."""
    coordinator = consumer._coordinator
    deadline = time.monotonic() + 30
    while True:
        assert consumer.poll(timeout_ms=0, update_offsets=False) == {}
        if coordinator._join_task is not None:
            return coordinator._join_task
        assert coordinator.need_rejoin(), "the join finished inside one zero-timeout poll: nothing was left in flight"
        assert time.monotonic() < deadline, "no poll sent a JoinGroup in 30 s (coordinator never found?)"
        time.sleep(0.005)


def _join_between_polls(consumer: KafkaConsumer) -> tuple[int, str]:
    """Start a join with short polls, then let it finish on the I/O thread with no poll waiting.
    (A first JoinGroup may only hand out a member id, or meet a coordinator still loading; a later
    poll sends another.)"""
    coordinator = consumer._coordinator
    failed = []
    deadline = time.monotonic() + 30  # a new broker answers NOT_COORDINATOR until its group topic is up
    while time.monotonic() < deadline:
        task = _short_polls_until_a_join_is_in_flight(consumer)
        wait_until(lambda task=task: task.is_done, timeout=30, what="the join to finish on the I/O thread")
        if task.succeeded():
            gen = coordinator._generation
            return gen.generation_id, gen.member_id
        assert isinstance(task.exception, MemberIdRequiredError) or task.exception.retriable, task.exception
        failed.append(task.exception)
        time.sleep(0.1)
    raise AssertionError(f"no join succeeded in 30 s: {failed[:5]} ... ({len(failed)} rounds)")


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
        consumer.poll(timeout_ms=0, update_offsets=False)
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
        consumer.poll(timeout_ms=0, update_offsets=False)
        gen = consumer._coordinator._generation
        kept = bool(consumer.assignment()) and (gen.generation_id, gen.member_id) == joined
        assert not kept, "kafka-python kept the finished join by itself"
    finally:
        consumer.close()


def _stable_with(consumer: KafkaConsumer, partitions: set[int]) -> bool:
    """One zero-timeout poll (kmq's fetcher polls so when it waits on its own wake event), then
    whether the member is stable in its group holding exactly ``partitions``."""
    consumer.poll(timeout_ms=0, update_offsets=False)
    time.sleep(0.01)  # the work a real loop does between polls
    return (consumer._coordinator.state is MemberState.STABLE
            and {tp.partition for tp in consumer.assignment()} == partitions)


def test_a_leader_whose_topic_grew_rejoins_and_settles_between_zero_timeout_polls(queue_topics, skip_on_tansu):
    """kafka-python 3.0 rejoins on the leader's metadata change without asking for a rejoin (the rule
    KAFKA-9815 fixed in the Java client): once the new assignment is made, no poll completes the join,
    and the member stays REBALANCING, every commit refused. Seen as a lone worker stuck for minutes on
    Apache Kafka after its second join."""
    skip_on_tansu("CreatePartitions is not supported, so a topic cannot grow")
    from kafka.admin import NewPartitions

    cfg, q = queue_topics(partitions=1)
    consumer = clients.consumer(cfg.kafka, group_id=cfg.consumer.group_id, metadata_max_age_ms=300)
    try:
        consumer.subscribe([q.name])
        wait_until(lambda: _stable_with(consumer, {0}), 30, interval=0, what="the first join to settle")
        admin = clients.admin_client(cfg.kafka)
        try:
            admin.create_partitions({q.name: NewPartitions(2)})
        finally:
            admin.close()
        wait_until(lambda: _stable_with(consumer, {0, 1}), 30, interval=0,
                   what="the rejoin after the topic grew to settle with both partitions")
        consumer.commit({TopicPartition(q.name, 1): OffsetAndMetadata(0, "", -1)})  # raises if not in the group
    finally:
        consumer.close()

