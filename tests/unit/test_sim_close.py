"""A worker's close in the middle of a take for iteration (the simulator's ``CloseDuringTake`` fault).

The workers hand over through the consumer's real ReadyQueue and TakeAhead and close through the
product's close code (kmq.consumer.close_ready); a close that cuts a take must leave every message
the take brought with a handler or given back to the group.
"""

from __future__ import annotations

from collections import deque

import pytest

from kmq.consumer.take_ahead import TakeAhead
from kmq.dev.sim import FaultPlan, SimCluster, SlowFetch
from kmq.dev.sim.faults import CloseDuringTake
from kmq.dev.sim.invariants import check
from kmq.dev.sim.search import (
    MAX_STEPS, QUIET_BOUND_S, SEARCH_WORKLOAD, fault_plan, quiet_actors, run_seed,
)
from kmq.dev.sim.shrink import shrink
from kmq.dev.sim.workload import Workload
from kmq.dev.sim.world import World

# Workers without ordering: key (no take-ahead there), one worker closed twice while messages come in. A take
# brings more than one message only from a backlog: fetches that return nothing for a while make one.
UNKEYED = Workload(ordering_share=0.0, hand_over_started_share=0.0)
CLOSES = FaultPlan([SlowFetch(2.0, 5.0), SlowFetch(11.0, 14.0), CloseDuringTake(3.0, "w0"), CloseDuringTake(12.0, "w0"),
                    CloseDuringTake(4.0, "w1")])


@pytest.fixture(autouse=True)
def _quiet_tracker():
    with quiet_actors():
        yield


def _run(seed: int, plan: FaultPlan, workload: Workload = UNKEYED) -> tuple[World, list]:
    cluster = SimCluster(seed, plan, latency=(0.0005, 0.005))
    world = World(cluster, workload, seed)
    quiet, _ = world.run(until=workload.produce_over + QUIET_BOUND_S, quiet_after=workload.produce_over,
                         max_steps=MAX_STEPS)
    violations, _ = check(world, quiet)
    return world, violations


class StrandingTakeAhead(TakeAhead):
    """The defect fixed in take_ahead.py: what a take brings is kept once taken, whether or not a close
    came meanwhile (the close put back only what was held before), so it is handed to nobody and given
    back to nobody."""

    def keep(self, messages, leased_at, gen):
        if messages:
            with self._lock:
                self._held.append([deque(messages), leased_at, gen])


# Seed 2: the close's commit back, made while a commit forward of the same step was in flight, once
# landed before it in the simulator (the coordinator answers in order): the messages given back were
# left below the committed offset, under their hand-off lease, and came back 5 minutes later (overdue).
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_close_during_a_take_gives_every_message_it_brought_to_a_handler_or_back_to_the_group(seed):
    world, violations = _run(seed, CLOSES)
    assert violations == [], [v.detail for v in violations]
    history = world.cluster.history
    cut = [line for line in history if "closes while a take of" in line]
    closed = [line for line in history if "ready message(s) given back)" in line]
    assert len(cut) == 3 and len(closed) == 3, cut  # each fault cut one take of more than one message, once
    assert all(int(line.split("take of ")[1].split()[0]) >= 2 for line in cut)
    # The rest of the cut take went back into the ready queue and to the group with what was ready.
    assert all(int(line.split("closed (")[1].split()[0]) >= 1 for line in closed)
    # Each closed worker came back and the work finished: every message acked or dead-lettered.
    assert sum("restarted as" in line for line in history) >= 3


def test_the_search_catches_a_take_ahead_that_strands_its_rest_at_a_close_and_shrinks_to_the_close(monkeypatch):
    import kmq.dev.sim.worker as worker

    monkeypatch.setattr(worker, "TakeAhead", StrandingTakeAhead)
    world, violations = _run(0, CLOSES)
    stranded = [v for v in violations if v.invariant == "stranded-by-close"]
    assert stranded, [v.invariant for v in violations]
    assert "neither handed to a handler nor given back" in stranded[0].detail
    # The message's history says what happened, on the timeline a failing seed prints.
    notes = world.notes[stranded[0].message]
    assert any("closes while taking" in n for n in notes) and any("neither handed" in n for n in notes)
    # Shrunk, with other faults around it: the close alone still strands a message.
    plan = FaultPlan([*fault_plan(0, UNKEYED).faults, *CLOSES.faults])
    r = run_seed(0, UNKEYED, faults=plan)
    assert not r.ok and r.violations[0].invariant == "stranded-by-close", r.describe()
    shrunk = shrink(r, UNKEYED, max_runs=40)
    assert shrunk.invariant == "stranded-by-close"
    assert 1 <= len(shrunk.result.faults) < len(plan)
    kept = shrunk.result.faults.faults
    assert sum(isinstance(f, CloseDuringTake) for f in kept) == 1 and len(kept) <= 2, shrunk.describe()
    assert "CloseDuringTake(at=" in shrunk.describe() and "closes while taking" in shrunk.describe()


def test_the_search_draws_a_close_during_a_take_in_some_seeds_on_a_stream_of_its_own():
    plans = {seed: fault_plan(seed, SEARCH_WORKLOAD).faults for seed in range(200)}
    with_close = [s for s, faults in plans.items() if any(isinstance(f, CloseDuringTake) for f in faults)]
    assert 30 <= len(with_close) <= 70  # about a quarter
    for s in with_close:
        closes = [f for f in plans[s] if isinstance(f, CloseDuringTake)]
        assert len(closes) == 1 and closes[0].worker in {"w0", "w1"} and 1.0 <= closes[0].at <= 20.0


def test_with_ordering_by_key_the_close_fault_cuts_no_take():
    keyed = Workload(ordering_share=1.0)
    world, violations = _run(0, CLOSES, keyed)
    assert world.ordered and violations == []
    assert not any("closes while a take" in line for line in world.cluster.history)
