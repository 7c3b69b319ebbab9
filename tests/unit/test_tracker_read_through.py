"""The tracker judges a lease over only when it has read every marker written before its end.

A tracker that falls behind its markers partition (a slow or stuck fetch, a burst of markers
larger than it reads per step) still sees the wall clock move. Judging a START's deadline by
the wall clock alone, it redelivers messages whose END is in the log but not yet read: a
duplicate each time, and a message acked on every delivery can even be dead-lettered as
"timeout after max_deliveries". Run on the simulated cluster, so the tracker's own step
(tracker.service.Tracker.step) is driven in virtual time and the stuck fetch is exact.
"""

from __future__ import annotations

from kmq.config import Config
from kmq.core.lease_state import PartitionState
from kmq.core.markers import End, Start, encode, encode_key
from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.faults import FaultPlan, SlowFetch
from kmq.dev.sim.workload import QUEUE, Workload
from kmq.dev.sim.world import World
from tracker.partition import OwnedPartition

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


def _started(faults) -> World:
    """One queue record whose START (lease 1 s) the tracker read at about 0.5 s."""
    world = _world(faults)
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
    o.wants_end(5_000)
    assert o.horizon(5_000) == 1_000 and o.mark is None


def test_a_partition_read_to_the_end_is_read_through_at_the_look_up():
    o = _owned(12)
    o.end_read(2_000, 12)
    assert o.horizon(5_000) == 2_000 and o.horizon(1_500) == 1_500
