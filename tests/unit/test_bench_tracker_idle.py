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


def test_idle_process_measures_a_whole_tracker_process_on_the_chosen_client(monkeypatch):
    asked = {}

    def fake(partitions, client, tick_s, seconds, bootstrap, settle_s, fetch_wait_s):
        asked.update(partitions=partitions, client=client, tick_s=tick_s, seconds=seconds, bootstrap=bootstrap,
                     settle_s=settle_s, fetch_wait_s=fetch_wait_s)
        start = {"seconds": settle_s, "cpu_s": 20.5, "pct_of_core_per_window": [100.0, 39.0, 9.0]}
        return {"partitions": partitions, "client": client, "tick_ms": 100, "fetch_wait_ms": 500, "seconds": seconds,
                "cpu_pct_of_core": 3.2, "rss_mb": 80.0, "ready_s": 5.0, "start": start,
                "threads_pct_of_core": {"rdk:broker1": 2.0, "python": 1.2},
                "client_floor": {"cpu_pct_of_core": 2.5, "rss_mb": 40.0, "start": start,
                                 "threads_pct_of_core": {"rdk:broker1": 2.1}},
                "kmq_over_floor_pct_of_core": 0.7}

    monkeypatch.setattr(bench_tracker, "process_idle_cost", fake)
    result = CliRunner().invoke(bench_tracker.command, ["--idle-partitions", "300", "--idle-process", "confluent",
                                                        "--bootstrap", "127.0.0.1:9092", "--idle-seconds", "2",
                                                        "--idle-settle", "15", "--idle-fetch-wait", "0.5"])
    assert result.exit_code == 0, result.output
    assert asked == {"partitions": 300, "client": "confluent", "tick_s": 0.1, "seconds": 2.0,
                     "bootstrap": "127.0.0.1:9092", "settle_s": 15.0, "fetch_wait_s": 0.5}
    assert "3.2% of a core" in result.output and "rdk:broker1 2.0%" in result.output and "fetch wait 500 ms" in result.output
    assert "client floor  2.5% of a core" in result.output and "kmq over the floor 0.7% of a core" in result.output
    assert "tracker start   20.5 CPU-seconds in the 15s after it was ready" in result.output  # the start, apart


def test_a_thread_cpu_reading_names_this_process_threads():
    import os

    from kmq.bench.tracker_idle import _thread_cpu_s

    threads = _thread_cpu_s(os.getpid())
    assert threads and all(v >= 0 for v in threads.values())
