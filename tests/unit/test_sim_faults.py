"""Each fault of the simulated cluster, seen through the clients kmq uses (no broker, simulated time)."""

from __future__ import annotations

import pytest

from kmq.client import ClientCommitFailed, ProduceFailed, ProducerFatal
from kmq.dev.sim import (
    LOST, BrokerPause, ClockSkew, CommitFault, FaultPlan, FaultPlanError, LaggingRead, LeaderChange,
    MemberJoinsAndLeaves, MemberPause, ProducerGoesFatal,
    ProduceFault, Retention, SimCluster, SimConsumer, SimLogReader, SimProducer, SlowFetch, StaleHighWater,
    UnexpectedRecord,
)
from kmq.dev.sim.faults import BAD_KMQ_HEADERS, DELAYED, HUGE_VALUE, HUNG, NULL_HEADER, NULL_RECORD, TOMBSTONE


def _cluster(*faults, partitions: int = 1, records: int = 0, **kw) -> SimCluster:
    c = SimCluster(seed=1, faults=FaultPlan(faults), **kw)
    c.create_topic("q", partitions)
    for i in range(records):
        c.append("q", i % partitions, b"k%d" % i, b"v%d" % i)
    return c


def _reader(c: SimCluster, name: str = "r", partitions: int = 1) -> SimConsumer:
    r = SimConsumer(c, name)
    r.assign([("q", p) for p in range(partitions)])
    return r


def _member(c: SimCluster, name: str, events: list | None = None) -> SimConsumer:
    m = SimConsumer(c, name, group_id="g")
    log = events if events is not None else []
    m.subscribe(["q"], lambda s: log.append((name, "+", sorted(s))), lambda s: log.append((name, "-", sorted(s))))
    return m


def test_a_slow_fetch_returns_nothing_before_its_end_whatever_the_timeout():
    c = _cluster(SlowFetch(0.0, 5.0, "r"), records=3)
    r = _reader(c)
    assert r.fetch(1.0, 10) == [] and c.t() == 1.0
    got = r.fetch(10.0, 10)
    assert [x.offset for x in got] == [0, 1, 2] and c.t() == 5.0  # returned as soon as the fault ended
    other = _reader(c, "other")
    assert len(other.fetch(0, 10)) == 3  # the fault names one consumer


def test_a_stale_high_water_mark_stays_through_fetches_and_a_reassignment():
    c = _cluster(StaleHighWater(1.0, 10.0, "r", "q", 0), records=3)
    r = _reader(c)
    r.fetch(0, 10)
    assert r.highwater("q", 0) == 3
    c.clock.advance(1.0)
    c.append("q", 0, b"k", b"new")
    assert [x.offset for x in r.fetch(0, 10)] == [3] and r.highwater("q", 0) == 3  # not refreshed
    r.assign([])
    assert r.highwater("q", 0) is None  # not assigned: no mark, stale or not
    r.assign([("q", 0)])
    assert r.highwater("q", 0) == 3  # kept across the reassignment, as kafka-python does
    c.clock.advance(10.0)
    r.fetch(0, 10)
    assert r.highwater("q", 0) == 4


def test_a_delayed_ack_completes_later_while_the_record_is_readable_at_once():
    c = _cluster(ProduceFault(0.0, 1.0, "q", 0, ack_delay=3.0))
    p = SimProducer(c)
    fut = p.send("q", b"v", key=b"k")
    assert not fut.is_done and [x.value for x in _reader(c).fetch(0, 10)] == [b"v"]
    with pytest.raises(ProduceFailed, match="not delivered within 1"):
        p.flush(1.0)
    assert fut.get(5.0) == ("q", 0, 0) and fut.get().offset == 0 and c.t() == 3.0


def test_a_lost_ack_fails_the_send_though_the_record_was_written():
    c = _cluster(ProduceFault(0.0, 1.0, ack=LOST))
    fut = SimProducer(c, delivery_timeout=2.0).send("q", b"v", key=b"k")
    with pytest.raises(ProduceFailed, match="no acknowledgement within the delivery timeout"):
        fut.get()
    assert c.t() == 2.0 and c.log("q", 0).high_water == 1


def test_a_produce_request_that_never_reached_the_log_fails_and_writes_nothing():
    c = _cluster(ProduceFault(0.0, 1.0, written=False, ack=LOST))
    fut = SimProducer(c, delivery_timeout=2.0).send("q", b"v", key=b"k")
    with pytest.raises(ProduceFailed, match="no acknowledgement"):
        fut.get()
    assert c.log("q", 0).high_water == 0 and c.t() == 2.0


@pytest.mark.parametrize("written", [True, False])
def test_a_hung_send_of_the_named_producer_is_answered_only_when_its_producer_closes(written):
    c = _cluster(ProduceFault(0.0, 1.0, "q", 0, written=written, ack=HUNG, producer="tracker"))
    hung, other = SimProducer(c, "tracker", delivery_timeout=2.0), SimProducer(c, "app", delivery_timeout=2.0)
    fut, fine = hung.send("q", b"v", key=b"k"), other.send("q", b"w", key=b"k")
    with pytest.raises(ProduceFailed, match="not delivered within 10"):
        hung.flush(10.0)  # far past its delivery timeout: still no answer
    assert not fut.is_done and fine.get(0).offset == (1 if written else 0)
    assert c.log("q", 0).high_water == (2 if written else 1)
    hung.close(timeout=0.0)
    with pytest.raises(ProduceFailed, match="closed before the record was acknowledged"):
        fut.get(0)


def test_a_lagging_read_ends_where_the_log_ended_when_the_fault_began():
    c = _cluster(LaggingRead(1.0, 5.0, "q", 0, reader="tracker-reader"), records=2)
    c.clock.advance(2.0)
    for i in (2, 3):
        c.append("q", 0, b"k", b"v%d" % i)  # written during the fault: not there for the lagging reader
    lagging, other = SimLogReader(c, "tracker-reader"), SimLogReader(c, "other")
    got = lagging.read("q", 0, [(0, 4)])
    assert sorted(got.records) == [0, 1] and got.log_end == 2 and got.missing == []
    assert sorted(other.read("q", 0, [(0, 4)]).records) == [0, 1, 2, 3]
    c.clock.advance(3.0)  # the fault is over
    assert sorted(lagging.read("q", 0, [(0, 4)]).records) == [0, 1, 2, 3]


def test_an_ack_for_a_record_not_written_is_refused_as_a_fault():
    with pytest.raises(FaultPlanError, match="never acknowledges a record it did not write"):
        ProduceFault(0.0, 1.0, written=False)


@pytest.mark.parametrize("applied", [False, True])
@pytest.mark.parametrize("rebalanced", [False, True])
def test_an_injected_commit_failure_says_whether_the_group_moved_on_and_may_still_be_applied(applied, rebalanced):
    c = _cluster(CommitFault(0.0, 1.0, "w", rebalanced=rebalanced, applied=applied), records=3)
    w = _member(c, "w")
    w.fetch(0, 10)
    with pytest.raises(ClientCommitFailed) as failed:
        w.commit({("q", 0): 3})
    assert failed.value.rebalanced is rebalanced
    assert c.committed("g", "q") == ({0: 3} if applied else {})
    fut = w.commit_async({("q", 0): 2})
    c.clock.advance(1.0)
    assert fut.failed() and isinstance(fut.exception, ClientCommitFailed)
    w.commit({("q", 0): 3})  # after the window
    assert c.committed("g", "q") == {0: 3}


def test_a_member_frozen_past_its_session_loses_its_partitions_and_rejoins_when_it_thaws():
    c = _cluster(MemberPause(1.0, 15.0, "a"), partitions=2, session_timeout=10.0)
    events: list = []
    a, b = _member(c, "a", events), _member(c, "b", events)
    for _ in range(3):
        a.fetch(0.1, 10), b.fetch(0.1, 10)
    assert len(a.assignment()) == len(b.assignment()) == 1
    held = sorted(a.assignment())
    while c.t() < 12.0:  # a is frozen; b keeps polling and gets a's partition after the session
        b.fetch(0.5, 10)
    assert b.assignment() == {("q", 0), ("q", 1)}
    with pytest.raises(ClientCommitFailed) as fenced:
        a.commit({("q", 0): 0})  # waits until a thaws, then the group does not know it
    assert fenced.value.rebalanced and c.t() == 15.0
    a.fetch(0.1, 10)
    assert events[-1] == ("a", "-", held) and a.member_id() == "a#0003"  # lost, then rejoined as a new member


def test_a_broker_pause_holds_fetches_produces_and_commits_until_it_ends():
    c = _cluster(BrokerPause(1.0, 4.0), records=1)
    w = _member(c, "w")
    assert len(w.fetch(0, 10)) == 1
    c.clock.advance(1.0)
    fut = SimProducer(c).send("q", b"during", key=b"k")
    assert c.log("q", 0).high_water == 1 and w.fetch(1.0, 10) == []
    got = w.fetch(5.0, 10)
    assert [x.value for x in got] == [b"during"] and c.t() == 4.0 and fut.get(0) == ("q", 0, 1)
    c2 = _cluster(BrokerPause(0.0, 2.0))
    w2 = _member(c2, "w2")
    w2.fetch(0, 10)  # no join while the broker is paused
    assert w2.member_id() is None
    c3 = _cluster(BrokerPause(0.5, 3.0), records=1)
    w3 = _member(c3, "w3")
    w3.fetch(0, 10)
    c3.clock.advance(0.5)
    async_fut = w3.commit_async({("q", 0): 1})
    c3.clock.advance(1.0)
    assert not async_fut.is_done
    w3.commit({("q", 0): 1})
    assert c3.t() == 3.0 and async_fut.succeeded() and c3.committed("g", "q") == {0: 1}


def test_retention_deletes_the_oldest_segment_and_a_consumer_below_it_resets_to_the_log_start():
    c = _cluster(Retention(2.0, "q", 0, segments=1), records=25, segment_records=10)
    w = _member(c, "w")
    assert len(w.fetch(0, 5)) == 5  # position 5
    c.clock.advance(2.0)
    assert c.log("q", 0).log_start == 10
    got = w.fetch(0, 100)
    assert got[0].offset == 10 and len(got) == 15
    assert any("offset 5 of q[0] out of range [10, 25]: reset to 10" in line for line in c.history)


@pytest.mark.parametrize("kind, check", [
    (NULL_HEADER, lambda r: r.headers == [("trace", None), ("app", b"1")]),
    (TOMBSTONE, lambda r: r.key == b"tombstone" and r.value is None),
    (NULL_RECORD, lambda r: r.key is None and r.value is None),
    (HUGE_VALUE, lambda r: len(r.value) == 2 * 1024 * 1024),
    (BAD_KMQ_HEADERS, lambda r: ("kmq-delivery-count", b"\xff\xfe") in r.headers),
])
def test_a_record_nobody_expected_is_written_and_fetched_as_it_is(kind, check):
    c = _cluster(UnexpectedRecord(1.0, "q", 0, kind))
    r = _reader(c)
    got = r.fetch(5.0, 10)
    assert len(got) == 1 and check(got[0]) and c.t() == 1.0


def test_a_member_joining_and_leaving_revokes_mid_batch_and_assigns_back():
    c = _cluster(MemberJoinsAndLeaves(1.0, 3.0, "g"), partitions=2, records=4)
    events: list = []
    w = _member(c, "w", events)
    assert len(w.fetch(0, 10)) == 4 and w.assignment() == {("q", 0), ("q", 1)}
    c.clock.advance(1.0)  # the batch is being processed when the other member joins
    with pytest.raises(ClientCommitFailed) as fenced:
        w.commit({("q", 0): 2, ("q", 1): 2})
    assert fenced.value.rebalanced
    w.fetch(0.1, 10)
    assert len(w.assignment()) == 1 and events[-1][1] == "-"
    kept = next(iter(w.assignment()))
    w.commit({kept: 2})
    while c.t() < 3.5:
        w.fetch(0.2, 10)
    assert w.assignment() == {("q", 0), ("q", 1)} and events[-1][1] == "+"


def test_a_leader_change_holds_group_fetches_and_their_mark_but_not_fresh_look_ups():
    c = _cluster(LeaderChange(1.0, 4.0, "q", 0), partitions=2, records=2)
    r = _reader(c, partitions=2)
    assert len(r.fetch(0.0, 10)) == 2 and r.highwater("q", 0) == 1
    c.clock.advance(2.0)
    c.append("q", 0, b"k", b"during")  # written and acknowledged by the new leader
    c.append("q", 1, b"k", b"other")
    got = r.fetch(0.5, 10)
    assert [(m.partition, m.value) for m in got] == [(1, b"other")]  # the other partition reads on
    assert r.highwater("q", 0) == 1 and r.position("q", 0) == 1  # its mark kept, nothing fetched
    reader = SimLogReader(c, "tracker-reader")
    assert reader.log_ends({("q", 0): 1}).ends == {("q", 0): 2}  # a fresh look-up finds the record
    assert r.fetch(5.0, 10)[0].value == b"during" and c.t() == 4.0  # fetched once the leader is found
    assert r.highwater("q", 0) == 2


def test_a_skewed_host_stamps_its_records_with_its_clock_and_the_log_keeps_how_far_off():
    c = _cluster(ClockSkew(0.0, "w1", -12.5), ClockSkew(2.0, "tracker", 30.0))
    now = c.clock.now_ms()
    SimProducer(c, "w1-markers").send("q", value=b"a").get(1.0)
    SimProducer(c, "w2-markers").send("q", value=b"b").get(1.0)
    first, second = c.log("q", 0).read(0, 2)
    assert first.timestamp == now - 12_500 and first.skew_ms == -12_500
    assert second.timestamp == now and second.skew_ms == 0
    assert c.wall_ms("tracker#2") == now  # its clock is set forward only at 2 s
    c.clock.advance(2.0)
    assert c.wall_ms("tracker#2") == c.clock.now_ms() + 30_000 and c.wall_ms("tracker-reader") == c.wall_ms("tracker")
    assert c.wall_ms("w2") == c.clock.now_ms()


def test_a_producer_gone_fatal_fails_what_it_holds_and_every_later_send_and_a_new_one_is_healthy():
    c = _cluster(ProducerGoesFatal(1.0, "tracker"), ProduceFault(0.0, 5.0, "q", 0, ack=DELAYED, ack_delay=3.0))
    old = SimProducer(c, "tracker")
    held = old.send("q", value=b"a")  # written at once, its acknowledgement 3 s away
    assert old.fatal is None
    c.clock.advance(1.5)
    assert isinstance(old.fatal, ProducerFatal) and isinstance(held.exception, ProducerFatal)
    assert c.log("q", 0).high_water == 1  # written all the same: a duplicate at worst when sent again
    assert isinstance(old.send("q", value=b"b").exception, ProducerFatal)
    new = SimProducer(c, "tracker")  # made after the fault: healthy
    c.clock.advance(4.0)  # past the produce fault
    assert new.send("q", value=b"c").get(1.0).offset == 1 and new.fatal is None
