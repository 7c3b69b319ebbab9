"""kmq.testing: a queue in memory whose consumers and tracker are kmq's own, on a virtual clock.

Each assertion kind a user's test makes (acks, nacks with a delay, rejects, dead letters,
delivery counts) through each consumer API (``KmqConsumer.run``, iteration and ``poll``,
``kmq.aio``, ``kmq.share.ShareConsumer``); waits of minutes of virtual time finish in
milliseconds of real time.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from kmq.client.parts import ClientFactory
from kmq.config import Config
from kmq.core.errors import TopicMissing
from kmq.share import AcknowledgeType
from kmq.testing import DeadLetter, TestQueue, TestQueueError


class BadPayload(Exception):
    pass


@pytest.fixture
def queue():
    with TestQueue("orders", max_deliveries=3) as q:
        yield q


def test_run_acks_what_the_handler_returns_from(queue):
    for n in range(3):
        queue.produce(b"order-%d" % n, key=b"k%d" % n)
    seen = []
    queue.run(lambda msg: seen.append((msg.value, msg.delivery_count)))
    assert sorted(seen) == [(b"order-0", 1), (b"order-1", 1), (b"order-2", 1)]
    assert sorted(queue.acked) == [b"order-0", b"order-1", b"order-2"]
    assert queue.nacked == [] and queue.rejected == [] and queue.dead_letters == []
    assert queue.now == 0.0  # nothing made the clock move


def test_reject_on_dead_letters_with_the_exception_as_the_error(queue):
    queue.produce(b"order-1")
    queue.produce(b"bad")

    def handle(msg):
        if msg.value == b"bad":
            raise BadPayload("no price")

    queue.run(handle, reject_on=BadPayload)
    assert queue.acked == [b"order-1"]
    assert [(r.value, r.reason) for r in queue.rejected] == [(b"bad", "BadPayload: no price")]
    [dead] = queue.dead_letters
    assert isinstance(dead, DeadLetter)
    assert (dead.value, dead.reason, dead.error, dead.delivery_count) == (b"bad", "rejected", "BadPayload: no price", 1)
    assert dead.origin == "orders/0/1"


def test_a_nack_delay_is_served_on_the_virtual_clock(queue):
    queue.produce(b"later")

    def handle(msg):
        if msg.delivery_count == 1:
            msg.nack(delay=300)

    began = time.monotonic()
    queue.run(handle)
    assert [(n.value, n.delay, n.message.delivery_count) for n in queue.nacked] == [(b"later", 300.0, 1)]
    queue.advance(299.0)
    assert queue.delivery_counts(b"later") == [1]  # not yet due
    queue.advance(1.0)
    assert queue.delivery_counts(b"later") == [1, 2]  # the tracker's copy, one delivery more
    queue.run(handle)
    assert queue.acked == [b"later"]
    assert queue.now == 300.0
    assert time.monotonic() - began < 10.0  # five virtual minutes, not five real ones


def test_max_deliveries_ends_in_the_dlq_after_the_queue_backoff(queue):
    queue.produce(b"poison")

    def handle(msg):
        raise RuntimeError("database down")

    queue.run_until_settled(handle)
    assert queue.delivery_counts(b"poison") == [1, 2, 3]
    assert [n.delay for n in queue.nacked] == [1.0, 2.0, 4.0]  # the queue's backoff: initial 1s, doubling
    [dead] = queue.dead_letters
    assert (dead.value, dead.reason, dead.delivery_count) == (b"poison", "nack-limit", 3)
    assert queue.acked == []
    assert queue.now == pytest.approx(7.0)


def test_run_for_seconds_handles_redeliveries_as_they_fall_due(queue):
    queue.produce(b"flaky")
    calls = []

    def handle(msg):
        calls.append((msg.delivery_count, queue.now))
        if msg.delivery_count < 3:
            raise RuntimeError("try again")

    queue.run(handle, for_seconds=60.0)
    assert calls == [(1, 0.0), (2, 1.0), (3, 3.0)]
    assert queue.acked == [b"flaky"]
    assert queue.now == 60.0


def test_iteration_poll_and_a_lapsed_lease(queue):
    queue.produce(b"held")
    queue.produce(b"acked")
    with queue.consumer() as consumer:
        got = {}
        while len(got) < 2:
            for msg in consumer.poll(timeout=5.0):
                got[msg.value] = msg
        got[b"acked"].ack()
        queue.advance(31.0)  # past the 30 s lease of the message held without a settlement
        copy = next(m for m in consumer if m.value == b"held")
        assert copy.delivery_count == 2
        copy.ack()
    assert sorted(queue.acked) == [b"acked", b"held"]
    assert queue.delivery_counts(b"held") == [1, 2]


def test_asyncio_consumer(queue):
    queue.produce(b"a")
    queue.produce(b"b")
    queue.produce(b"c")

    async def consume():
        async with queue.async_consumer() as consumer:
            n = 0
            async for msg in consumer:
                if msg.value == b"a":
                    await msg.ack()
                elif msg.value == b"b":
                    await msg.nack(delay=10)
                else:
                    await msg.reject("unreadable")
                n += 1
                if n == 3:
                    break

    asyncio.run(consume())
    queue.settle()
    assert queue.acked == [b"a"]
    assert [(n.value, n.delay) for n in queue.nacked] == [(b"b", 10.0)]
    assert [(d.value, d.error) for d in queue.dead_letters] == [(b"c", "unreadable")]
    queue.advance(10.0)
    assert queue.delivery_counts(b"b") == [1, 2]


def test_share_consumer_accept_release_reject(queue):
    for v in (b"accept", b"release", b"reject"):
        queue.produce(v)
    consumer = queue.share_consumer({"share.acknowledgement.mode": "explicit"})
    consumer.subscribe([queue.queue.name])
    kinds = {b"accept": AcknowledgeType.ACCEPT, b"release": AcknowledgeType.RELEASE,
             b"reject": AcknowledgeType.REJECT}
    seen = 0
    while seen < 3:
        for msg in consumer.poll(timeout=5.0):
            consumer.acknowledge(msg, kinds[msg.value()])
            seen += 1
    consumer.commit_sync()
    queue.settle()  # RELEASE is nack(0): redelivered at once, no clock move needed
    assert queue.acked == [b"accept"]
    assert [n.value for n in queue.nacked] == [b"release"]
    assert [d.value for d in queue.dead_letters] == [b"reject"]
    again = []
    while not again:
        again = consumer.poll(timeout=5.0)
    assert [(m.value(), m.delivery_count()) for m in again] == [(b"release", 2)]
    consumer.acknowledge(again[0], AcknowledgeType.ACCEPT)
    consumer.close()
    assert queue.acked == [b"accept", b"release"]


def test_keyed_messages_spread_over_partitions_are_each_acked_once():
    with TestQueue("orders", partitions=3) as q:
        for n in range(30):
            q.produce(b"v%d" % n, key=b"k%d" % (n % 7))
        q.run(lambda msg: None, workers=4)
        assert sorted(q.acked) == sorted(b"v%d" % n for n in range(30))
        assert {r.partition for r in q.records} == {0, 1, 2}


def test_ordering_by_key_hands_a_failed_message_s_copy_before_the_key_s_later_ones():
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "unused:9092"}, "queues": [{"name": "orders"}],
                            "consumer": {"group_id": "workers", "ordering": "key"}})
    with TestQueue(config=cfg) as q:
        for n in range(4):
            q.produce(b"v%d" % n, key=b"k%d" % (n % 2))
        handled = []

        def handle(msg):
            handled.append((msg.value, msg.delivery_count))
            if msg.value == b"v0" and msg.delivery_count == 1:
                raise RuntimeError("first try fails")

        q.run_until_settled(handle)
        k0 = [h for h in handled if h[0] in (b"v0", b"v2")]
        assert k0 == [(b"v0", 1), (b"v0", 2), (b"v2", 1)]  # v2 waited for v0's copy, a virtual second
        assert sorted(q.acked) == [b"v0", b"v1", b"v2", b"v3"]


def test_a_handler_that_never_settles_is_named_not_waited_for():
    with TestQueue("orders") as q:
        q.produce(b"stuck")
        with pytest.raises(TestQueueError, match="not quiet"):
            q.run(lambda msg: msg.abandon(), timeout=0.5)


def test_queue_settings_reach_the_tracker():
    with TestQueue("payments", max_deliveries=1, backoff={"initial": "5s"}) as q:
        q.produce(b"x")
        q.run_until_settled(lambda msg: 1 / 0)
        assert [(d.value, d.reason, d.delivery_count) for d in q.dead_letters] == [(b"x", "nack-limit", 1)]


def test_a_consumer_of_another_queue_is_refused_with_the_fix(queue):
    other = queue.config.queue("orders")
    assert isinstance(queue.clients, ClientFactory)
    with pytest.raises(TopicMissing, match="TestQueue"):
        queue.clients.require_aligned(queue.config.kafka, type(other)(name="invoices"))


@pytest.mark.kmq_queue(name="invoices", max_deliveries=2)
def test_the_pytest_fixture_takes_its_settings_from_the_marker(kmq_queue):
    assert kmq_queue.queue.name == "invoices" and kmq_queue.queue.max_deliveries == 2
    kmq_queue.produce(b"i-1")
    kmq_queue.run(lambda msg: None)
    assert kmq_queue.acked == [b"i-1"]


def test_kmq_testing_imports_without_pytest():
    code = ("import sys; sys.modules['pytest'] = None; import kmq.testing; "
            "assert not any(m.split('.')[0] in ('_pytest', 'hypothesis') for m in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
