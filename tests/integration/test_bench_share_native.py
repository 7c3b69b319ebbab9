"""``kmq bench share`` starts its own Apache Kafka, runs the three variants (native share group,
kmq.share, KmqConsumer) through all four phases with tiny numbers, and prints every figure as
JSON on its last line (present and finite; their values are not judged on a shared machine)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PER_VARIANT = ("msgs_per_s_median", "cpu_us_per_message_median", "p50_ms", "p95_ms", "p99_ms")
RATIOS = ("throughput_ratio_median", "cpu_per_message_ratio", "p50_diff_ms", "p99_diff_ms")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_bench_share_reports_native_kmq_share_and_kmq_side_by_side():
    if shutil.which("java") is None:
        if os.environ.get("CI"):
            pytest.fail("no Java runtime: kmq bench share starts Apache Kafka, which needs Java 17+ "
                        "(scripts/test.sh installs it)")
        pytest.skip("no Java runtime: kmq bench share starts Apache Kafka, which needs Java 17+")
    proc = subprocess.run(
        [sys.executable, "-m", "kmq", "bench", "share", "--messages", "3000", "--rounds", "1", "--rate", "200",
         "--rate-seconds", "2", "--samples", "1", "--json"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for variant in ("native", "kmq-share", "kmq"):
        figures = result["variants"][variant]
        for key in PER_VARIANT:
            assert _finite(figures[key]), (variant, key, figures[key])
        assert len(figures["msgs_per_s"]) == 1
    for variant in ("native", "kmq"):
        figures = result["variants"][variant]
        assert _finite(figures["redelivery_delay_median_ms"]) and _finite(figures["redelivery_delay_max_ms"]), variant
        assert len(figures["redelivery_delay_ms"]) == 1
    assert result["variants"]["kmq-share"]["redelivery_not_measured"]
    for name in ("kmq_share_vs_native", "kmq_vs_native"):
        for key in RATIOS:
            assert _finite(result[name][key]), (name, key)
    assert _finite(result["kmq_vs_native"]["redelivery_delay_diff_ms"])
    assert all(_finite(result["native_tuned_latency"][k]) for k in ("p50_ms", "p95_ms", "p99_ms"))
    assert "KmqConsumer/native" in proc.stdout
