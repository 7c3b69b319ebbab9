"""The simulator's liveness checks: a partition whose reads stall must not starve the others, and the
tracker must not drop its view for a slow step. Each planted defect is an old rule of the tracker,
put back for the test only (monkeypatched), which the search must find."""

from __future__ import annotations


import pytest
from click.testing import CliRunner

from kmq.cli import cli
from kmq.dev.sim import FaultPlan, SimCluster, SlowRead
from kmq.dev.sim.liveness import serve_bound
from kmq.dev.sim.search import quiet_actors, run_seed
from kmq.dev.sim.workload import SERVICE, STEP, Workload
from kmq.dev.sim.world import World
from tracker import service
from tracker.partition import OwnedPartition

# Seeds within which each planted defect is found (see the tests; with both the starvation first shows at seed 31).
BUDGET = range(0, 100)


@pytest.fixture(autouse=True)
def _quiet_tracker():
    with quiet_actors():
        yield


def plant_drop_after_a_long_step(monkeypatch) -> None:
    """The old rule: a partition's redelivery step longer than the session timeout dropped the view of
    every partition, even when it copied nothing (a read of an unreachable partition timing out)."""
    real = service.Tracker._redeliver

    def old_rule(self, owned, items):
        began = self._mono()
        copies = real(self, owned, items)
        took = self._mono() - began
        if took > self.cfg.kafka.session_timeout:
            self._drop_view(f"a redelivery step of {owned.topic}[{owned.partition}] took {took:.1f}s")
        return copies

    monkeypatch.setattr(service.Tracker, "_redeliver", old_rule)


def plant_earliest_due_first(monkeypatch) -> None:
    """The old order: due partitions served earliest due first (the partition that failed last goes
    first again) instead of least recently served first."""
    monkeypatch.setattr(OwnedPartition, "served", property(lambda self: 0.0, lambda self, value: None),
                        raising=False)


def first_violation(kind: str, seeds=BUDGET):
    for seed in seeds:
        r = run_seed(seed, Workload(tracker_loop=SERVICE))
        if any(v.invariant == kind for v in r.violations):
            return r
    return None


@pytest.mark.parametrize("loop", [SERVICE, STEP])
def test_a_partition_whose_reads_stall_for_a_minute_delays_the_others_but_does_not_starve_them(loop):
    w = Workload(messages=80, produce_over=60.0, tracker_loop=loop)
    r = run_seed(3, w, faults=FaultPlan([SlowRead(5.0, 65.0, "q", 0)]))
    assert r.ok, r.describe()
    # One stuck read (10 s and the poll past it), the queue's 2 s backoff and 2 s of slack.
    assert serve_bound(World(SimCluster(0), w, 0)) == pytest.approx(14.2)


def test_the_old_rule_and_order_together_starve_the_other_partitions_and_are_caught(monkeypatch):
    plant_drop_after_a_long_step(monkeypatch)
    plant_earliest_due_first(monkeypatch)
    r = first_violation("overdue")
    assert r is not None, f"the starved partition went unnoticed over seeds {BUDGET}"
    text = r.describe()
    assert "SlowRead(" in text and "violation overdue:" in text and "with no fault on its partition" in text


def test_the_old_rule_alone_is_caught_dropping_the_view_for_a_slow_step(monkeypatch):
    plant_drop_after_a_long_step(monkeypatch)
    r = first_violation("view-dropped")
    assert r is not None, f"the needless view drops went unnoticed over seeds {BUDGET}"
    assert "kmq_tracker_stale_views_total" in r.describe()


def test_the_old_order_alone_is_caught_serving_a_partition_twice_behind_a_stalled_one(monkeypatch):
    plant_earliest_due_first(monkeypatch)
    assert first_violation("overdue") is not None, f"the late partition went unnoticed over seeds {BUDGET}"


def test_the_sim_command_shrinks_a_starved_partition_to_the_slow_read_alone(monkeypatch):
    plant_drop_after_a_long_step(monkeypatch)
    plant_earliest_due_first(monkeypatch)
    res = CliRunner().invoke(cli, ["sim", "--start", "31", "--seeds", "1"])
    assert res.exit_code == 1, res.output
    assert "violation overdue:" in res.output and "history of m" in res.output
    shrunk = res.output.split("shrunk: ", 1)[1]
    assert shrunk.startswith("1 of 1 fault(s) still break overdue")
    plan = shrunk.split("fault plan:\n", 1)[1].split("violation ", 1)[0].strip().splitlines()
    assert len(plan) == 1 and plan[0].startswith("SlowRead(at=2.666, until=")
