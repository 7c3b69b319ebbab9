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
        (2, ("aio", "ratio_to_aiokafka", "aio-run"), 0.89),
        (2, ("aio", "max_loop_late_ms", "aio-for"), 5.1),
        (3, ("tracker", "idle_process", "fetch_wait_500ms", "cpu_pct_of_core"), 9.0),
        (4, ("consumer_latency", "confluent", "p50_diff_ms"), 2.1),
        (4, ("consumer_latency", "kafka-python", "p95_diff_ms"), 0.5),
        (5, ("spark", "confluent", "markers_per_s"), 399_999),
        (5, ("spark", "confluent", "latency_window_end_to_sink_s", "p95"), 2.01),
    ]
    for index, path, value in cases:
        verdicts = judge(_with(path, value))
        assert verdicts[index].met is False, (path, value, verdicts[index])
        assert all(v.met for i, v in enumerate(verdicts) if i != index), (path, value)


def test_the_loop_is_judged_by_how_late_it_was_and_the_report_says_what_full_collections_explain():
    verdict = judge(MET)[2]
    assert "loop late at most 5.0 ms, 3.0 ms besides garbage collection (1 full collections" in verdict.measured
    # A report written before the lateness figures is judged on its largest gap, which includes the
    # ticker's own 5 ms sleep.
    old = copy.deepcopy(MET)
    for key in ("max_loop_late_ms", "max_loop_late_besides_gc_ms", "full_collections"):
        del old["results"]["aio"][key]
    verdict = judge(old)[2]
    assert verdict.met is False and "largest loop gap 10.0 ms" in verdict.measured


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
