"""KmqConsumer's fetcher thread (the fetch pipeline's I/O shell) against a fake Kafka client at
the client seam (:class:`kmq.client.api.GroupConsumerAdapter`) and a fake marker writer: no broker."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from kmq.client.api import Delivery
from kmq.config import Config
from kmq.consumer.consumer import KmqConsumer
from kmq.core.errors import AuthorizationFailed
from kmq.core.markers import End, Nack
from tests.helpers.consumer_shell import TOPIC, FakeClients, FakeKafka, FakeWriter
from tests.helpers.kafka import wait_until


class StartsAnsweredLater(FakeWriter):
    """STARTs are answered when the test answers their futures (kept in :attr:`starts`)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.starts: list[Delivery] = []

    def send_starts(self, offsets: dict) -> list:
        sent = [(p, list(o), Delivery()) for p, o in offsets.items()]
        self.starts.extend(f for _, _, f in sent)
        return sent


class WaitsOnlyForWake(FakeKafka):
    """A client whose wait for records ends when the fetcher's ``wake`` is set, not at its timeout
    (kafka-python's short waits are taken so): the fetcher must be woken by the answers it awaits."""

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = None, wake=None) -> list:
        if self._on_assigned is None and self.position_at >= len(self._records):
            assert wake is not None, "the fetcher gives the client no event to wait on"
            wake.wait(60)
            return []
        return super().fetch(timeout, max_records, build, wake)


@pytest.mark.parametrize("hand_over", ["committed", "started"])
def test_an_answered_start_wakes_a_fetcher_waiting_in_the_client(consumer_on, hand_over):
    kafka = WaitsOnlyForWake(records=10)
    consumer = consumer_on(kafka, hand_over=hand_over, writer=StartsAnsweredLater)
    writer = consumer.writer
    assert consumer.poll(timeout=0.2) == []  # starts the fetcher; nothing is handed over before its START is answered
    wait_until(lambda: writer.starts, 10, what="the START of the first batch")
    for f in writer.starts:
        f.success(None)
    got: list = []
    # Without the wake, the fetcher would sit in the client's wait for 60 s.
    wait_until(lambda: got.extend(consumer.poll(timeout=0.1)) or len(got) >= 10, 10, what="the batch handed over")
    assert [m.offset for m in got] == list(range(10))


def test_close_closes_the_kafka_consumer_even_when_the_commit_back_and_its_rebalance_poll_fail(consumer_on):
    kafka = FakeKafka(records=5)
    committed = threading.Event()
    consumer = consumer_on(kafka, stage_hook=lambda stage, spans: stage == "committed" and committed.set())
    assert [m.offset for m in consumer.poll(timeout=5, max_records=1)] == [0]
    assert committed.wait(5)  # offsets 1..4 committed and ready, never handed
    kafka.fail_commit = True  # the commit-back is refused (a rebalance in progress) ...
    kafka.fail_pause = True  # ... and so is the poll that would let the rebalance complete
    consumer.close(timeout=5)
    assert kafka.closed.wait(5), "the Kafka consumer was left open: it keeps its partitions until max.poll.interval"
    # The commit-back failed: the committed, never-handed messages come back through the tracker.
    nacked = [tuple(r) for m in consumer.writer.flushed if isinstance(m, Nack) for r in m.ranges]
    assert nacked == [(1, 4)]


def test_leaving_iteration_early_leaves_the_rest_ready_and_close_commits_it_back(consumer_on):
    kafka = FakeKafka(records=20)
    consumer = consumer_on(kafka)
    for msg in consumer:
        msg.ack()
        break
    rest = []
    wait_until(lambda: rest.extend(consumer.poll(timeout=0.1)) or len(rest) >= 19, 10, what="the other 19")
    assert sorted(m.offset for m in rest) == list(range(1, 20))
    rest[5].ack()
    consumer.close(timeout=5)
    assert kafka.commits[-1] == {(TOPIC, 0): 20}  # nothing never-handed is left to give back
    assert consumer.in_flight() == {0: 18}  # taken and unsettled: user code's, until their leases end


def test_a_revocation_hands_off_the_leases_of_ready_messages_and_of_a_batch_between_start_and_commit(consumer_on):
    # The revoke callback (kafka-python: on the client's I/O thread) runs while the fetcher holds a
    # second batch whose START was acknowledged and whose offsets are not committed yet.
    kafka = FakeKafka(records=10)
    hold, held = threading.Event(), threading.Event()

    def hook(stage: str, spans: dict) -> None:
        if stage == "started" and spans.get(0, (0, 0))[0] >= 5:
            held.set()
            hold.wait(10)

    consumer = consumer_on(kafka, fetch_size=5, stage_hook=hook)
    try:
        assert [m.offset for m in consumer.poll(timeout=5, max_records=1)] == [0]
        assert held.wait(5), "the second batch never reached its START"
        rewind = consumer._step._commit_on_revoke({(TOPIC, 0)})
        assert rewind == {(TOPIC, 0): 1}  # committed back to the first ready message
        # One hand-off, before that commit: the ready messages 1..4 and the pending batch 5..9.
        assert [{p: sorted(o) for p, o in h.items()} for h in consumer.writer.handed_off] == [{0: list(range(1, 10))}]
        consumer._step._revoked({(TOPIC, 0)})
    finally:
        hold.set()


def test_hand_over_started_hands_over_before_the_commit_and_close_commits_what_user_code_took(consumer_on):
    kafka = FakeKafka(records=10)
    kafka.hang_commits = True  # no commit is ever answered: only closing can commit
    consumer = consumer_on(kafka, hand_over="started")
    got: list = []
    wait_until(lambda: got.extend(consumer.poll(timeout=0.1)) or len(got) >= 10, 10, what="10 messages")
    assert [m.offset for m in got] == list(range(10)) and kafka.commits == []
    for m in got:
        m.ack()
    consumer.close(timeout=5)
    assert kafka.commits == [{(TOPIC, 0): 10}]  # committed on, or the group would deliver them again


def test_hand_over_started_a_revocation_commits_handed_messages_on_without_handing_off_their_leases(consumer_on,
                                                                                                      caplog):
    kafka = FakeKafka(records=10)
    kafka.hang_commits = True
    consumer = consumer_on(kafka, hand_over="started", fetch_size=5)
    got: list = []
    wait_until(lambda: got.extend(consumer.poll(timeout=0.1)) or len(got) >= 10, 10, what="10 messages")
    rewind = consumer._step._commit_on_revoke({(TOPIC, 0)})
    assert rewind == {(TOPIC, 0): 10}  # on past what user code took; nothing to give back
    assert consumer.writer.handed_off == []  # user code keeps their leases: no hand-off RENEW
    consumer._step._commit_back_failed(RuntimeError("fenced"))  # that commit failed: the cost is said
    assert "up to offset {0: 10}) may be delivered again" in caplog.text
    consumer._step._revoked({(TOPIC, 0)})


class GroupConsumersInTurn(FakeClients):
    """A new group consumer each time KmqConsumer asks for one (a member that left and joins again)."""

    def __init__(self, *kafkas: Any) -> None:
        super().__init__(None)
        self._kafkas = iter(kafkas)

    def group_consumer(self, kafka, group_id, assignor, max_records, **overrides) -> Any:
        return next(self._kafkas)


def test_an_application_that_stops_taking_gives_its_partition_back_and_joins_again_when_it_takes():
    first, again = FakeKafka(records=5), FakeKafka(records=5)
    again.position_at = 1  # the group's committed offset after the first member gave 1..4 back
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:9", "session_timeout": "1s"},
                            "queues": [{"name": TOPIC}], "consumer": {"group_id": "g", "max_poll_interval": "1s"}})
    committed = threading.Event()
    consumer = KmqConsumer(cfg, writer=FakeWriter(cfg), clients=GroupConsumersInTurn(first, again),
                           stage_hook=lambda stage, spans: stage == "committed" and committed.set())
    try:
        held = consumer.poll(timeout=5, max_records=1)
        assert [m.offset for m in held] == [0]
        assert committed.wait(5)  # 1..4 ready, and the application takes nothing more
        assert first.closed.wait(10), "the stalled member stayed in the group"
        # Given back as a close does: leases handed off, the offset committed back to the first never handed.
        assert consumer.writer.handed_off == [{0: [1, 2, 3, 4]}] and first.commits[-1] == {(TOPIC, 0): 1}
        assert consumer.metrics.registry.get_sample_value(
            "kmq_consumer_poll_interval_exceeded_total", {"queue": TOPIC}) == 1
        held[0].ack()  # a message in user code is still settled by this member
        got: list = []
        wait_until(lambda: got.extend(consumer.poll(timeout=0.1)) or len(got) >= 4, 10, what="work after the rejoin")
        assert [m.offset for m in got] == [1, 2, 3, 4] and not again.closed.is_set()
    finally:
        consumer.close(timeout=5)
    ended = {o for m in consumer.writer.flushed if isinstance(m, End) for r in m.ranges for o in r.offsets()}
    assert 0 in ended


class FailsToFetch(FakeKafka):
    """A client whose fetch raises ``error``: kmq's error from an adapter, or a bug."""

    def __init__(self, error: Exception) -> None:
        super().__init__(records=0)
        self.error = error

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = None, wake=None) -> list:
        raise self.error


@pytest.mark.parametrize("error, a_bug", [(AuthorizationFailed("Kafka denied user 'svc' a topic operation"), False),
                                          (ZeroDivisionError("a bug"), True)])
def test_a_failed_fetch_reaches_the_application_as_it_is_and_only_a_bug_is_logged_with_its_traceback(
        consumer_on, caplog, error, a_bug):
    consumer = consumer_on(FailsToFetch(error))
    with pytest.raises(type(error)) as got:
        consumer.poll(timeout=5)
    assert got.value is error
    tracebacks = [r for r in caplog.records if r.exc_info and "the fetch loop" in r.getMessage()]
    assert bool(tracebacks) == a_bug
