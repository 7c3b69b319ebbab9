"""One contract for every implementation of the client seam: the simulated cluster, kafka-python and
confluent-kafka on the test broker. The same assertions for all three, so the simulator is held to
what the real clients do (and the real adapters to each other).

The simulated variant needs no broker and runs in simulated time (``-k sim`` runs only it);
the real ones build their clients through kmq's factory, as KmqConsumer and the tracker do.
"""

from __future__ import annotations

import pytest

from kmq.client import ClientCommitFailed, RecordTooLarge
from tests.helpers.seam import KafkaSeam, SimSeam, offset_of
from tests.helpers.kafka import recent_ms

pytestmark = pytest.mark.integration

TS = recent_ms()
IMPLEMENTATIONS = ["sim", "kafka-python", "confluent"]


@pytest.fixture(params=IMPLEMENTATIONS)
def seam(request):
    if request.param == "sim":
        s = SimSeam()
    else:
        if request.param == "confluent":
            pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
        s = KafkaSeam(request.param, request.getfixturevalue("make_config"), request.getfixturevalue("kafka_broker"))
    try:
        yield s
    finally:
        s.close()


def _produce(seam, topic: str, count: int, partitions: int = 1, first: int = 0) -> list[int]:
    """``count`` records (key ``k<i>``, value ``v<i>``, headers, timestamp ``TS + i``) over the
    partitions in turn; returns their offsets from the acknowledgements."""
    p = seam.producer()
    futures = [p.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % partitions,
                      headers=[("h", b"%d" % i), ("empty", b"")], timestamp_ms=TS + i)
               for i in range(first, first + count)]
    p.flush(30)
    offsets = [offset_of(f.get(10)) for f in futures]
    seam.close_client(p)
    return offsets


# ------------------------------------------------------------------ produce and fetch


def test_records_come_back_in_order_with_their_offsets_keys_headers_and_timestamps(seam):
    topic = seam.topic(2)
    assert _produce(seam, topic, 10, partitions=2) == [i // 2 for i in range(10)]
    r = seam.reader([(topic, 0), (topic, 1)])
    got = seam.fetch_until(r, 10)
    assert len(got) == 10
    for part in (0, 1):
        mine = [x for x in got if x.partition == part]
        assert [x.offset for x in mine] == list(range(5))
        assert [int(x.value[1:]) for x in mine] == [i for i in range(10) if i % 2 == part]
    for x in got:
        i = int(x.value[1:])
        assert (x.topic, x.key, list(x.headers), x.timestamp) == (topic, b"k%d" % i, [("h", b"%d" % i), ("empty", b"")],
                                                                  TS + i)


def test_records_kafka_accepts_come_back_as_written_null_header_tombstones_and_a_huge_value(seam):
    topic = seam.topic(1)
    seam.produce_any(topic, [
        {"key": b"nh", "value": b"v", "headers": [("trace", None), ("app", b"1")]},
        {"key": b"tomb", "value": None},
        {"key": None, "value": None},
        {"key": b"big", "value": b"x" * 1_200_000},
    ])
    got = seam.fetch_until(seam.reader([(topic, 0)]), 4)
    assert [x.offset for x in got] == [0, 1, 2, 3]
    assert list(got[0].headers) == [("trace", None), ("app", b"1")]
    assert (got[1].key, got[1].value) == (b"tomb", None)
    assert (got[2].key, got[2].value) == (None, None)
    assert got[3].value == b"x" * 1_200_000


# ------------------------------------------------------------------ high-water marks


def test_a_record_larger_than_the_producer_sends_fails_with_kmqs_record_too_large(seam):
    topic = seam.topic(1)
    p = seam.producer()
    try:
        fut = p.send(topic, key=b"big", value=b"x" * 2_000_000, partition=0)
    except RecordTooLarge:
        pass  # refused before it left (both real clients)
    else:
        p.flush(10)  # or failed on its way (the simulated producer)
        with pytest.raises(RecordTooLarge):
            fut.get(10)
    seam.close_client(p)


def test_the_high_water_mark_is_the_one_the_last_fetch_saw(seam):
    topic = seam.topic(2)  # partition 1 stays empty
    _produce(seam, topic, 5)
    r = seam.reader([(topic, 0), (topic, 1)])
    assert r.highwater(topic, 0) in (None, 5)  # none before a fetch (librdkafka may have fetched already)
    seam.drive([r], lambda: r.highwater(topic, 0) == 5 and r.highwater(topic, 1) == 0, "high-water marks 5 and 0")
    _produce(seam, topic, 3, first=5)
    got = seam.fetch_until(r, 3, "the 3 new records")
    assert [x.offset for x in got if x.partition == 0][-1] == 7
    seam.drive([r], lambda: r.highwater(topic, 0) == 8, "high-water mark 8")
    assert r.highwater(topic, 1) == 0


def test_a_partition_not_assigned_has_no_high_water_mark(seam):
    topic = seam.topic(2)
    r = seam.reader([(topic, 0)])
    seam.drive([r], lambda: r.highwater(topic, 0) == 0, "the high-water mark of the assigned partition")
    assert r.highwater(topic, 1) is None


# ------------------------------------------------------------------ groups and commits


def test_a_commit_is_where_the_next_member_of_the_group_resumes(seam):
    topic = seam.topic(1)
    _produce(seam, topic, 10)
    group = seam.unique("g")
    a = seam.member(group, topic, "a")
    assert a.adapter.member_id() is None  # not joined before its first poll
    seam.drive([a.adapter], lambda: False, "the first member's records", stop_at={a.adapter: 10})
    assert a.adapter.member_id() and a.adapter.assignment() == {(topic, 0)}
    a.adapter.commit({(topic, 0): 4})
    assert seam.committed(group, topic) == {0: 4}
    seam.close_client(a.adapter)
    b = seam.member(group, topic, "b")
    got = seam.fetch_until(b.adapter, 6, "the second member's records")
    assert [x.offset for x in got] == [4, 5, 6, 7, 8, 9]


def test_an_asynchronous_commit_completes_while_the_member_polls(seam):
    topic = seam.topic(1)
    _produce(seam, topic, 3)
    group = seam.unique("g")
    a = seam.member(group, topic, "a")
    seam.fetch_until(a.adapter, 3)
    fut = a.adapter.commit_async({(topic, 0): 3})
    seam.drive([a.adapter], lambda: fut.is_done, "the commit's answer")
    assert fut.succeeded() and seam.committed(group, topic) == {0: 3}


def test_a_second_member_takes_partitions_revoked_only_from_the_first_and_gives_them_back(seam, request):
    topic = seam.topic(2)
    both = frozenset({(topic, 0), (topic, 1)})
    group = seam.unique("g")
    a = seam.member(group, topic, "a")
    seam.drive([a.adapter], lambda: len(a.adapter.assignment()) == 2, "the first member's assignment")
    b = seam.member(group, topic, "b")
    seam.drive([a.adapter, b.adapter], lambda: len(a.adapter.assignment()) == len(b.adapter.assignment()) == 1,
               "the partitions split between the members")
    if isinstance(seam, KafkaSeam) and b.events[0] == ("+", both):
        # A round that gave b everything was completed without a: seen once under CI load.
        request.getfixturevalue("skip_on_tansu")(
            "a join round completes after about half a session timeout without the members that have not "
            "rejoined yet (Apache Kafka waits for them up to the rebalance timeout); the first member rejoined "
            f"too late and the second got every partition first (events: a {a.events}, b {b.events})")
    assert a.events[0] == ("+", both)
    # cooperative: the first member's first revocation is exactly what the second member was first given,
    # one partition, and it kept the other meanwhile (eager rebalancing revokes both at once).
    first_moved = b.events[0][1]
    assert b.events[0][0] == "+" and len(first_moved) == 1, f"second member's events: {b.events}"
    assert a.events[1] == ("-", first_moved), f"first member's events: {a.events}; second's: {b.events}"
    # Later rounds may follow under load (a member whose session expired loses what it holds, which a
    # lost assignment reports as revoked, and joins again); the split they end in is what is judged next.
    moved = b.adapter.assignment()
    kept = both - moved
    assert a.adapter.assignment() == kept
    before_close = len(a.events)
    seam.close_client(b.adapter)
    seam.drive([a.adapter], lambda: len(a.adapter.assignment()) == 2, "the partition back at the first member")
    after_close = a.events[before_close:]
    if isinstance(seam, KafkaSeam) and after_close and after_close[-1] == ("+", both):
        # The round after b left completed without a, which lost what it kept and joined again: seen under CI load.
        request.getfixturevalue("skip_on_tansu")(
            "a join round completes after about half a session timeout without the members that have not "
            "rejoined yet (Apache Kafka waits for them up to the rebalance timeout); after the second member "
            f"left, the first rejoined too late, lost what it kept and got every partition anew (events: a {a.events})")
    # cooperative: the first member is given back what moved and revokes nothing it kept.
    assert after_close == [("+", frozenset(moved))], f"first member's events: {a.events}"


# ------------------------------------------------------------------ positions and flow


def test_a_paused_partition_is_not_fetched_until_resumed(seam):
    topic = seam.topic(2)
    _produce(seam, topic, 6, partitions=2)
    r = seam.reader([(topic, 0), (topic, 1)])
    r.pause([(topic, 0)])
    got = seam.fetch_until(r, 3, "the unpaused partition's records")
    assert {x.partition for x in got} == {1}
    r.resume([(topic, 0)])
    again = seam.fetch_until(r, 3, "the resumed partition's records")
    assert [(x.partition, x.offset) for x in again] == [(0, 0), (0, 1), (0, 2)]


def test_a_partition_a_rebalance_assigns_again_arrives_unpaused(seam, request):
    # Kafka's own consumer keeps the pause of a partition that stays assigned and drops it for
    # one that moves. librdkafka keeps it on a partition that comes back: a consumer that paused
    # everything for flow control, lost a partition in a rebalance and got it back never read
    # it again (seen after a broker restart).
    topic = seam.topic(2)
    _produce(seam, topic, 6, partitions=2)
    group = seam.unique("g")
    a = seam.member(group, topic, "a")
    seam.drive([a.adapter], lambda: len(a.adapter.assignment()) == 2, "the first member's assignment")
    a.adapter.pause(a.adapter.assignment())
    b = seam.member(group, topic, "b")
    seam.drive([a.adapter, b.adapter], lambda: len(a.adapter.assignment()) == len(b.adapter.assignment()) == 1,
               "the partitions split between the members")
    moved = b.adapter.assignment()
    seam.close_client(b.adapter)  # nothing committed: the partition comes back to a from its start
    got = seam.fetch_until(a.adapter, 3, "the records of the partition assigned again")
    assert len(a.adapter.assignment()) == 2
    stayed = {(topic, 0), (topic, 1)} - moved
    if isinstance(seam, KafkaSeam) and a.revoked_all() & stayed:
        # The partition that should have stayed was taken from the first member and given back:
        # it then arrives unpaused, as the seam promises, and this test's premise is gone.
        request.getfixturevalue("skip_on_tansu")(
            "a join round completes after about half a session timeout without the members that have not "
            "rejoined yet (Apache Kafka waits for them up to the rebalance timeout); the first member lost the "
            f"partition it should have kept (events: a {a.events}, b {b.events})")
    # the one that stayed is still paused
    assert {(x.topic, x.partition) for x in got} == moved, f"events: a {a.events}, b {b.events}"


def test_seek_reads_again_from_the_offset(seam):
    topic = seam.topic(1)
    _produce(seam, topic, 5)
    r = seam.reader([(topic, 0)])
    seam.fetch_until(r, 5)
    r.seek(topic, 0, 2)
    again = seam.fetch_until(r, 3, "the records after the seek")
    assert [x.offset for x in again] == [2, 3, 4]


def test_seek_of_a_partition_not_assigned_is_a_commit_failure_saying_the_group_moved_on(seam):
    topic = seam.topic(2)
    r = seam.reader([(topic, 0)])
    with pytest.raises(ClientCommitFailed) as failed:
        r.seek(topic, 1, 0)
    assert failed.value.rebalanced


# ------------------------------------------------------------------ retention


def test_retention_moves_the_log_start_and_reading_resumes_there(seam):
    if seam.is_tansu:
        pytest.skip("tansu gap: DeleteRecords is not supported, so the log start never moves "
                    "(run with KMQ_TEST_BOOTSTRAP pointing at Apache Kafka)")
    topic = seam.topic(1)
    _produce(seam, topic, 10)
    group = seam.unique("g")
    a = seam.member(group, topic, "a")
    seam.fetch_until(a.adapter, 10)
    a.adapter.commit({(topic, 0): 2})
    seam.close_client(a.adapter)
    seam.delete_records(topic, 0, 5)
    from_start = seam.fetch_until(seam.reader([(topic, 0)]), 5, "the records left")
    assert [x.offset for x in from_start] == [5, 6, 7, 8, 9]
    b = seam.member(group, topic, "b")  # its committed offset 2 is below the log start: reset to it
    assert [x.offset for x in seam.fetch_until(b.adapter, 5)] == [5, 6, 7, 8, 9]
