"""``kmq bench tracker --idle-partitions``: the real tracker loop on idle stand-ins runs and reports."""

from __future__ import annotations

from click.testing import CliRunner

from kmq.bench import tracker as bench_tracker
from kmq.bench.tracker_idle import idle_cost


def test_the_idle_run_steps_the_real_tracker_over_every_partition_and_reports_per_partition_figures():
    figures = idle_cost(partitions=50, tick_s=0.01, seconds=0.3)
    assert figures["partitions"] == 50 and figures["steps"] > 0
    assert set(figures) >= {"cpu_pct_of_core", "cpu_ms_per_step", "rss_mb", "rss_kb_per_partition"}


def test_the_command_prints_the_idle_cost_line():
    result = CliRunner().invoke(bench_tracker.command, ["--idle-partitions", "20", "--idle-tick", "0.01",
                                                        "--idle-seconds", "1"])
    assert result.exit_code == 0, result.output
    assert "% of a core with 20 partitions" in result.output and "KB per partition" in result.output
