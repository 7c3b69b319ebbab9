"""KmqConsumer with ``consumer.ordering: key`` against the fake Kafka client of test_consumer_shell:
what poll hands out, what a settlement releases, what closing gives back. No broker."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from kmq.config import Config
from kmq.consumer.consumer import KmqConsumer
from kmq.core.errors import LogReadError
from kmq.core.markers import End, Start
from kmq.core.message import HEADER_DELIVERY_COUNT, HEADER_ORIGIN
from tests.helpers.fake_kafka import FakeKafka as Log, FakeLogReader, FakeTime
from tests.helpers.kafka import wait_until
from tests.helpers.consumer_shell import TOPIC, FakeClients, FakeKafka, FakeWriter


class KeyedKafka(FakeKafka):
    """The fake's one partition with keyed records: ``records`` is a list of (key, headers)."""

    def __init__(self, records: list[tuple[bytes | None, list]]) -> None:
        super().__init__(len(records))
        self.keyed = records
        self.paused = False

    def pause(self, partitions) -> None:
        self.paused = True

    def resume(self, partitions) -> None:
        self.paused = False

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = None, wake=None) -> list:
        if self.paused and self._on_assigned is None:  # a paused partition returns nothing (as Kafka)
            self._idle.wait(timeout)
            return []
        plain = super().fetch(timeout, max_records, lambda t, p, o, k, v, h, ts: o)
        return [build(TOPIC, 0, o, self.keyed[o][0], b"v%d" % o, self.keyed[o][1], 0) for o in plain]


def copy_of(offset: int, delivery: int = 2) -> list:
    return [(HEADER_ORIGIN, f"{TOPIC}/0/{offset}".encode()), (HEADER_DELIVERY_COUNT, b"%d" % delivery)]


@pytest.fixture
def keyed_consumer():
    made: list[KmqConsumer] = []

    def make(kafka: FakeKafka, ordering: str = "key", log: Log | None = None, reader: Any = None,
             **queue: Any) -> KmqConsumer:
        """``reader``: the log reader of the key recovery (default: one of ``log``)."""
        log = log or Log(FakeTime())
        cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:9", "session_timeout": "1s"},
                                "queues": [{"name": TOPIC, **queue}],
                                "consumer": {"group_id": "g", "ordering": ordering}})
        c = KmqConsumer(cfg, writer=FakeWriter(cfg), clients=FakeClients(kafka, lambda: reader or FakeLogReader(log)))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close(timeout=5)


def take_all(consumer: KmqConsumer, want: int) -> list[int]:
    """Offsets polled until ``want`` came (waits on the fetcher, not a sleep)."""
    got: list[int] = []
    wait_until(lambda: got.extend(m.offset for m in consumer.poll(timeout=0.1)) or len(got) >= want, 10,
               what=f"{want} message(s)")
    return got


def test_poll_hands_one_message_per_key_and_an_ack_releases_the_next(keyed_consumer):
    consumer = keyed_consumer(KeyedKafka([(b"a", []), (b"b", []), (b"a", []), (None, []), (None, [])]))
    first = {}
    wait_until(lambda: first.update({m.offset: m for m in consumer.poll(timeout=0.1)}) or len(first) >= 4, 10,
               what="the first of each key and the null keys")
    assert sorted(first) == [0, 1, 3, 4]  # 2 waits for 0 (same key); null keys are their own key
    assert consumer.poll(timeout=0.05) == []
    first[0].ack()
    assert [m.offset for m in consumer.poll(timeout=5)] == [2]


def test_a_nacked_message_holds_its_key_until_its_copy_which_goes_before_the_later_ones(keyed_consumer):
    kafka = KeyedKafka([(b"a", []), (b"a", []), (b"b", []), (b"a", copy_of(0))])
    consumer = keyed_consumer(kafka, max_deliveries=5)
    msgs = {}
    wait_until(lambda: msgs.update({m.offset: m for m in consumer.poll(timeout=0.1)}) or len(msgs) >= 2, 10,
               what="0 and 2")
    assert sorted(msgs) == [0, 2]
    wait_until(lambda: consumer._keyed.held >= 2, 10, what="1 and the copy held")
    msgs[0].nack()
    copy = consumer.poll(timeout=5)
    assert [m.offset for m in copy] == [3]  # the copy of 0 goes before 1, though it came after it
    copy[0].ack()
    assert [m.offset for m in consumer.poll(timeout=5)] == [1]


def test_a_nack_at_the_last_delivery_releases_the_key_the_tracker_dead_letters_it(keyed_consumer):
    consumer = keyed_consumer(KeyedKafka([(b"a", copy_of(99, delivery=3)), (b"a", [])]), max_deliveries=3)
    [m] = consumer.poll(timeout=5)
    m.nack()
    assert [x.offset for x in consumer.poll(timeout=5)] == [1]


def test_a_reject_releases_the_key(keyed_consumer):
    consumer = keyed_consumer(KeyedKafka([(b"a", []), (b"a", [])]))
    [m] = consumer.poll(timeout=5)
    m.reject("bad")
    assert [x.offset for x in consumer.poll(timeout=5)] == [1]


def test_closing_gives_held_messages_back_to_the_group(keyed_consumer):
    kafka = KeyedKafka([(b"a", [])] * 5)
    consumer = keyed_consumer(kafka)
    [m] = consumer.poll(timeout=5)
    wait_until(lambda: consumer._keyed.held == 4, 10, what="the other four held")
    m.ack()
    consumer.close(timeout=5)
    assert kafka.commits[-1] == {(TOPIC, 0): 1}  # committed back to the first never-handed message
    assert consumer.writer.handed_off == [{0: [1, 2, 3, 4]}]  # their leases handed off before it


def test_held_messages_leave_flow_controls_bound_so_other_keys_are_still_fetched(keyed_consumer):
    # 1,500 messages of key a, then one of key b; the flow bound before a rate is measured is 500:
    # were the held ones counted, b would never be fetched while a's first is out.
    kafka = KeyedKafka([(b"a", [])] * 1500 + [(b"b", [])])
    consumer = keyed_consumer(kafka)
    assert consumer.flow.limit(0.0) < 1500
    got = take_all(consumer, 2)
    assert got == [0, 1500]


def test_ordering_none_hands_the_same_records_out_at_once(keyed_consumer):
    consumer = keyed_consumer(KeyedKafka([(b"a", [])] * 3), ordering="none")
    assert sorted(take_all(consumer, 3)) == [0, 1, 2]


def earlier_owner(keys: list[bytes | None], start: int, *markers) -> Log:
    """The log an earlier owner of partition 0 left: queue records with ``keys``, ``markers``, the
    workers group committed at ``start``."""
    log = Log(FakeTime())
    log.committed[("g", TOPIC, 0)] = start
    for k in keys:
        log.append(TOPIC, 0, k, b"v")
    for m in markers:
        log.marker(f"{TOPIC}__markers", 0, m, 1_000)
    return log


def test_a_new_owner_holds_a_key_whose_earlier_message_is_unsettled_until_its_copy(keyed_consumer):
    # Offsets 0 (a) and 1 (b) were STARTed by an earlier owner, which settled 1 and left 0 open;
    # this consumer starts at 2. The tracker's copy of 0 sits at 5.
    keys = [b"a", b"b", b"a", b"b", b"c", b"a"]
    kafka = KeyedKafka([(k, copy_of(0) if o == 5 else []) for o, k in enumerate(keys)])
    kafka.position_at = 2
    consumer = keyed_consumer(kafka, log=earlier_owner(keys, 2, Start(((0, 2),), 3000), End(((1, 1),))))
    got = {}
    wait_until(lambda: got.update({m.offset: m for m in consumer.poll(timeout=0.1)}) or len(got) >= 3, 10,
               what="b, c and the copy of 0")
    assert sorted(got) == [3, 4, 5]  # 2 (a) waits for the copy of the earlier owner's 0
    assert consumer.poll(timeout=0.05) == []
    got[5].ack()
    assert [m.offset for m in consumer.poll(timeout=5)] == [2]


def test_a_new_owner_releases_a_key_when_the_markers_show_the_earlier_message_settled(keyed_consumer):
    keys = [b"a", b"b", b"a", b"b"]
    log = earlier_owner(keys, 2, Start(((0, 2),), 3000), End(((1, 1),)))
    kafka = KeyedKafka([(k, []) for k in keys])
    kafka.position_at = 2
    consumer = keyed_consumer(kafka, log=log)
    assert [m.offset for m in consumer.poll(timeout=5)] == [3]
    assert consumer.poll(timeout=0.2) == []  # 2 waits: 0 is still open at the earlier owner
    log.marker(f"{TOPIC}__markers", 0, End(((0, 1),)), 2_000)  # the earlier owner acked it after all
    assert [m.offset for m in consumer.poll(timeout=5)] == [2]


def test_a_partition_whose_lookup_fails_goes_on_without_it(keyed_consumer, monkeypatch, caplog):
    keys = [b"a", b"b", b"a"]
    log = earlier_owner(keys, 2, Start(((0, 2),), 3000))

    def refused(group, partitions):
        raise LogReadError("not authorized to describe group")

    reader = FakeLogReader(log)
    monkeypatch.setattr(reader, "committed", refused)
    kafka = KeyedKafka([(k, []) for k in keys])
    kafka.position_at = 2
    consumer = keyed_consumer(kafka, log=log, reader=reader)
    assert [m.offset for m in consumer.poll(timeout=5)] == [2]
    assert "could not learn which messages an earlier owner left unsettled" in caplog.text
    assert consumer.metrics.ordering_recoveries.labels(TOPIC, "given_up")._value.get() == 1


def test_messages_held_before_the_partition_came_back_are_not_stuck_without_new_records(keyed_consumer):
    # The lookup does not wait for a record fetched in the new assignment: with none, the keys
    # held before still go once it is done.
    keys = [b"a", b"a"]
    kafka = KeyedKafka([(k, []) for k in keys])
    consumer = keyed_consumer(kafka, log=earlier_owner(keys, 2))
    [m] = consumer.poll(timeout=5)
    consumer._recovery.assigned({0}, consumer._pipeline.gen)  # a rebalance gives the partition back to this member
    m.ack()
    assert [x.offset for x in consumer.poll(timeout=5)] == [1]
