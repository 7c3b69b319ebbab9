"""kmq.bench.targets judges a ``kmq bench all`` report against the performance targets.

Pure: reports are dicts written here. A figure that is missing must never count as met.
"""

from __future__ import annotations

import copy
import json

from click.testing import CliRunner

from kmq.bench import all as bench_all
from kmq.bench.targets import TARGETS, format_verdicts, judge
from tests.helpers.bench import MET


def _with(path: tuple[str, ...], value: object) -> dict:
    report = copy.deepcopy(MET)
    node = report["results"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return report


def test_a_report_meeting_every_target_is_judged_met():
    verdicts = judge(MET)
    assert [v.met for v in verdicts] == [True] * len(TARGETS), format_verdicts(verdicts)
    assert "4.5 % of a core at 10,000 partitions" in verdicts[3].measured


def test_each_limit_is_inclusive_and_one_step_past_it_fails():
    cases = [
        (0, ("consumer", "confluent", "ratio_median"), 2.99),
        (0, ("consumer", "kafka-python", "ratio_median"), 0.94),
        (1, ("tracker", "redelivery_throughput", "confluent", "copies_per_s"), 199_999),
        (2, ("aio", "ratio_to_aiokafka", "loop-run"), 0.89),
        (2, ("aio", "max_loop_late_ms", "loop-for"), 5.1),  # the plain aiokafka loop's own 3.0 + 2
        (3, ("tracker", "idle_process", "fetch_wait_500ms", "cpu_pct_of_core"), 9.0),
        (4, ("consumer_latency", "confluent", "p50_diff_ms"), 2.1),
        (4, ("consumer_latency", "confluent", "p95_diff_ms"), 0.5),
        (5, ("spark", "confluent", "markers_per_s"), 399_999),
        (5, ("spark", "confluent", "latency_window_end_to_sink_s", "p95"), 2.01),
        (6, ("consumer", "confluent", "full_gc", "kmq", "max_ms"), 5.1),
        (6, ("consumer", "kafka-python", "full_gc", "kmq", "max_ms"), 5.1),
        (6, ("aio", "full_gc", "loop-for", "max_ms"), 5.01),
        (6, ("aio", "full_gc", "aio-run", "max_ms"), 5.01),
    ]
    for index, path, value in cases:
        verdicts = judge(_with(path, value))
        assert verdicts[index].met is False, (path, value, verdicts[index])
        assert all(v.met for i, v in enumerate(verdicts) if i != index), (path, value)


def test_the_loop_is_judged_by_how_late_it_was_and_the_report_says_what_full_collections_explain():
    verdict = judge(MET)[2]
    assert "loop late at most 5.0 ms, 3.0 ms besides garbage collection (1 full collections" in verdict.measured
    # A report written before the lateness figures is not judged on the loop.
    old = copy.deepcopy(MET)
    for key in ("max_loop_late_ms", "max_loop_late_besides_gc_ms", "full_collections"):
        del old["results"]["aio"][key]
    verdict = judge(old)[2]
    assert verdict.met is None and "loop lateness not measured" in verdict.measured


def test_asyncio_is_judged_on_kmq_aio_over_aiokafka_not_on_the_threaded_bridge():
    verdict = judge(MET)[2]  # the bridge's 0.4 and 30 ms late are beside it
    assert verdict.met is True and "threaded bridge 0.400" in verdict.measured
    assert "0.910 (364,000 msg/s against 400,000 msg/s)" in verdict.measured
    # A report of the bridge only (an older kmq bench aio) does not measure the target.
    report = copy.deepcopy(MET)
    for key in ("ratio_to_aiokafka", "max_loop_late_ms"):
        for variant in ("loop-for", "loop-run"):
            del report["results"]["aio"][key][variant]
    assert judge(report)[2].met is None


def test_the_loop_may_be_as_late_as_the_plain_aiokafka_loop_plus_2_ms():
    report = _with(("aio", "max_loop_late_ms"), {"aiokafka": 30.0, "loop-for": 32.0, "loop-run": 31.0})
    assert judge(report)[2].met is True
    report["results"]["aio"]["max_loop_late_ms"]["loop-run"] = 32.1
    assert judge(report)[2].met is False
    del report["results"]["aio"]["max_loop_late_ms"]["aiokafka"]
    assert judge(report)[2].met is None


def test_latency_is_judged_on_confluent_and_kafka_python_is_shown_as_a_limit():
    report = _with(("consumer_latency", "kafka-python"), {"rate": 5000, "p50_diff_ms": 5.6, "p95_diff_ms": 22.1})
    verdict = judge(report)[4]
    assert verdict.met is True and "kafka-python p50 +5.6 ms, p95 +22.1 ms, not judged" in verdict.measured
    del report["results"]["consumer_latency"]["confluent"]
    assert judge(report)[4].met is None


def test_full_collections_are_judged_on_kmq_at_the_collectors_defaults_in_both_benchmarks():
    verdict = judge(MET)[6]
    assert verdict.met is True and "confluent kmq 4 full, max 4.5 ms (CPU 4.0 ms), p99 4.5 ms" in verdict.measured
    assert "plain loops: kafka-python plain 4 full" in verdict.measured
    # A plain loop's collections are the comparison, never the verdict.
    assert judge(_with(("consumer", "confluent", "full_gc", "plain", "max_ms"), 50.0))[6].met is True
    # A variant whose collector was tuned is not kmq's figure at the defaults: left out, and said.
    tuned = {"count": 1, "max_ms": 60.0, "p99_ms": 60.0, "default_collector": False}
    report = _with(("aio", "full_gc", "loop-run"), tuned)
    verdict = judge(report)[6]
    assert verdict.met is True and "not judged (collector tuned): aio loop-run" in verdict.measured
    # Both benchmarks' figures are needed.
    report = copy.deepcopy(MET)
    del report["results"]["aio"]["full_gc"]
    assert judge(report)[6].met is None
    report = copy.deepcopy(MET)
    for client in ("kafka-python", "confluent"):
        del report["results"]["consumer"][client]["full_gc"]
    assert judge(report)[6].met is None


def test_an_idle_figure_below_10000_partitions_does_not_meet_the_target():
    report = _with(("tracker", "idle_process", "fetch_wait_500ms", "partitions"), 1_000)
    report["results"]["tracker"]["idle_process"]["default_fetch_wait"]["partitions"] = 1_000
    assert judge(report)[3].met is False


def test_missing_figures_are_not_measured_never_met():
    for name in MET["results"]:
        report = copy.deepcopy(MET)
        del report["results"][name]
        verdicts = judge(report)
        unmeasured = [v.name for v in verdicts if v.met is None]
        assert unmeasured, f"without {name} every target still had a verdict"
        assert "not measured" in format_verdicts(verdicts)
    # A client that was not installed is reported as skipped by the benchmark: not measured either.
    skipped = _with(("consumer", "confluent"), {"skipped": "confluent-kafka not installed"})
    assert judge(skipped)[0].met is None
    assert judge({"results": {}}) == judge({})


def test_a_single_client_spark_report_is_judged_on_its_own_figures():
    report = _with(("spark",), {"client": "kafka-python", "markers_per_s": 401_000,
                                "latency_window_end_to_sink_s": {"p95": 1.9}})
    verdict = judge(report)[5]
    assert verdict.met is True and "(kafka-python)" in verdict.measured


def test_bench_all_judge_prints_the_verdicts_of_a_report(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_with(("consumer", "confluent", "ratio_median"), 1.09)))
    res = CliRunner().invoke(bench_all.command, ["--judge", str(path)])
    assert res.exit_code == 0, res.output
    assert "1. consumer pipeline" in res.output and "NOT met" in res.output and "confluent 1.090" in res.output


def test_bench_all_judge_names_a_file_that_is_not_a_report(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("[1, 2]")
    res = CliRunner().invoke(bench_all.command, ["--judge", str(path)])
    assert res.exit_code != 0 and "is not a kmq bench all report" in res.output
    path.write_text("{not json")
    res = CliRunner().invoke(bench_all.command, ["--judge", str(path)])
    assert res.exit_code != 0 and "cannot read the report" in res.output


def test_a_quick_report_is_not_judged():
    report = copy.deepcopy(MET)
    report["quick"] = True
    assert "not judged" in bench_all.judged(report) and report["targets"] is None
    report["quick"] = False
    bench_all.judged(report)
    assert [t["met"] for t in report["targets"]] == [True] * len(TARGETS)


def test_latency_is_judged_on_hand_over_started_when_the_report_has_it():
    report = copy.deepcopy(MET)
    for client in ("kafka-python", "confluent"):
        fig = report["results"]["consumer_latency"][client]
        fig.update(p50_diff_ms=6.0, p95_diff_ms=12.0)  # the default setting misses it...
        fig["started"] = {"p50_diff_ms": 1.5, "p95_diff_ms": -0.5}  # ...hand_over: started meets it
    verdict = judge(report)[4]
    assert verdict.met is True and "default hand_over committed: p50 +6.0 ms" in verdict.measured
    report["results"]["consumer_latency"]["confluent"]["started"]["p95_diff_ms"] = 0.1
    assert judge(report)[4].met is False


def test_a_report_of_both_spark_sources_is_judged_on_the_python_source_with_the_connector_beside_it():
    report = _with(("spark",), {"kafka": {"source": "kafka", "markers_per_s": 150_000,
                                          "latency_window_end_to_sink_s": {"p95": 1.7}},
                                "python": copy.deepcopy(MET["results"]["spark"])})
    verdict = judge(report)[5]
    assert verdict.met is True and "448,665 markers/s catch-up" in verdict.measured
    assert "Spark's connector 150,000 markers/s, p95 1.70 s" in verdict.measured
