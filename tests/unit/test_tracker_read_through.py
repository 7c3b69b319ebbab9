"""The tracker judges a lease over only when it has read every marker written before its end.

A tracker that falls behind its markers partition (a slow or stuck fetch, a burst of markers
larger than it reads per step) still sees the wall clock move. Judging a START's deadline by
the wall clock alone, it redelivers messages whose END is in the log but not yet read: a
duplicate each time, and a message acked on every delivery can even be dead-lettered as
"timeout after max_deliveries". Run on the simulated cluster, so the tracker's own step
(tracker.service.Tracker.step) is driven in virtual time and the stuck fetch is exact.
"""

from __future__ import annotations

from dataclasses import replace

from kmq.config import Config, parse_duration
from kmq.core.lease_state import PartitionState
from kmq.core.markers import End, Start, encode, encode_key
from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.faults import BrokerPause, FaultPlan, SlowFetch
from kmq.dev.sim.workload import QUEUE, Workload
from kmq.dev.sim.world import World, queue_config
from tracker.partition import OwnedPartition

LEASE = 1.0


def _world(faults, outage_grace: str | None = None) -> World:
    """One partition, a tracker and nothing else; with ``outage_grace``, its ``tracker.outage_grace``."""
    cluster = SimCluster(seed=0, faults=FaultPlan(faults))
    w = Workload(partitions=1, messages=1, workers=1, lease=LEASE, tracker_crash_chance=0.0)
    config = queue_config(w)
    if outage_grace is not None:
        config = replace(config, tracker=replace(config.tracker, outage_grace=parse_duration(outage_grace)))
    world = World(cluster, w, seed=0, config=config)
    # The test writes the queue record and the markers itself: no producer, no worker.
    world.actors = [world.tracker]
    return world


def _marker(world: World, marker) -> None:
    world.cluster.append(world.queue.markers_topic, 0, encode_key(0), encode(marker), source="worker")


def _run(world: World, seconds: float) -> None:
    world.run(until=world.cluster.t() + seconds, quiet_after=10**9, max_steps=10**6)


def _copies(world: World) -> int:
    return world.cluster.log(QUEUE, 0).high_water - 1


def _started(faults, outage_grace: str | None = None) -> World:
    """One queue record whose START (lease 1 s) the tracker read at about 0.5 s; with ``outage_grace``,
    the tracker runs with that ``tracker.outage_grace``."""
    world = _world(faults, outage_grace)
    world.cluster.append(QUEUE, 0, b"k", b"v", source="producer")
    _run(world, 0.5)
    _marker(world, Start([(0, 1)], lease_ms=int(LEASE * 1000), owner="w"))
    return world


def test_an_end_written_in_time_but_not_yet_read_is_not_taken_for_a_lapsed_lease():
    # The tracker's markers fetch is stuck from 1 s to 6 s; its other reader answers.
    world = _started([SlowFetch(at=1.0, until=6.0, consumer="tracker#1")])
    _run(world, 0.4)
    assert world.tracker.states[0].in_flight == 1  # read the START before the fetch got stuck
    _run(world, 0.3)
    _marker(world, End([(0, 1)]))  # acked well within the lease, at 1.2 s
    _run(world, 3.0)  # the lease ended at about 1.9 s; the END is still unread
    assert _copies(world) == 0, "redelivered a message whose END was in the markers log"
    _run(world, 3.0)  # the fetch answers again at 6 s
    assert world.tracker.states[0].in_flight == 0 and _copies(world) == 0


def test_a_lapsed_lease_is_still_redelivered_while_the_tracker_is_caught_up():
    world = _started([])
    _run(world, 3.0)
    assert _copies(world) == 1 and world.tracker.states[0].in_flight == 0


def test_a_lapsed_lease_waits_while_the_markers_cannot_be_read_then_is_redelivered():
    # No END at all: once the fetch answers again and shows none, the message is redelivered.
    world = _started([SlowFetch(at=1.0, until=6.0, consumer="tracker#1")])
    _run(world, 0.7)
    _marker(world, Start([(5, 1)], lease_ms=60_000, owner="w"))  # another marker the stuck fetch does not bring
    _run(world, 3.0)
    assert _copies(world) == 0  # not judged while the log holds markers it has not read
    _run(world, 3.0)
    assert _copies(world) == 1


# A broker that answers nothing from 1 s to 16 s: the tracker's look-ups give up after 10 s. Its
# consumers could not write their ENDs meanwhile either; they retry them once it is back.
OUTAGE = BrokerPause(at=1.0, until=16.0)


def test_a_lease_that_ran_out_while_the_broker_was_away_waits_for_the_end_retried_after_it():
    world = _started([OUTAGE])
    _run(world, 17.0 - world.cluster.t())
    assert world.tracker.states[0].in_flight == 1 and _copies(world) == 0, "copied before the retried END came"
    _marker(world, End([(0, 1)]))  # the worker's END, written again a second after the broker is back
    _run(world, 15.0)
    assert world.tracker.states[0].in_flight == 0 and _copies(world) == 0


def test_a_lease_that_ran_out_while_the_broker_was_away_is_redelivered_after_the_grace():
    world = _started([OUTAGE])
    _run(world, 17.0 - world.cluster.t())
    assert _copies(world) == 0
    _run(world, 15.0)  # no END came within the grace: redelivered
    assert _copies(world) == 1 and world.tracker.states[0].in_flight == 0


def test_a_longer_outage_grace_waits_for_an_end_retried_late():
    # The END comes 20 s after the broker is back: past the default grace, within a grace of 30 s.
    world = _started([OUTAGE], outage_grace="30s")
    _run(world, 36.0 - world.cluster.t())
    assert world.tracker.states[0].in_flight == 1 and _copies(world) == 0, "copied within the 30 s grace"
    _marker(world, End([(0, 1)]))
    _run(world, 30.0)
    assert world.tracker.states[0].in_flight == 0 and _copies(world) == 0


def test_the_default_grace_copies_a_message_whose_end_comes_after_it():
    world = _started([OUTAGE])
    _run(world, 36.0 - world.cluster.t())
    assert _copies(world) == 1, "the default grace (10 s) held the lease for 20 s"


def test_a_grace_of_zero_judges_the_lapsed_lease_as_soon_as_the_markers_are_read_again():
    world = _started([OUTAGE], outage_grace="0s")
    _run(world, 19.0 - world.cluster.t())
    assert _copies(world) == 1 and world.tracker.states[0].in_flight == 0


def test_an_outage_that_begins_while_a_look_up_mark_is_being_read_is_noticed_by_a_probe():
    # The tracker looked up the end at 2.4 s (a lease of offset 5, past the queue's end, was due) and is
    # still reading towards it when the broker goes away (its markers fetch stuck until 16.5 s): no
    # look-up is needed then, so only a probe of one partition's end shows the outage.
    world = _world([SlowFetch(at=2.0, until=16.5, consumer="tracker#1"), BrokerPause(at=3.0, until=16.0)])
    world.cluster.append(QUEUE, 0, b"k", b"v", source="producer")
    _run(world, 0.5)
    _marker(world, Start([(0, 1)], lease_ms=3_000, owner="w"))  # due at about 3.5 s, inside the outage
    _run(world, 0.1)
    _marker(world, Start([(5, 1)], lease_ms=1_800, owner="w"))  # due at about 2.4 s
    _run(world, 1.6)
    _marker(world, End([(99, 1)]))  # unread at the look-up: the position stays behind its mark
    _run(world, 17.5 - world.cluster.t())
    assert _copies(world) == 0, "copied before the retried END came"
    _marker(world, End([(0, 1)]))  # written again a second and a half after the broker is back
    _run(world, 15.0)
    # Offset 5 stays open: the queue log ends below it, which proves nothing (it is never closed).
    assert not world.tracker.states[0].is_open(0) and _copies(world) == 0


# ------------------------------------------------------------ the partition's rule, pure


def _owned(position: int) -> OwnedPartition:
    q = Config.from_dict({"queues": [{"name": "q", "lease": "1s"}]}).queues[0]
    state = PartitionState(q.backoff.delay, q.max_deliveries)
    o = OwnedPartition(q, ("q__markers", 0), state, caught_up=True)
    state.position = position
    return o


def test_a_busy_partition_moves_on_once_its_position_passes_the_mark():
    o = _owned(10)
    o.end_read(1_000, 12)  # two markers unread at 1.0 s
    assert o.horizon(5_000) == 0 and o.mark == (1_000, 12)
    o.state.position = 15  # read past the mark; newer markers keep coming, that does not matter
    o.wants_end(5_000, 100)
    assert o.horizon(5_000) == 1_000 and o.mark is None


def test_a_partition_read_to_the_end_is_read_through_at_the_look_up():
    o = _owned(12)
    o.end_read(2_000, 12)
    assert o.horizon(5_000) == 2_000 and o.horizon(1_500) == 1_500


def test_a_hold_keeps_what_fell_due_after_the_last_good_look_up_until_the_end_is_read_past_it():
    o = _owned(12)
    o.end_read(2_000, 12)  # read through at 2.0 s; then the broker went away, and came back at 20 s
    o.hold(2_000, 30_000)
    o.end_read(20_000, 12)
    assert o.horizon(25_000) == 2_000  # what fell due before 2.0 s may be judged, nothing later
    o.state.apply(Start([(5, 1)], lease_ms=1_000, owner="w"), marker_offset=12, ts_ms=3_000)
    assert o.next_visit_ms(25_000, 50) == 30_000  # looked at again when the hold ends
    o.end_read(30_000, 13)
    o.state.position = 13
    o.wants_end(30_000, 100)
    assert o.horizon(31_000) == 30_000


def test_no_look_up_is_made_while_a_steps_worth_is_due_by_the_read_through_time_known():
    o = _owned(2)
    o.state.apply(Start([(0, 10)], lease_ms=1_000, owner="w"), marker_offset=0, ts_ms=1_000)  # due at 2.0 s
    o.state.apply(Start([(10, 5)], lease_ms=1_000, owner="w"), marker_offset=1, ts_ms=4_000)  # due at 5.0 s
    o.end_read(3_000, 2)  # read through at 3.0 s
    assert not o.wants_end(9_000, 10)  # a step hands out 10: the 10 due at 2.0 s, look-up or not
    assert o.wants_end(9_000, 11)  # an 11th would be one due past 3.0 s: look the end up first
    o.state.due(o.horizon(9_000), limit=10)
    assert o.wants_end(9_000, 10)  # the backlog was handed out; what is due past what is known asks


def test_a_hold_asks_for_the_end_although_the_due_lease_is_older_than_the_read_through_time():
    o = _owned(12)
    o.end_read(2_000, 12)  # read through at 2.0 s; the broker went away then and came back at 20 s
    o.hold(2_000, 30_000)
    o.state.apply(Start([(5, 1)], lease_ms=1_000, owner="w"), marker_offset=12, ts_ms=3_000)  # due at 4.0 s
    o.state.position = 13
    o.end_read(20_000, 13)  # read through at 20 s, but held: only what was due before 2.0 s is judged
    assert o.horizon(25_000) == 2_000
    assert o.wants_end(25_000, 1)  # looked up again until the read-through time passes the hold
