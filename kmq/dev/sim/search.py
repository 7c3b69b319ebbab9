"""The search for lost messages: one schedule per seed, checked by :mod:`kmq.dev.sim.invariants`.

For each seed: a :class:`~kmq.dev.sim.faults.FaultPlan` drawn from it (every
kind but retention, whose deletions lose messages by design), a
:class:`~kmq.dev.sim.world.World` on a fresh :class:`SimCluster`, run while
the faults happen and then on until it is quiet (bounded), then the
invariants. Same seed, same history: :attr:`SeedResult.digest` is the
SHA-256 of the cluster's history, in which the actors write too.

::

    report = search(range(100), Workload(partitions=2, messages=40))
    assert not report.failures, report.failures[0].describe()
"""

from __future__ import annotations

import logging
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.faults import (
    FOREIGN_MARKER, HUNG, ClockSkew, CloseDuringTake, FaultPlan, LaggingRead, LeaderChange, NewerMarkers,
    OpenTransaction,
    ProduceFault, ProducerGoesFatal, Retention, SlowRead, UnexpectedRecord,
)
from kmq.dev.sim.invariants import Violation, check
from kmq.dev.sim.timeline import timeline
from kmq.dev.sim.workload import SERVICE, Workload
from kmq.dev.sim.world import GROUP, QUEUE, TRACKER, TRACKER_READER, World

__all__ = ["SeedResult", "SearchReport", "fault_plan", "run_seed", "search", "SEARCH_WORKLOAD", "ORDERED_SHARE", "STARTED_SHARE",
           "READ_COMMITTED_SHARE", "quiet_actors"]

# Faults start within this many seconds; the world then runs on, quiet or not, for QUIET_BOUND_S more.
FAULT_HORIZON_S = 40.0
FAULT_COUNT = 6
# Seeds whose plan stalls one queue partition's reads, and how long (past the readers' 10 s timeout).
SLOW_READ_SHARE = 0.3
SLOW_READ_SPAN_S = (15.0, 60.0)
# Seeds whose workers run with consumer.ordering: key (Workload.ordering_share).
ORDERED_SHARE = 0.3
# Of the other seeds, those whose workers run with consumer.hand_over: started (Workload.hand_over_started_share).
STARTED_SHARE = 0.5
# Seeds whose workers read read_committed, as librdkafka's default (Workload.read_committed_share).
READ_COMMITTED_SHARE = 0.3
#: The workload the search runs unless given another.
SEARCH_WORKLOAD = Workload(ordering_share=ORDERED_SHARE, hand_over_started_share=STARTED_SHARE,
                           read_committed_share=READ_COMMITTED_SHARE)
# Seeds (of those without a stalled read) where another program writes a marker of a type kmq does not
# know to a markers partition while messages are in flight (FOREIGN_MARKER).
FOREIGN_MARKER_SHARE = 0.25
# Seeds (of those without a stalled read) where the tracker's producer hears nothing back about its copies
# for a while, past its delivery timeout (HUNG), and how long such sends go on.
HUNG_SHARE = 0.25
HUNG_SPAN_S = (0.5, 5.0)
# Seeds (of those without a stalled read) where the tracker's reads of one queue partition end below its
# high-water mark for a while (LaggingRead: a new leader's), and how long.
LAGGING_READ_SHARE = 0.25
LAGGING_READ_SPAN_S = (3.0, 12.0)
# Seeds (of those without a stalled read) where a markers partition's leader moves: the tracker's fetches of it
# wait and its consumer's cached mark stays put (LeaderChange), and how long.
LEADER_CHANGE_SHARE = 0.25
LEADER_CHANGE_SPAN_S = (2.0, 10.0)
# Seeds (of those without a stalled read) where the producer writes some messages to a queue partition in a
# transaction (OpenTransaction), how long it stays open, how many messages, and the share aborted.
TRANSACTION_SHARE = 0.25
TRANSACTION_SPAN_S = (1.0, 20.0)
TRANSACTION_RECORDS = (1, 5)
TRANSACTION_ABORT_SHARE = 0.5
# Seeds (service loop) where a worker's host clock reads off from the start, and where the tracker's is set
# forward or back mid-run (ClockSkew), and by how much (within the 60 s a replayed lease allows).
CLOCK_SKEW_SHARE = 0.25
CLOCK_JUMP_SHARE = 0.15
CLOCK_SKEW_S = (2.0, 30.0)
# Seeds (service loop) where the tracker's producer goes fatal once (ProducerGoesFatal) while copies are made.
PRODUCER_FATAL_SHARE = 0.2
# Seeds where one worker's consumer is closed from another thread in the middle of a take for iteration
# (CloseDuringTake), some time while the producer sends.
CLOSE_DURING_TAKE_SHARE = 0.25
# Seeds where one worker's host runs a later kmq from some time on: its markers are of the next wire version
# (NewerMarkers, a rolling upgrade half done).
NEWER_MARKERS_SHARE = 0.2
QUIET_BOUND_S = 600.0
MAX_STEPS = 400_000


@dataclass
class SeedResult:
    """One schedule's outcome; :meth:`describe` is what a failure prints."""

    seed: int
    violations: list[Violation]
    digest: str
    steps: int
    quiet: bool
    sim_seconds: float
    plan: str
    histories: dict[str, list[str]] = field(default_factory=dict)
    faults: FaultPlan = field(default_factory=FaultPlan)  # the plan itself (``plan`` is its description)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        state = "ok" if self.ok else f"{len(self.violations)} violation(s)"
        return (f"seed {self.seed}: {state}; {self.steps} steps, {self.sim_seconds:.1f} simulated s, "
                f"digest {self.digest[:12]}")

    def describe(self, max_messages: int = 3) -> str:
        lines = [self.summary(), "fault plan:", *(f"  {f}" for f in (self.plan.splitlines() or ["(none)"]))]
        for v in self.violations:
            lines.append(f"violation {v.invariant}: {v.detail}")
        shown = [v.message for v in self.violations if v.message is not None][:max_messages]
        for mid in dict.fromkeys(shown):
            lines.append(f"history of {mid}:")
            lines.extend(f"  {h}" for h in self.histories.get(mid, []))
        return "\n".join(lines)


@dataclass
class SearchReport:
    """Every seed's result and the rate."""

    results: list[SeedResult]
    wall_seconds: float

    @property
    def failures(self) -> list[SeedResult]:
        return [r for r in self.results if not r.ok]

    @property
    def rate(self) -> float:
        """Schedules per wall-clock second."""
        return len(self.results) / self.wall_seconds if self.wall_seconds > 0 else float("inf")


def fault_plan(seed: int, workload: Workload) -> FaultPlan:
    """The seed's faults over the world's topics, workers and tracker, retention left out.

    In :data:`SLOW_READ_SHARE` of the seeds (drawn from the seed on a stream of its own, so the
    other seeds keep their plans) one queue partition's reads stall for a long while
    (:class:`SlowRead`, past the readers' timeout; in ``workload.slow_markers_share`` of them its
    markers partition's, whose end the tracker looks up) and at most two other faults happen: the
    partitions around it stay clean long enough for the liveness check to bite. With the service
    loop only: the order of partitions is the service's, and the simulator's loop around the
    redelivery step alone, serving them in partition order, holds every actor up (the world runs
    one actor at a time) for a stuck read after another, long enough for the workers' sessions to
    expire, which real workers, heartbeating from their own processes, would not see.

    In :data:`FOREIGN_MARKER_SHARE` of the other seeds (a stream of its own too) a record with a
    marker's header and ranges but a type kmq does not know is written to a markers partition
    while the producer sends (:data:`~kmq.dev.sim.faults.FOREIGN_MARKER`): readers must skip it; and
    in :data:`HUNG_SHARE` of them (another stream) the tracker's copies get no answer at all for a
    while (:data:`~kmq.dev.sim.faults.HUNG`, written or not): the tracker must take such a send
    for undecided, never for sent; and in :data:`LAGGING_READ_SHARE` (another stream) the
    tracker's reads of one queue partition end below its high-water mark for a while
    (:class:`~kmq.dev.sim.faults.LaggingRead`): what a START names past that end must be read
    again, never closed as missing; and in :data:`LEADER_CHANGE_SHARE` (another stream) a markers
    partition's leader moves (:class:`~kmq.dev.sim.faults.LeaderChange`): the tracker's fetches of
    it wait and its consumer's cached mark stays put, and nothing may be copied whose END or RENEW
    was written in time meanwhile; and in :data:`TRANSACTION_SHARE` (another stream) the producer
    writes its next messages to a queue partition in a transaction that stays open for a while,
    then commits or aborts it (:class:`~kmq.dev.sim.faults.OpenTransaction`): nothing a worker was
    handed may be lost, whichever isolation level the workers read at (read committed in
    :data:`READ_COMMITTED_SHARE` of the seeds, :class:`~kmq.dev.sim.workload.Workload`). With the
    service loop, in :data:`CLOCK_SKEW_SHARE` of all seeds (a stream of their own) a worker's clock
    reads off by 2 to 30 s either way from the start, and in :data:`CLOCK_JUMP_SHARE` (another) the
    tracker's is set that far forward or back mid-run (:class:`~kmq.dev.sim.faults.ClockSkew`): leases are judged on the tracker's clock; and in
    :data:`PRODUCER_FATAL_SHARE` (another) the tracker's producer goes fatal once
    (:class:`~kmq.dev.sim.faults.ProducerGoesFatal`): it must be replaced, and nothing it did not
    have acknowledged is taken for sent. In :data:`CLOSE_DURING_TAKE_SHARE` of all seeds (a
    stream of their own) one worker's consumer is closed in the middle of a take for iteration
    (:class:`~kmq.dev.sim.faults.CloseDuringTake`): every message the take brought must reach a
    handler or go back to the group. In :data:`NEWER_MARKERS_SHARE` of all seeds (a stream of
    their own) one worker's host runs a later kmq from some time on
    (:class:`~kmq.dev.sim.faults.NewerMarkers`): its markers are of the next wire version, with a
    field appended, and must be read by the fields this version knows."""
    parts = workload.partitions
    drawn = FaultPlan.random(seed, topics={QUEUE: parts, f"{QUEUE}__markers": parts, f"{QUEUE}__dlq": parts},
                             consumers=[*(f"w{i}" for i in range(workload.workers)), TRACKER], group=GROUP,
                             horizon=FAULT_HORIZON_S, count=FAULT_COUNT)
    faults = [f for f in drawn.faults if not isinstance(f, Retention)]
    rng = random.Random(f"slow-read-{seed}")
    if workload.tracker_loop == SERVICE and rng.random() < SLOW_READ_SHARE:
        at = round(rng.uniform(0.0, workload.produce_over / 2), 3)
        until = round(at + rng.uniform(*SLOW_READ_SPAN_S), 3)
        slow = SlowRead(at, until, QUEUE, rng.randrange(parts))
        if random.Random(f"slow-markers-{seed}").random() < workload.slow_markers_share:
            # Its markers partition instead: the tracker's look-ups of its end get no answer.
            slow = SlowRead(at, until, f"{QUEUE}__markers", slow.partition)
        faults = [slow, *faults[:rng.randint(0, 2)]]
    else:
        foreign = random.Random(f"foreign-marker-{seed}")
        if foreign.random() < FOREIGN_MARKER_SHARE:
            faults.append(UnexpectedRecord(round(foreign.uniform(1.0, workload.produce_over), 3),
                                           f"{QUEUE}__markers", foreign.randrange(parts), FOREIGN_MARKER))
        hung = random.Random(f"hung-ack-{seed}")
        if hung.random() < HUNG_SHARE:
            at = round(hung.uniform(2.0, workload.produce_over + 10.0), 3)
            faults.append(ProduceFault(at, round(at + hung.uniform(*HUNG_SPAN_S), 3), QUEUE, None,
                                       hung.random() < 0.5, HUNG, 0.0, TRACKER))
        lagging = random.Random(f"lagging-read-{seed}")
        if lagging.random() < LAGGING_READ_SHARE:
            at = round(lagging.uniform(2.0, workload.produce_over), 3)
            faults.append(LaggingRead(at, round(at + lagging.uniform(*LAGGING_READ_SPAN_S), 3), QUEUE,
                                      lagging.randrange(parts), TRACKER_READER))
        leader = random.Random(f"leader-change-{seed}")
        if leader.random() < LEADER_CHANGE_SHARE:
            at = round(leader.uniform(2.0, workload.produce_over), 3)
            faults.append(LeaderChange(at, round(at + leader.uniform(*LEADER_CHANGE_SPAN_S), 3), f"{QUEUE}__markers",
                                       leader.randrange(parts)))
        txn = random.Random(f"transaction-{seed}")
        if txn.random() < TRANSACTION_SHARE:
            at = round(txn.uniform(1.0, workload.produce_over), 3)
            faults.append(OpenTransaction(at, round(at + txn.uniform(*TRANSACTION_SPAN_S), 3), QUEUE,
                                          txn.randrange(parts), txn.randint(*TRANSACTION_RECORDS),
                                          txn.random() >= TRANSACTION_ABORT_SHARE))
    if workload.tracker_loop == SERVICE:  # the step loop alone applies markers at their record time
        skew = random.Random(f"clock-skew-{seed}")
        if skew.random() < CLOCK_SKEW_SHARE:
            faults.append(ClockSkew(0.0, f"w{skew.randrange(workload.workers)}",
                                    round(skew.choice((-1, 1)) * skew.uniform(*CLOCK_SKEW_S), 3)))
        jump = random.Random(f"clock-jump-{seed}")
        if jump.random() < CLOCK_JUMP_SHARE:
            faults.append(ClockSkew(round(jump.uniform(1.0, workload.produce_over), 3), TRACKER,
                                    round(jump.choice((-1, 1)) * jump.uniform(*CLOCK_SKEW_S), 3)))
        fatal = random.Random(f"producer-fatal-{seed}")
        if fatal.random() < PRODUCER_FATAL_SHARE:
            faults.append(ProducerGoesFatal(round(fatal.uniform(2.0, workload.produce_over + 10.0), 3), TRACKER))
    close = random.Random(f"close-during-take-{seed}")
    if close.random() < CLOSE_DURING_TAKE_SHARE:
        faults.append(CloseDuringTake(round(close.uniform(1.0, workload.produce_over), 3),
                                      f"w{close.randrange(workload.workers)}"))
    newer = random.Random(f"newer-markers-{seed}")
    if newer.random() < NEWER_MARKERS_SHARE:
        faults.append(NewerMarkers(round(newer.uniform(0.0, workload.produce_over), 3),
                                   f"w{newer.randrange(workload.workers)}"))
    return FaultPlan(faults)


def run_seed(seed: int, workload: Workload = SEARCH_WORKLOAD, *, reader: Callable[[SimCluster], Any] | None = None,
             faults: FaultPlan | None = None) -> SeedResult:
    """Run one schedule and check it (``reader`` replaces the tracker's log reader, to plant a defect)."""
    plan = fault_plan(seed, workload) if faults is None else faults
    cluster = SimCluster(seed, plan, latency=(0.0005, 0.005))
    world = World(cluster, workload, seed, reader=reader)
    faults_end = max([getattr(f, "until", f.at) for f in plan.faults] + [workload.produce_over])
    quiet, steps = world.run(until=faults_end + QUIET_BOUND_S, quiet_after=faults_end, max_steps=MAX_STEPS)
    violations, _ = check(world, quiet)
    histories = {v.message: timeline(world, v.message) for v in violations if v.message is not None}
    return SeedResult(seed, violations, cluster.digest(), steps, quiet, cluster.t(), plan.describe(), histories, plan)


def search(seeds: Iterable[int], workload: Workload = SEARCH_WORKLOAD, *,
           reader: Callable[[SimCluster], Any] | None = None, stop_at_first: bool = False,
           on_result: Callable[[SeedResult], None] | None = None) -> SearchReport:
    """Run every seed (or up to the first violation); ``on_result`` sees each result as it comes."""
    began = time.perf_counter()
    results = []
    for seed in seeds:
        r = run_seed(seed, workload, reader=reader)
        results.append(r)
        if on_result is not None:
            on_result(r)
        if stop_at_first and not r.ok:
            break
    return SearchReport(results, time.perf_counter() - began)


@contextmanager
def quiet_actors() -> Iterator[None]:
    """The tracker's and the workers' warnings (sends and commits retried under the faults) are
    expected in a search: at ERROR only inside the block, as they were found after it (a search
    may run inside another program: tests, a notebook)."""
    loggers = [logging.getLogger(n) for n in ("tracker", "kmq.consumer")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
