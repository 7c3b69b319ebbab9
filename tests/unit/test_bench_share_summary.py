"""``kmq bench share``'s figures side by side: each kmq variant against native, round by round."""

from __future__ import annotations

import math

import pytest

from kmq.bench.share import _summary


def _tp(rates: list[float], cpu_us: float) -> list[dict]:
    return [{"rate": r, "cpu_us_per_message": cpu_us, "redelivered": 0, "rss_mb": 80.0} for r in rates]


def _lat(p50: float, p99: float) -> dict:
    return {"p50_ms": p50, "p95_ms": p99 / 2, "p99_ms": p99, "measured": 100, "handled": 110, "cpu_seconds": 0.011}


@pytest.fixture
def result():
    tp = {"native": _tp([100.0, 200.0, 300.0], 1.0), "kmq-share": _tp([50.0, 50.0, 300.0], 4.0),
          "kmq": _tp([80.0, 100.0, 150.0], 2.0)}
    lat = {"native": _lat(10.0, 100.0), "kmq-share": _lat(20.0, 130.0), "kmq": _lat(5.0, 90.0),
           "native-tuned": _lat(4.0, 60.0)}
    red = {"native": {"delay_ms": [1.0, 3.0], "median_ms": 2.0, "max_ms": 3.0},
           "kmq": {"delay_ms": [50.0, 70.0], "median_ms": 60.0, "max_ms": 70.0},
           "kmq-share": {"delay_ms": [], "median_ms": None, "max_ms": None, "not_measured": "why"}}
    return _summary(tp, lat, red, {"messages": 3}, lambda *_: None)


def test_throughput_ratio_is_the_median_of_the_ratios_of_the_same_rounds(result):
    assert result["kmq_vs_native"]["throughput_ratio_per_round"] == [0.8, 0.5, 0.5]
    assert result["kmq_vs_native"]["throughput_ratio_median"] == 0.5
    assert result["kmq_share_vs_native"]["throughput_ratio_median"] == 0.5
    assert result["variants"]["native"]["msgs_per_s_median"] == 200.0


def test_latency_and_redelivery_are_differences_to_native(result):
    kmq = result["kmq_vs_native"]
    assert (kmq["p50_diff_ms"], kmq["p99_diff_ms"], kmq["p99_diff_to_tuned_native_ms"]) == (-5.0, -10.0, 30.0)
    assert kmq["redelivery_delay_diff_ms"] == 58.0
    assert kmq["cpu_per_message_ratio"] == 2.0
    assert result["native_tuned_latency"]["p99_ms"] == 60.0


def test_a_phase_not_measured_for_a_variant_is_null_with_its_reason(result):
    share = result["variants"]["kmq-share"]
    assert share["redelivery_delay_median_ms"] is None and share["redelivery_not_measured"] == "why"
    assert result["kmq_share_vs_native"]["redelivery_delay_diff_ms"] is None
    assert all(math.isfinite(v) for v in result["kmq_share_vs_native"]["throughput_ratio_per_round"])
