"""KmqConsumer's plain acks: noted at the ack, their bookkeeping done for a run at once (the next
flow-control look or drain), with the same markers and counts as settling each on its own."""

from __future__ import annotations

from kmq.consumer.ack_buffer import AckBuffer
from kmq.core.markers import End, Renew
from kmq.core.message import ack_all
from tests.helpers.kafka import wait_until
from tests.helpers.consumer_shell import FakeKafka


def test_a_drain_first_calls_what_is_registered_to_put_settlements_in():
    buffer = AckBuffer()
    buffer.before_drain.append(lambda: buffer.ack_many(3, [7, 8, 9]))
    drained = buffer.drain()
    assert [(p, tuple(m.ranges)) for p, m in drained.markers] == [(3, ((7, 3),))]
    assert drained.counts == {"acked": 3}


def test_acks_give_the_markers_and_in_flight_counts_of_settling_each_on_its_own(consumer_on):
    kafka = FakeKafka(records=10)
    consumer = consumer_on(kafka)
    got: list = []
    wait_until(lambda: got.extend(consumer.poll(timeout=0.2)) or len(got) >= 10, 10, what="the batch handed over")
    for m in got[2:7]:
        m.ack()
    assert consumer.in_flight() == {0: 5}  # folds what the fetcher has not folded yet
    got[7].renew()  # a RENEW, then the ack in the same flush: the END only (the FakeWriter flushes when told)
    got[7].ack()
    got[8].nack()  # the per-message path, between noted acks
    got[9].ack()
    consumer.writer.flush_buffer()
    markers = consumer.writer.flushed
    assert sorted(tuple(r) for m in markers if isinstance(m, End) for r in m.ranges) == [(2, 6), (9, 1)]
    assert not [m for m in markers if isinstance(m, Renew)]
    assert consumer.in_flight() == {0: 2}


def test_ack_all_books_a_run_as_acking_each_does(consumer_on):
    kafka = FakeKafka(records=10)
    consumer = consumer_on(kafka)
    got: list = []
    wait_until(lambda: got.extend(consumer.poll(timeout=0.2)) or len(got) >= 10, 10, what="the batch handed over")
    got[3].nack()
    assert ack_all(got[:6] + [got[0]]) == [got[3], got[0]]
    assert consumer.in_flight() == {0: 4}
    consumer._fold_later = False  # as with ordering: key or tracing: each told on its own
    assert ack_all(got[6:9]) == []
    assert consumer.in_flight() == {0: 1}
    consumer.writer.flush_buffer()
    ended = {o for m in consumer.writer.flushed if isinstance(m, End) for start, n in m.ranges
             for o in range(start, start + n)}
    assert ended == {0, 1, 2, 4, 5, 6, 7, 8}
