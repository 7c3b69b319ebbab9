"""The tracker's main loop over several partitions, on an in-memory Kafka with controlled time.

A slow partition (a read that times out on an unreachable leader, a send that
takes long) must not starve the others, must keep its own retry backoff, and
must not make the tracker forget what it knows about every partition.
"""

from __future__ import annotations

import logging

import pytest

import tracker.service as service
from kmq.client import ClientCommitFailed
from kmq.core.markers import End, Start
from tests.helpers.tracker_step import EXPIRED_MS, PARTITIONS, QUEUE, READ_TIMEOUT_S, Harness


def test_an_unreachable_partition_does_not_starve_the_others_and_keeps_its_backoff():
    read_ends: list[float] = []

    def unreachable_leader_of_partition_0(p: int) -> None:
        if p == 0:
            h.time.advance(READ_TIMEOUT_S)  # the read waits out its timeout ...
            read_ends.append(h.time.wall)
            raise service.LogReadError("timed out reading q[0]")  # ... and fails

    h = Harness(on_read=unreachable_leader_of_partition_0)
    h.expired_start_in_every_partition()
    h.steps(12)
    assert h.copies() == {0: 0, 1: 1, 2: 1}
    assert [len(h.closed(p)) for p in range(PARTITIONS)] == [0, 1, 1]
    # Nothing was dropped: a slow step that copied nothing puts no partition at risk.
    assert h.metric("stale_views") == 0
    owned0 = h.tracker.partitions[(h.q.markers_topic, 0)]
    assert owned0.state.failing == 1 and owned0.caught_up
    # Partition 0 keeps its retry backoff: between its failed reads it waits 0.5 s, 1 s, 2 s (one step more at most).
    h.steps(100)
    gaps = [b - a - READ_TIMEOUT_S for a, b in zip(read_ends, read_ends[1:])][:3]
    assert gaps == pytest.approx([0.5, 1.0, 2.0], abs=0.06), read_ends
    assert h.metric("redelivery_failures", QUEUE) == len(read_ends) and h.copies() == {0: 0, 1: 1, 2: 1}


def _timed_lookups(h: Harness) -> list[tuple[float, list]]:
    """(fake wall time at its start, partitions) of each log-end look-up of the tracker."""
    seen: list[tuple[float, list]] = []
    real = h.hw_reader.log_ends
    h.hw_reader.log_ends = lambda starts: seen.append((h.time.wall, sorted(starts))) or real(starts)
    return seen


def test_a_markers_partition_whose_look_ups_get_no_answer_costs_only_itself():
    """The leader of markers partition 0 stops answering: each look-up of its end waits out the
    reader's timeout. The other partitions still get their copies within their lease and one such
    wait, message after message, while partition 0 backs off on its own (its failures counted)."""
    h = Harness()
    h.steps(2)  # every partition caught up
    m = h.q.markers_topic
    h.hw_reader.unreachable = {(m, 0)}
    lookups = _timed_lookups(h)
    began = h.time.wall
    for p in range(PARTITIONS):  # one message each, its lease of 1 s starting now
        h.kafka.append(h.q.name, p, b"k%d" % p, b"v%d" % p)
        h.kafka.marker(m, p, Start([(0, 1)], lease_ms=1000, owner="w"), ts_ms=int(h.time.wall * 1000))
    bound_s = 1.0 + 1.0 + READ_TIMEOUT_S + 1.0  # lease + backoff + one look-up's timeout + a step or so
    while h.time.wall - began < 60 and (h.copies()[1], h.copies()[2]) != (1, 1):
        h.steps(1)
    for p in (1, 2):
        copied_at = h.kafka.records(h.q.name, p)[1].timestamp / 1000.0
        assert copied_at - began <= bound_s, (p, copied_at - began)
    # More work on partition 1 while partition 0 still does not answer: copied within the same bound.
    again = h.time.wall
    h.kafka.append(h.q.name, 1, b"k", b"again")
    h.kafka.marker(m, 1, Start([(2, 1)], lease_ms=1000, owner="w"), ts_ms=int(again * 1000))
    while h.time.wall - again < 60 and h.copies()[1] < 3:
        h.steps(1)
    assert h.copies() == {0: 0, 1: 3, 2: 1}
    assert h.kafka.records(h.q.name, 1)[3].timestamp / 1000.0 - again <= bound_s
    # Partition 0 was asked on its own after its first failure, each time after a longer backoff.
    while h.time.wall - began < 200 and len([t for t, tps in lookups if (m, 0) in tps]) < 5:
        h.steps(1)
    failing = [t for t, tps in lookups if (m, 0) in tps]
    assert all(tps == [(m, 0)] for t, tps in lookups[1:] if (m, 0) in tps)
    gaps = [b - a - READ_TIMEOUT_S for a, b in zip(failing, failing[1:])]
    assert len(gaps) >= 2 and all(later > earlier for earlier, later in zip(gaps, gaps[1:])), gaps
    assert h.metric("lookup_failures", QUEUE) == len(failing)
    assert h.tracker.partitions[(m, 0)].state.in_flight == 1  # nothing judged there on an unread end
    # The leader answers again: partition 0 is asked at its next backoff, and copies after the grace.
    h.hw_reader.unreachable = set()
    back = h.time.wall
    while h.time.wall - back < 60 and h.copies()[0] < 1:
        h.steps(1)
    assert h.copies()[0] == 1


def test_a_partition_whose_catch_up_target_gets_no_answer_holds_back_only_itself():
    h = Harness()  # assigned, not caught up yet
    m = h.q.markers_topic
    h.hw_reader.unreachable = {(m, 0)}
    lookups = _timed_lookups(h)
    h.expired_start_in_every_partition()
    began = h.time.wall
    while h.time.wall - began < 60 and (h.copies()[1], h.copies()[2]) != (1, 1):
        h.steps(1)
    assert h.copies() == {0: 0, 1: 1, 2: 1} and h.time.wall - began <= READ_TIMEOUT_S + 2.0
    assert not h.tracker.partitions[(m, 0)].caught_up
    h.steps(200)
    assert h.metric("lookup_failures", QUEUE) >= 2
    assert all(tps == [(m, 0)] for _, tps in lookups[1:] if (m, 0) in tps)  # asked on its own
    h.hw_reader.unreachable = set()
    h.steps(700)  # its backoff ends (at most 30 s)
    assert h.tracker.partitions[(m, 0)].caught_up and h.copies()[0] == 1


def test_a_slow_partition_that_copies_late_without_a_pause_drops_nothing():
    def slow_partition_0(p: int) -> None:
        if p == 0:
            h.time.advance(READ_TIMEOUT_S - 1)  # slow, longer than the session timeout, but it answers

    h = Harness(on_read=slow_partition_0)
    h.expired_start_in_every_partition()
    h.steps(6)
    assert h.copies() == {0: 1, 1: 1, 2: 1}
    assert h.metric("stale_views") == 0 and h.metric("stale_copies", QUEUE) == 0
    # Partition 0 took the step's budget; the others were served first in the next step.
    assert h.reader.reads == [0, 1, 2]


def test_copies_made_across_a_process_pause_are_counted_and_every_view_is_re_read():
    def paused_while_partition_0_is_read(p: int) -> None:
        if p == 0 and not pauses.seen:
            pauses.pause(5.5)  # longer than the session timeout (6 s) less one heartbeat interval (1 s)

    h = Harness(on_read=paused_while_partition_0_is_read)
    pauses = h.pauses
    h.expired_start_in_every_partition()
    h.steps(10)
    # Partition 0's copy was made after the pause: counted as a possible duplicate, and every view was
    # dropped and re-read. The re-read finds the CLOSED marker, so nothing is copied twice.
    assert h.metric("stale_views") == 1 and h.metric("stale_copies", QUEUE) == 1
    assert h.copies() == {0: 1, 1: 1, 2: 1}
    assert h.reader.reads == [0, 1, 2]


def test_a_pause_shorter_than_the_session_timeout_less_a_heartbeat_changes_nothing():
    def paused_while_partition_0_is_read(p: int) -> None:
        if p == 0:
            pauses.pause(4.9)  # heartbeats resumed in time: the group kept us

    h = Harness(on_read=paused_while_partition_0_is_read)
    pauses = h.pauses
    h.expired_start_in_every_partition()
    h.steps(5)
    assert h.metric("stale_views") == 0 and h.metric("stale_copies", QUEUE) == 0
    assert h.copies() == {0: 1, 1: 1, 2: 1}


def test_a_pause_before_the_step_discards_what_the_poll_returned_and_re_reads():
    h = Harness()
    pauses = h.pauses
    h.steps(2)  # positioned and caught up on empty partitions
    h.expired_start_in_every_partition()
    pauses.pause(30.0)  # e.g. SIGSTOP between two steps
    h.steps(1)
    assert h.metric("stale_views") == 1 and h.copies() == {0: 0, 1: 0, 2: 0}
    h.steps(5)
    assert h.copies() == {0: 1, 1: 1, 2: 1} and h.metric("stale_copies", QUEUE) == 0


def stood_still_with_leases_overdue() -> Harness:
    """A tracker caught up on every partition, then paused past its session while each partition's
    one START ran out: its next step doubts its membership and re-reads everything."""
    h = Harness()
    pauses = h.pauses
    h.steps(2)
    h.expired_start_in_every_partition()
    pauses.pause(30.0)
    return h


def test_after_a_pause_nothing_is_redelivered_until_the_group_accepts_a_commit(caplog):
    # The group gave every partition to another tracker while this one stood still, and that one
    # copied them; its CLOSED markers are not written yet, and this client has not learnt at a
    # heartbeat that its session expired. The re-read view finds the STARTs open and overdue.
    h = stood_still_with_leases_overdue()
    h.consumer.refuse_commits = ClientCommitFailed("IllegalGenerationError", rebalanced=True)  # fenced
    h.steps(10)
    assert h.metric("stale_views") == 1 and h.copies() == {0: 0, 1: 0, 2: 0}
    # Tried once in these 0.5 s (once a second), not every step, until the client's rejoin revokes them.
    assert h.metric("fenced_commits") == 1 and h.metric("stale_copies", QUEUE) == 0
    assert "another tracker owns them now" in caplog.text
    assert h.tracker.ready()[0] is False
    # The client rejoins: the listener revokes everything and the group assigns partition 1 back.
    h.consumer.refuse_commits = None
    h.consumer.assign([(h.q.markers_topic, 1)])
    h.steps(5)
    assert h.copies() == {0: 0, 1: 1, 2: 0}


def test_after_a_pause_a_commit_the_group_accepts_resumes_redelivery(caplog):
    caplog.set_level(logging.INFO, "tracker")
    h = stood_still_with_leases_overdue()  # the group kept it (a longer session than assumed)
    h.consumer.commits.clear()
    h.steps(1)
    assert h.metric("stale_views") == 1
    h.steps(5)
    assert h.copies() == {0: 1, 1: 1, 2: 1} and h.metric("fenced_commits") == 0
    # The confirming commit: each partition at its open START (offset 0), before any copy was made.
    assert all(h.consumer.commits.get((h.q.markers_topic, p)) is not None for p in range(PARTITIONS))
    assert "still its own, and redelivery resumes" in caplog.text


def test_after_a_pause_a_confirming_commit_that_fails_is_retried_without_redelivering(caplog):
    h = stood_still_with_leases_overdue()
    h.consumer.refuse_commits = ClientCommitFailed("coordinator not available")
    tried = []
    commit = h.consumer.commit
    h.consumer.commit = lambda offsets: (tried.append(h.time.mono), commit(offsets))
    h.steps(30)  # 1.5 s
    assert h.copies() == {0: 0, 1: 0, 2: 0} and h.metric("fenced_commits") == 0
    # Not a blocking commit every step: once a second (the periodic commit tries too).
    assert 2 <= len(tried) <= 4, tried
    assert caplog.text.count("ownership of") == 1
    h.consumer.refuse_commits = None
    h.steps(25)
    assert h.copies() == {0: 1, 1: 1, 2: 1}


def test_a_revoked_partition_commits_what_changed_before_its_state_is_dropped():
    h = Harness()
    m = h.q.markers_topic
    now_ms = int(h.time.wall * 1000)
    for p in range(PARTITIONS):  # offset 0: an acked START; offset 2: a START still open
        h.kafka.marker(m, p, Start([(0, 1)], lease_ms=60_000, owner="w"), ts_ms=now_ms)
        h.kafka.marker(m, p, End([(0, 1)]), ts_ms=now_ms)
        h.kafka.marker(m, p, Start([(1, 1)], lease_ms=60_000, owner="w"), ts_ms=now_ms)
    h.steps(2)
    h.time.advance(1.0)
    h.steps(1)  # the periodic commit: each partition at its open START
    assert h.consumer.commits == {(m, p): 2 for p in range(PARTITIONS)}
    h.consumer.commits.clear()
    h.tracker.partitions[(m, 0)].state.apply(End([(1, 1)]), 3, now_ms)  # partition 0: nothing open any more
    h.consumer.assign([(m, 1)])  # an eager rebalance: all three revoked, partition 1 given back
    assert h.consumer.commits == {(m, 0): 4}  # the others' commits had not changed
    assert set(h.tracker.partitions) == {(m, 1)} and h.tracker.ready() == (False, f"not ready: catching up 1 of 1 partition(s): {m}[1]")
    h.steps(2)  # re-read from its commit: its START is open again
    assert h.tracker.partitions[(m, 1)].state.in_flight == 1 and h.tracker.ready() == (True, "ready: 1 partition(s)")


def test_a_commit_the_group_refuses_is_counted_and_drops_the_view():
    h = Harness()
    h.expired_start_in_every_partition()
    h.steps(2)  # positioned and caught up: each partition's open START is committable
    h.consumer.refuse_commits = ClientCommitFailed("fenced", rebalanced=True)
    h.time.advance(1.0)
    h.steps(1)
    assert h.metric("fenced_commits") == 1 and h.metric("stale_views") == 1
    assert not any(o.caught_up for o in h.tracker.partitions.values())
    copies = h.copies()
    h.steps(2)  # re-read from the commits; the commit that would confirm them is refused too
    assert h.metric("fenced_commits") == 2 and not any(o.caught_up for o in h.tracker.partitions.values())
    assert h.copies() == copies
    h.consumer.assign([(h.q.markers_topic, 0)])  # the revoke's commit is refused too: counted, state dropped
    assert h.metric("fenced_commits") == 3 and set(h.tracker.partitions) == {(h.q.markers_topic, 0)}


def test_a_failed_commit_of_a_member_still_in_the_group_keeps_the_view():
    h = Harness()
    h.expired_start_in_every_partition()
    h.steps(2)
    h.consumer.refuse_commits = ClientCommitFailed("coordinator not available")
    h.time.advance(1.0)
    h.steps(1)
    assert h.metric("fenced_commits") == 0 and h.metric("stale_views") == 0
    assert all(o.caught_up for o in h.tracker.partitions.values())


def test_a_partition_whose_committed_offset_is_not_read_is_not_acted_on_until_it_is():
    h = Harness()
    h.expired_start_in_every_partition()
    h.consumer.offsets_unavailable = True
    h.consumer.pos = {tp: 0 for tp in h.consumer.assigned}  # the client fetches from somewhere meanwhile
    h.steps(5)
    assert h.metric("markers", QUEUE, "start") == 0 and h.copies() == {0: 0, 1: 0, 2: 0}
    assert not h.tracker.ready()[0]
    h.consumer.offsets_unavailable = False
    h.steps(5)
    assert h.metric("markers", QUEUE, "start") == PARTITIONS and h.copies() == {0: 1, 1: 1, 2: 1}


def test_a_pause_after_which_the_client_already_revoked_everything_drops_no_view_but_says_so(caplog):
    h = Harness()
    pauses = h.pauses
    h.steps(2)
    pauses.pause(30.0)
    h.consumer.assign([])  # the client learnt of the expired session first (inside its poll) and revoked
    h.steps(1)
    assert h.metric("stale_views") == 0 and not h.tracker.partitions
    assert "the process stood still for 30.0s" in caplog.text and "no partition is held any more" in caplog.text


def test_an_idle_step_visits_no_partition_and_a_due_one_is_served_alone(monkeypatch):
    from kmq.core.lease_state import PartitionState

    asked: list[tuple[str, int]] = []  # (what, partition) for every question put to a partition's state
    h = Harness()
    h.steps(2)  # positioned and caught up on empty partitions
    partition_of = {id(o.state): o.partition for o in h.tracker.partitions.values()}
    for name in ("due", "committable_offset", "next_due_ms", "oldest_age_s"):
        real = getattr(PartitionState, name)

        def asking(self, *args, _name=name, _real=real, **kwargs):
            asked.append((_name, partition_of[id(self)]))
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(PartitionState, name, asking)
    h.steps(40)  # two seconds: two commit intervals, two metrics updates
    assert asked == []
    m, now_ms = h.q.markers_topic, int(h.time.wall * 1000)
    h.kafka.append(h.q.name, 1, b"k", b"v")
    h.kafka.marker(m, 1, Start([(0, 1)], lease_ms=1000, owner="w"), ts_ms=now_ms)
    h.steps(40)
    assert h.copies()[1] == 1 and len(h.closed(1)) == 1
    assert {p for _, p in asked} == {1}, asked
    assert [what for what, _ in asked].count("due") == 1  # asked once: when it was due


def test_thousands_of_partitions_catch_up_in_bounded_look_ups_and_a_failed_one_loses_only_its_own():
    """A tracker given many partitions at once positions them and reads their log ends a bounded
    number per step (each step short, so SIGTERM and the pause watch are served), and a look-up that
    fails costs only its own partitions a retry, never the answers already read."""
    many = service._PARTITIONS_PER_LOOKUP * 2 + 100
    h = Harness(more_queues={"big": many})
    asked: list[int] = []
    real = h.hw_reader.log_ends
    fail_once = [True]

    def log_ends(starts):
        asked.append(len(starts))
        if fail_once[0] and len(asked) == 2:
            fail_once[0] = False
            raise service.LogReadError("no answer from the broker for 10s")
        return real(starts)

    h.hw_reader.log_ends = log_ends
    h.consumer.assign([(h.q.markers_topic, p) for p in range(PARTITIONS)] + [("big__markers", p) for p in range(many)])
    h.steps(20)  # the failed ones are asked again after their backoff (0.5 s)
    assert max(asked) <= service._PARTITIONS_PER_LOOKUP
    assert h.tracker.ready()[0], h.tracker.ready()[1]
    # Every partition's end was asked for once, the failed look-up's partitions twice.
    assert sum(asked) == many + PARTITIONS + service._PARTITIONS_PER_LOOKUP


def test_the_readiness_answer_names_a_few_partitions_and_counts_the_rest():
    h = Harness(more_queues={"big": 50})
    h.consumer.assign([("big__markers", p) for p in range(50)])
    ok, detail = h.tracker.ready()
    assert not ok
    assert detail.startswith("not ready: catching up 50 of 50 partition(s): big__markers[0], ")
    assert detail.endswith(" and 40 more")


def test_a_position_the_broker_does_not_answer_during_catch_up_is_asked_again_and_stops_nothing():
    """A partition without a committed offset catches up from the log start, whose offset the client
    may have to ask the broker for; a broker too busy to answer delays that partition's catch-up
    (the service goes on, the others catch up), it does not stop the tracker."""
    h = Harness()
    for p in range(PARTITIONS):  # not empty: the position must be known to judge the catch-up
        h.kafka.append(h.q.markers_topic, p, b"x", b"not a marker")
    real = h.consumer.position
    refusals = []

    def position(topic, partition):
        if partition == 1 and not refusals:
            refusals.append(partition)
            raise service.BrokerUnavailable("log start of q__markers[1] not read: timed out")
        return real(topic, partition)

    h.consumer.position = position
    h.tracker.step(0.0)  # positions, looks the ends up, asks partition 1's position: refused, no exception
    assert refusals == [1]
    assert not h.tracker.partitions[(h.q.markers_topic, 1)].caught_up
    h.steps(10)
    assert h.tracker.ready()[0]


def test_a_backlog_due_before_the_catch_up_is_worked_off_without_a_look_up_per_step(monkeypatch):
    """The catch-up target read is a look-up of its own: a backlog due before it is judged on it,
    step after step, and the log end is asked for again only for what fell due past it."""
    monkeypatch.setattr(service, "_DUE_LIMIT", 2)  # a step hands out 2 offsets: 6 take three steps
    h = Harness()
    asked: list[dict] = []
    real = h.hw_reader.log_ends
    h.hw_reader.log_ends = lambda starts: asked.append(dict(starts)) or real(starts)
    m, now_ms = h.q.markers_topic, int(h.time.wall * 1000)
    for o in range(6):
        h.kafka.append(h.q.name, 0, b"k%d" % o, b"v%d" % o)
    h.kafka.marker(m, 0, Start([(0, 6)], lease_ms=1000, owner="w"), ts_ms=now_ms - EXPIRED_MS)
    h.steps(1)
    catch_up = len(asked)
    assert catch_up >= 1
    h.steps(1)
    assert h.tracker.partitions[(m, 0)].caught_up
    h.steps(6)
    assert len(h.kafka.records(h.q.name, 0)) == 6 + 6  # the originals and a copy of each
    assert len(asked) == catch_up  # neither a look-up per step nor a probe of the broker
    h.kafka.append(h.q.name, 0, b"k6", b"v6")
    h.kafka.marker(m, 0, Start([(6, 1)], lease_ms=1000, owner="w"), ts_ms=int(h.time.wall * 1000))
    h.steps(60)
    assert len(h.kafka.records(h.q.name, 0)) == 7 + 7 and len(asked) > catch_up  # due past the read-through time: looked up first
