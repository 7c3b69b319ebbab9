"""The simulated clients beyond the seam contract: what the producer refuses like kafka-python, where
unpartitioned records go, closing with sends pending, the tracker's log reader contract."""

from __future__ import annotations

import pytest

from kmq.client import LogEnds, ProduceFailed, adapt_consumer, produce_errors
from kmq.client.kafka_python.log_reader import LogReadError
from kmq.core.ranges import OffsetRange
from kmq.dev.sim import (
    LOST, BrokerPause, FaultPlan, ProduceFault, SimCluster, SimConsumer, SimLogReader, SimProducer, SimulationError,
    SlowRead,
)
from kmq.dev.sim.reader import POLL_S


def _cluster(*faults, partitions: int = 1) -> SimCluster:
    c = SimCluster(seed=3, faults=FaultPlan(faults))
    c.create_topic("q", partitions)
    return c


def test_the_producer_refuses_what_kafka_pythons_refuses_and_the_confluent_flavour_sends_it():
    c = _cluster()
    p = SimProducer(c)
    with pytest.raises(TypeError, match="headers"):
        p.send("q", b"v", key=b"k", headers=[("h", None)])
    with pytest.raises(ValueError, match="key or value"):
        p.send("q", None, key=None)
    with pytest.raises(TypeError, match="value"):
        p.send("q", "text")  # type: ignore[arg-type]
    any_ = SimProducer(c, refuses_like="confluent")
    assert any_.send("q", None, key=None, headers=[("h", None)]).get(1) == ("q", 0, 0)


def test_failures_are_the_errors_kmq_catches_from_either_client():
    c = _cluster()
    p = SimProducer(c, max_request_size=100)
    assert isinstance(pytest.raises(ProduceFailed, p.send("q", b"x" * 200).get).value, produce_errors())
    with pytest.raises(produce_errors(), match="unknown topic"):
        p.send("nope", b"v")
    with pytest.raises(produce_errors(), match="unknown topic"):
        p.send("q", b"v", partition=3)


def test_records_without_a_partition_go_by_key_or_round_robin():
    c = _cluster(partitions=3)
    p = SimProducer(c)
    keyed = {p.send("q", b"v", key=b"same").get(1)[1] for _ in range(5)}
    unkeyed = [p.send("q", b"v").get(1)[1] for _ in range(3)]
    assert len(keyed) == 1 and sorted(unkeyed) == [0, 1, 2]


def test_one_producers_records_to_a_partition_are_written_and_acked_in_send_order():
    c = SimCluster(seed=5, latency=(0.0, 0.5))
    c.create_topic("q", 1)
    p = SimProducer(c)
    acked: list[int] = []
    futures = [p.send("q", b"%d" % i, key=b"k").add_callback(lambda meta: acked.append(meta.offset))
               for i in range(20)]
    p.flush()
    assert acked == list(range(20))
    assert [r.value for r in c.log("q", 0).read(0, 20)] == [b"%d" % i for i in range(20)]
    assert all(f.succeeded() for f in futures)


def test_close_fails_what_is_pending_and_never_writes_what_had_not_reached_the_broker():
    c = _cluster(BrokerPause(0.0, 100.0))
    p = SimProducer(c)
    fut = p.send("q", b"v", key=b"k")
    p.close(timeout=1.0)
    assert fut.failed() and isinstance(fut.exception, ProduceFailed)
    c.clock.advance(200.0)
    assert c.log("q", 0).high_water == 0
    with pytest.raises(ProduceFailed, match="closed"):
        p.send("q", b"v")


def test_a_sim_consumer_is_taken_as_an_adapter_as_it_is():
    c = _cluster()
    consumer = SimConsumer(c, "w", group_id="g")
    assert adapt_consumer(consumer) is consumer and consumer.client == "sim"
    with pytest.raises(SimulationError, match="group_id"):
        SimConsumer(c, "x").subscribe(["q"], print, print)


def test_the_log_reader_returns_exactly_the_offsets_asked_reports_the_deleted_missing_and_where_it_ended():
    c = _cluster()
    for i in range(10):
        c.append("q", 0, b"k", b"v%d" % i)
    c.delete_records("q", 0, 3)
    reader = SimLogReader(c)
    res = reader.read("q", 0, [(1, 4), (8, 5)])  # 1..4 and 8..12: 1,2 deleted, 10..12 past the end
    assert sorted(res.records) == [3, 4, 8, 9] and res.records[8].value == b"v8"
    assert res.missing == [OffsetRange(1, 2)] and res.log_end == 10  # past the end: neither found nor missing
    assert reader.read("q", 0, [(4, 1)]).log_end is None
    assert reader.high_waters({("q", 0): None}) == {("q", 0): 10}
    assert reader.log_ends({("q", 0): None}) == LogEnds({("q", 0): 10}, {})
    assert reader.partition_count("q") == 1 and reader.partition_count("nope") == 0


def test_log_ends_answers_partition_by_partition_a_stalled_one_costs_only_its_own_answer():
    c = _cluster(SlowRead(0.0, 60.0, "q", 1), partitions=2)
    c.append("q", 0, b"k", b"v")
    reader = SimLogReader(c)
    began = c.t()
    got = reader.log_ends({("q", 0): None, ("q", 1): None})
    assert got.ends == {("q", 0): 1} and list(got.failed) == [("q", 1)] and "timed out" in got.failed[("q", 1)]
    assert c.t() - began <= 10.0 + POLL_S + 0.01  # one timeout, not one per partition


def test_the_log_reader_gives_up_on_a_paused_broker_after_its_timeout():
    c = _cluster(BrokerPause(0.0, 60.0))
    with pytest.raises(LogReadError, match="timed out"):
        SimLogReader(c, timeout_s=5.0).read("q", 0, [(0, 1)])
    assert c.t() == pytest.approx(5.0 + POLL_S)  # as the real readers: at the end of the first poll past it


def test_a_slow_read_stalls_reads_of_its_partition_only_and_ends_when_the_fault_does():
    c = _cluster(SlowRead(0.0, 30.0, "q", 0), partitions=2)
    for p in (0, 1):
        c.append("q", p, None, b"v")
    reader = SimLogReader(c, timeout_s=5.0)
    assert list(reader.read("q", 1, [(0, 1)]).records) == [0] and c.t() < 1.0  # the other partition answers
    with pytest.raises(LogReadError, match="timed out"):
        reader.read("q", 0, [(0, 1)])
    c.clock.run_until(c.clock.now() + (29.0 - c.t()))
    assert list(reader.read("q", 0, [(0, 1)]).records) == [0]  # answered when the fault ends, within the timeout
    assert c.t() == pytest.approx(30.0, abs=0.01)


def test_a_lost_ack_makes_flush_report_the_record_it_could_not_confirm():
    c = _cluster(ProduceFault(0.0, 1.0, ack=LOST))
    p = SimProducer(c, delivery_timeout=10.0)
    p.send("q", b"v", key=b"k")
    with pytest.raises(ProduceFailed, match="1 record"):
        p.flush(2.0)


def test_position_is_where_the_next_fetch_starts_and_none_when_not_assigned():
    c = _cluster()
    for v in (b"a", b"b", b"c"):
        c.append("q", 0, None, v)
    consumer = SimConsumer(c, "reader")
    assert consumer.position("q", 0) is None
    consumer.assign([("q", 0)])
    assert consumer.position("q", 0) == 0
    assert [r.offset for r in consumer.fetch(0.0, 2)] == [0, 1]
    assert consumer.position("q", 0) == 2
    consumer.seek("q", 0, 1)
    assert consumer.position("q", 0) == 1


def test_a_commit_sent_before_the_member_was_expelled_is_refused_after_the_consumer_rejoined():
    # A client builds its commit request with the member it is then; an expelled member's commit is
    # refused by the coordinator even when the consumer has rejoined by the time it is read. (The
    # simulated consumer used to read the member at delivery, so such a zombie commit moved the
    # group's offset back below what the partition's new owner had committed.)
    c = _cluster()
    con = SimConsumer(c, "w", group_id="g")
    con.subscribe(["q"], on_assigned=lambda _tps: None, on_revoked=lambda _tps: None)
    con.fetch(0.0, 1)
    first = con.member_id()
    assert first is not None and con.assignment() == {("q", 0)}
    fut = con.commit_async({("q", 0): 5})
    c.groups.leave("g", first, c.t())  # expelled before the request reaches the coordinator
    con.fetch(0.0, 1)  # learns it and rejoins
    assert con.member_id() not in (None, first)
    c.clock.advance(1.0)
    assert fut.is_done and fut.exception is not None and fut.exception.rebalanced
    assert c.groups.committed("g", ("q", 0)) is None


def test_a_commit_is_applied_after_the_async_commits_sent_before_it():
    # The coordinator answers one connection's requests in order: a commit back (a revocation's, a
    # close's) never lands before a commit forward sent earlier. (The simulated consumer applied an
    # async commit when the clock next moved, after a synchronous one made meanwhile, so a close's
    # commit back was overtaken and the messages it gave back were left below the committed offset.)
    c = _cluster()
    con = SimConsumer(c, "w", group_id="g")
    con.subscribe(["q"], on_assigned=lambda _tps: None, on_revoked=lambda _tps: None)
    con.fetch(0.0, 1)
    forward = con.commit_async({("q", 0): 22})
    con.commit({("q", 0): 5})
    assert forward.is_done and forward.exception is None  # answered first
    c.clock.advance(1.0)
    assert c.groups.committed("g", ("q", 0)) == 5
