"""``kmq bench consumer --tuned-gc`` runs KmqConsumer once more in a process whose garbage
collector is tuned as ``kmq work``'s is, and reports it against the default (present and
positive; the values are not judged on a shared machine). The tuned run must really have had
the tuned threshold, and the default run the interpreter's own."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kmq.config.process import GEN0_THRESHOLD

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_bench_consumer_tuned_gc_reports_the_tuned_run_against_the_default(bootstrap):
    proc = subprocess.run(
        [sys.executable, "-m", "kmq", "bench", "consumer", "--tuned-gc", "--messages", "3000", "--rounds", "1",
         "--bootstrap", bootstrap, "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("gc_median", "gc_ratio_median", "gc_cpu_per_message_ratio_median", "kmq_median"):
        assert isinstance(result[key], float) and math.isfinite(result[key]) and result[key] > 0, key
    fresh = subprocess.run([sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert result["gc_gen0"] == {"kmq": int(fresh), "kmq-gc": GEN0_THRESHOLD}
    assert "collector tuned" in proc.stdout
    # Each variant's full collections, and whether its collector was at the defaults (the GC target's figures).
    assert set(result["full_gc"]) == {"plain", "kmq", "kmq-gc"}
    assert result["full_gc"]["kmq"]["default_collector"] is True
    assert result["full_gc"]["kmq-gc"]["default_collector"] is False
    assert all(f["count"] >= 0 and f["max_ms"] >= f["p99_ms"] >= 0 for f in result["full_gc"].values())
