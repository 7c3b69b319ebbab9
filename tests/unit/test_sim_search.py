"""The simulator's search for lost messages: deterministic, quiet on kmq as it is, and able to find a defect.

No broker: the whole world (producer, kmq workers, the tracker's real
redelivery step) runs on a :class:`~kmq.dev.sim.SimCluster` in simulated time.
"""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from kmq.cli import cli
from kmq.client.api import ReadResult
from kmq.core.ranges import RangeSet, missing
from kmq.dev.sim import ClockSkew, FaultPlan, LeaderChange, SimCluster, SimLogReader
from kmq.dev.sim.search import ORDERED_SHARE, SEARCH_WORKLOAD, quiet_actors, run_seed, search
from kmq.dev.sim.shrink import ddmin, shrink
from kmq.dev.sim.workload import SERVICE, STEP, Workload
from tracker import service as tracker_service

# About 80 s on the 2-core CI machine (about 20 schedules/s alone with the service loop; slower under load).
LONG_SEEDS = range(1000, 2600)
# The planted defect is found within this budget (at seed 0 or 3: see StaleEndReader).
PLANTED_BUDGET = range(0, 40)


@pytest.fixture(autouse=True)
def _quiet_tracker():
    with quiet_actors():
        yield


class StaleEndReader:
    """The planted defect: a log reader that takes a cached high-water mark, refreshed at most every
    ``stale_s`` simulated seconds, as the end of the log, and reports the offsets written since as
    missing from the log, as if deleted (the tracker closes them as MISSING). With a one-second cache,
    most seeds lose messages (the first at seed 0 with the service loop, 3 with the step alone)."""

    says_end = False  # True: it says where its read ended, as the real readers do (LaggingEndReader)

    def __init__(self, cluster: SimCluster, stale_s: float = 1.0) -> None:
        # Not named as the tracker's reader: the search's LaggingRead faults lag that one, and this
        # reader's own end is the defect (a lagged read under it would say end = mark without the records).
        self.real = SimLogReader(cluster, "planted-reader")
        self.cluster = cluster
        self.stale_s = stale_s
        self.cached: dict[tuple[str, int], tuple[float, int]] = {}

    def read(self, topic, partition, ranges):
        ranges = list(ranges)
        result = self.real.read(topic, partition, ranges)
        seen_at, mark = self.cached.get((topic, partition), (-1e9, 0))
        if self.cluster.t() - seen_at >= self.stale_s:
            seen_at, mark = self.cluster.t(), self.cluster.log(topic, partition).high_water
            self.cached[(topic, partition)] = (seen_at, mark)
        found = {o: r for o, r in result.records.items() if o < mark}
        wanted = RangeSet(ranges).ranges()
        end = mark if self.says_end and wanted and wanted[-1].last >= mark else None
        return ReadResult(found, missing(wanted, found), end)

    def high_waters(self, starts):
        return self.real.high_waters(starts)

    def log_ends(self, starts):
        return self.real.log_ends(starts)

    def partition_count(self, topic):
        return self.real.partition_count(topic)

    def release(self):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("loop", [SERVICE, STEP])
def test_the_same_seed_gives_the_same_history_and_another_seed_another(loop):
    a, b, c = run_seed(7, Workload(tracker_loop=loop)), run_seed(7, Workload(tracker_loop=loop)), \
        run_seed(8, Workload(tracker_loop=loop))
    assert a.digest == b.digest and a.steps == b.steps
    assert a.digest != c.digest


@pytest.mark.parametrize("loop", [SERVICE, STEP])
def test_a_few_seeds_find_no_violation(loop):
    report = search(range(20), Workload(tracker_loop=loop, ordering_share=ORDERED_SHARE))
    assert not report.failures, report.failures[0].describe()
    assert all(r.quiet for r in report.results)


@pytest.mark.slow
@pytest.mark.timeout(900)  # 1,600 schedules: about 170 s on a loaded 2-core machine, 300 s is too near
def test_a_long_search_finds_no_violation():
    report = search(LONG_SEEDS, SEARCH_WORKLOAD)
    assert not report.failures, "\n\n".join(r.describe() for r in report.failures[:3])


@pytest.mark.parametrize("loop", [SERVICE, STEP])
def test_the_search_finds_a_planted_stale_high_water_in_the_tracker_reader(loop):
    report = search(PLANTED_BUDGET, Workload(tracker_loop=loop), reader=StaleEndReader, stop_at_first=True)
    assert report.failures, f"the planted defect went unnoticed over seeds {PLANTED_BUDGET}"
    failed = report.failures[0]
    lost = [v for v in failed.violations if v.invariant == "lost"]
    assert lost, failed.describe()
    text = failed.describe()
    # What a failure prints: the seed, the fault plan, and the lost message's history with the MISSING close.
    assert f"seed {failed.seed}:" in text and "fault plan:" in text
    assert f"history of {lost[0].message}:" in text and "CLOSED by the tracker: missing" in text
    # Deterministic: the same seed fails the same way again.
    again = run_seed(failed.seed, Workload(tracker_loop=loop), reader=StaleEndReader)
    assert again.digest == failed.digest and [v.message for v in again.violations] == [v.message for v in failed.violations]


class LaggingEndReader(StaleEndReader):
    """A reader whose read ends at a high-water mark that lags (a new leader's after a leader change),
    and says so: it also reports what it did not reach as missing, as the readers once did. The rule
    that nothing at or past the end a read ran into is closed makes it lose nothing; before it,
    this was the planted defect above."""

    says_end = True


@pytest.mark.parametrize("loop", [SERVICE, STEP])
def test_a_reader_whose_end_lags_behind_the_log_loses_nothing(loop):
    report = search(PLANTED_BUDGET, Workload(tracker_loop=loop), reader=LaggingEndReader)
    lost = [v for r in report.failures for v in r.violations if v.invariant == "lost"]
    assert not lost, next(r for r in report.failures if not r.ok).describe()


def test_a_failing_plan_is_shrunk_to_the_fewest_faults_that_still_fail():
    w = Workload()
    failed = next(r for r in (run_seed(seed, w, reader=StaleEndReader) for seed in PLANTED_BUDGET) if not r.ok)
    assert len(failed.faults) > 1
    shrunk = shrink(failed, w, reader=StaleEndReader)
    r = shrunk.result
    # The stale reader loses messages without any fault: nothing of the plan is needed.
    assert len(r.faults) == 0 and {v.invariant for v in r.violations} == {"lost"}
    assert 1 <= shrunk.runs <= 10
    text = shrunk.describe()
    assert text.startswith(f"shrunk: 0 of {len(failed.faults)} fault(s) still break lost")
    lost = next(v.message for v in r.violations if v.invariant == "lost")
    # The message's history is kmq trace's timeline: its copies, STARTs and the tracker's CLOSED.
    assert f"history of {lost}:" in text and "START by w" in text and "final state: missing" in text
    # The shrunk plan replays to the same run.
    assert run_seed(failed.seed, w, reader=StaleEndReader, faults=r.faults).digest == r.digest


def test_ddmin_finds_the_faults_that_together_make_the_failure():
    calls = []

    def fails(sub):
        calls.append(list(sub))
        return {3, 7} <= set(sub)

    assert ddmin(list(range(10)), fails) == [3, 7]
    assert list(range(10)) not in calls
    assert ddmin([1, 2], lambda sub: True) == []  # fails with nothing at all


def test_the_sim_command_prints_each_seed_and_a_summary():
    levels = {n: logging.getLogger(n).level for n in ("tracker", "kmq.consumer")}
    res = CliRunner().invoke(cli, ["sim", "--seeds", "3", "--start", "5", "--messages", "10"])
    assert res.exit_code == 0, res.output
    # It quiets the expected warnings while it runs, and leaves the process's logging as it found it.
    assert {n: logging.getLogger(n).level for n in levels} == levels
    assert "seed 5: ok" in res.output and "seed 7: ok" in res.output
    assert "3 seed(s) [5..7], 0 with violations" in res.output and "schedules/s" in res.output


def test_a_worker_whose_start_names_other_offsets_is_caught_committing_past_unstarted_records(monkeypatch):
    import kmq.dev.sim.worker as worker

    real_start = worker.Start

    def misplaced_start(ranges, **kw):  # the planted defect: START names offsets the worker did not take
        return real_start([(first + 1000, count) for first, count in ranges], **kw)

    monkeypatch.setattr(worker, "Start", misplaced_start)
    r = run_seed(0, Workload(messages=10))
    kinds = {v.invariant for v in r.violations}
    assert "commit-without-start" in kinds, r.describe()


@pytest.mark.parametrize("loop", [SERVICE, STEP])
def test_a_tracker_that_dead_letters_on_the_first_timeout_is_caught(monkeypatch, loop):
    import kmq.dev.sim.world as world

    class Impatient(world.PartitionState):  # the planted defect: max_deliveries taken as 1
        def __init__(self, backoff, max_deliveries, **kw):
            super().__init__(backoff, 1, **kw)

    monkeypatch.setattr(world, "PartitionState", Impatient)
    monkeypatch.setattr(tracker_service, "PartitionState", Impatient)
    report = search(range(10), Workload(tracker_loop=loop), stop_at_first=True)
    assert report.failures, "an early dead letter went unnoticed"
    kinds = {v.invariant for v in report.failures[0].violations}
    assert "early-dead-letter" in kinds, report.failures[0].describe()


# Clocks apart (a worker 20 s behind, another 25 s ahead, the tracker set 15 s forward then 30 s back) and
# a markers partition's leader moving: the tracker judges leases on its own clock and looks its ends up
# fresh, so nothing is copied while leased, early or late past the checks' allowance.
@pytest.mark.parametrize("seed", [1, 33])
def test_skewed_clocks_and_a_leader_change_break_nothing(seed):
    plan = FaultPlan([ClockSkew(0.0, "w0", -20.0), ClockSkew(0.0, "w1", 25.0), ClockSkew(4.0, "tracker", 15.0),
                      ClockSkew(12.0, "tracker", -30.0), LeaderChange(5.0, 9.0, "q__markers", 0)])
    r = run_seed(seed, faults=plan)
    assert r.ok, r.describe()
