"""The tracker judges a lease over only when it has read every marker written before its end.

A tracker that falls behind its markers partition (a slow or stuck fetch, a burst of markers
larger than it reads per step) still sees the wall clock move. Judging a START's deadline by
the wall clock alone, it redelivers messages whose END is in the log but not yet read: a
duplicate each time, and a message acked on every delivery can even be dead-lettered as
"timeout after max_deliveries". Run on the simulated cluster, so the tracker's own step
(tracker.service.Tracker.step) is driven in virtual time and the stuck fetch is exact.
"""

from __future__ import annotations

from kmq.core.markers import End, Start, encode, encode_key
from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.faults import FaultPlan, SlowFetch
from kmq.dev.sim.workload import QUEUE, Workload
from kmq.dev.sim.world import World

LEASE = 1.0


def _world(faults) -> World:
    cluster = SimCluster(seed=0, faults=FaultPlan(faults))
    w = Workload(partitions=1, messages=1, workers=1, lease=LEASE, tracker_crash_chance=0.0)
    world = World(cluster, w, seed=0)
    # The test writes the queue record and the markers itself: no producer, no worker.
    world.actors = [world.tracker]
    return world


def _marker(world: World, marker) -> None:
    world.cluster.append(world.queue.markers_topic, 0, encode_key(0), encode(marker), source="worker")


def _run(world: World, seconds: float) -> None:
    world.run(until=world.cluster.t() + seconds, quiet_after=10**9, max_steps=10**6)


def _copies(world: World) -> int:
    return world.cluster.log(QUEUE, 0).high_water - 1


def test_an_end_written_in_time_but_not_yet_read_is_not_taken_for_a_lapsed_lease():
    # The tracker's markers fetch is stuck from 1 s to 6 s; its other reader answers.
    world = _world([SlowFetch(at=1.0, until=6.0, consumer="tracker#1")])
    world.cluster.append(QUEUE, 0, b"k", b"v", source="producer")
    _run(world, 0.5)
    _marker(world, Start([(0, 1)], lease_ms=int(LEASE * 1000), owner="w"))
    _run(world, 0.4)
    assert world.tracker.states[0].in_flight == 1  # read the START before the fetch got stuck
    _run(world, 0.3)
    _marker(world, End([(0, 1)]))  # acked well within the lease, at 1.2 s
    _run(world, 3.0)  # the lease ended at about 1.9 s; the END is still unread
    assert _copies(world) == 0, "redelivered a message whose END was in the markers log"
    _run(world, 3.0)  # the fetch answers again at 6 s
    assert world.tracker.states[0].in_flight == 0 and _copies(world) == 0


def test_a_lapsed_lease_is_still_redelivered_while_the_tracker_is_caught_up():
    world = _world([])
    world.cluster.append(QUEUE, 0, b"k", b"v", source="producer")
    _run(world, 0.5)
    _marker(world, Start([(0, 1)], lease_ms=int(LEASE * 1000), owner="w"))
    _run(world, 3.0)
    assert _copies(world) == 1 and world.tracker.states[0].in_flight == 0


def test_a_lapsed_lease_waits_while_the_markers_cannot_be_read_then_is_redelivered():
    # No END at all: once the fetch answers again and shows none, the message is redelivered.
    world = _world([SlowFetch(at=1.0, until=6.0, consumer="tracker#1")])
    world.cluster.append(QUEUE, 0, b"k", b"v", source="producer")
    _run(world, 0.5)
    _marker(world, Start([(0, 1)], lease_ms=int(LEASE * 1000), owner="w"))
    _run(world, 0.7)
    _marker(world, Start([(5, 1)], lease_ms=60_000, owner="w"))  # another marker the stuck fetch does not bring
    _run(world, 3.0)
    assert _copies(world) == 0  # not judged while the log holds markers it has not read
    _run(world, 3.0)
    assert _copies(world) == 1
