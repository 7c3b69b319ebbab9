"""The capacity model's arithmetic (kmq.bench.capacity.plan) and the command's output."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kmq.bench.capacity import Costs, Load, plan, simulate
from kmq.cli import cli


def test_workers_follow_the_rate_with_headroom_and_are_flagged_past_the_partition_count():
    costs = Costs(worker_msgs_per_s=100_000)
    assert plan(Load(msgs_per_s=1_000_000, headroom=0.5), costs).worker_processes == 15
    assert plan(Load(msgs_per_s=1_000_000, headroom=0.0), costs).worker_processes == 10
    crowded = plan(Load(msgs_per_s=1_000_000, partitions=8, headroom=0.0), costs)
    assert any("exceed 8 partitions" in n for n in crowded.notes)


def test_failures_drive_copies_markers_and_the_tracker_replicas():
    costs = Costs(markers_per_message=0.02, tracker_copies_per_s=30_000, tracker_markers_per_s=1e9)
    calm = plan(Load(msgs_per_s=1_000_000, failure_share=0.0, headroom=0.0), costs)
    stormy = plan(Load(msgs_per_s=1_000_000, failure_share=0.1, headroom=0.0), costs)
    assert calm.copies_per_s == 0 and calm.markers_per_s == pytest.approx(20_000)
    assert stormy.copies_per_s == pytest.approx(100_000)
    # originals and copies in ranges, plus one NACK and one CLOSED record per failure
    assert stormy.markers_per_s == pytest.approx(1_100_000 * 0.02 + 200_000)
    assert (calm.tracker_replicas, stormy.tracker_replicas) == (1, 4)  # 100,000 copies/s at 30,000 each


def test_tracker_memory_counts_in_flight_work_and_timed_out_leases():
    costs = Costs(tracker_bytes_per_in_flight=40, tracker_base_mb=45, tracker_bytes_per_partition=0)
    p = plan(Load(msgs_per_s=100_000, failure_share=0.01, processing_s=0.4, ack_flush_s=0.1, lease_s=30), costs)
    assert p.tracker_in_flight == pytest.approx(100_000 * 0.5 + 1_000 * 30)
    assert p.tracker_memory_mb_each == pytest.approx(45 + p.tracker_in_flight / p.tracker_replicas * 40 / 1e6)
    assert p.crash_recovery_s == pytest.approx(p.tracker_in_flight / (p.tracker_replicas * costs.tracker_copies_per_s))


def test_each_tracker_holds_its_share_of_the_partitions():
    costs = Costs(tracker_bytes_per_in_flight=0, tracker_base_mb=30, tracker_bytes_per_partition=5_000,
                  tracker_copies_per_s=1_000)
    p = plan(Load(msgs_per_s=100_000, partitions=1000, failure_share=0.03, headroom=0.0), costs)
    assert p.tracker_replicas == 3  # 3,000 copies/s at 1,000 each
    assert p.tracker_memory_mb_each == pytest.approx(30 + 334 * 5_000 / 1e6)


def test_a_load_without_messages_is_refused():
    with pytest.raises(ValueError, match="msgs_per_s"):
        plan(Load(msgs_per_s=0))


def test_the_simulated_tracker_settles_everything_and_reports_its_step_time_and_state():
    s = simulate(partitions=4, messages=200, failure_share=0.05)
    assert s["quiet"] and s["steps"] > 0
    assert 0 < s["step_ms_p50"] <= s["step_ms_p99"] <= s["step_ms_max"]
    assert s["state_kb_end"] > 0


def test_the_command_prints_the_plan_as_json():
    res = CliRunner().invoke(cli, ["bench", "capacity", "--rate", "50000", "--partitions", "20", "--no-simulate",
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["plan"]["worker_processes"] == 1 and out["plan"]["markers_partitions"] == 20
