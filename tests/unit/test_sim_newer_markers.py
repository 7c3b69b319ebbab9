"""A rolling upgrade half done in the simulator (the ``NewerMarkers`` fault): one worker's host runs a
later kmq, whose markers are of the next wire version with a field appended; this version must read
them by the fields it knows (docs/protocol.md, "Rolling upgrades")."""

from __future__ import annotations

from collections import Counter

import pytest

from kmq.core.markers import VERSION, End, Nack, Reject, Renew, Start, decode, encode
from kmq.core.ranges import OffsetRange
from kmq.dev.sim import FaultPlan, SimCluster, SimProducer
from kmq.dev.sim.faults import NEWER_FIELD, NewerMarkers, newer_marker
from kmq.dev.sim.invariants import check
from kmq.dev.sim.search import MAX_STEPS, QUIET_BOUND_S, SEARCH_WORKLOAD, fault_plan, quiet_actors
from kmq.dev.sim.world import World

R = (OffsetRange(3, 2),)
MARKERS = [Start(R, lease_ms=2000, owner="w1"), End(R), Renew(R, 5000), Nack(R, 250), Nack(R, 0, counted=False),
           Reject(R, "bad")]


@pytest.fixture(autouse=True)
def _quiet_tracker():
    with quiet_actors():
        yield


@pytest.mark.parametrize("marker", MARKERS, ids=lambda m: type(m).__name__)
def test_a_marker_of_the_next_version_reads_as_the_marker_it_was(marker):
    value = newer_marker(encode(marker))
    assert value[0] == VERSION + 1 and value.endswith(NEWER_FIELD)
    assert decode(value) == marker


def test_only_the_hosts_markers_change_and_only_from_the_faults_time():
    c = SimCluster(seed=1, faults=FaultPlan([NewerMarkers(5.0, "w1")]))
    for topic in ("q", "q__markers"):
        c.create_topic(topic, 1)
    upgraded, other = SimProducer(c, "w1-markers"), SimProducer(c, "w0-markers")
    end = encode(End(R))
    upgraded.send("q__markers", end, partition=0)  # before the fault's time
    c.clock.advance(5.0)
    upgraded.send("q__markers", end, partition=0)
    upgraded.send("q__markers", b"not a marker", partition=0)
    upgraded.send("q", end, partition=0)  # not a markers topic
    other.send("q__markers", end, partition=0)
    for p in (upgraded, other):
        p.flush()
    written = [r.value for r in c.log("q__markers", 0).read(0, 10)]
    assert written == [end, newer_marker(end), b"not a marker", end]
    assert [r.value for r in c.log("q", 0).read(0, 10)] == [end]


def test_the_search_draws_a_newer_worker_in_some_seeds_on_a_stream_of_its_own():
    plans = {seed: fault_plan(seed, SEARCH_WORKLOAD).faults for seed in range(200)}
    newer = {s: [f for f in faults if isinstance(f, NewerMarkers)] for s, faults in plans.items()}
    drawn = [s for s, fs in newer.items() if fs]
    assert 20 <= len(drawn) <= 60  # about a fifth
    assert all(len(newer[s]) == 1 and newer[s][0].host in {"w0", "w1"} for s in drawn)


def test_a_world_whose_workers_write_newer_markers_loses_nothing_and_copies_nothing_early():
    plan = FaultPlan([NewerMarkers(0.0, "w0"), NewerMarkers(0.0, "w1")])
    cluster = SimCluster(3, plan, latency=(0.0005, 0.005))
    world = World(cluster, SEARCH_WORKLOAD, 3)
    quiet, _ = world.run(until=SEARCH_WORKLOAD.produce_over + QUIET_BOUND_S, quiet_after=SEARCH_WORKLOAD.produce_over,
                         max_steps=MAX_STEPS)
    violations, _ = check(world, quiet)
    assert violations == []
    versions = Counter(r.value[0] for p in range(SEARCH_WORKLOAD.partitions)
                       for r in cluster.log("q__markers", p).read(0, 100_000) if r.value)
    # Every message STARTed and settled by the upgraded workers; the tracker's CLOSED markers stay version 1.
    assert versions[VERSION + 1] >= SEARCH_WORKLOAD.messages and versions[1] > 0
