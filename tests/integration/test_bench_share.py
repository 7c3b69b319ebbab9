"""``kmq bench consumer --share`` runs the share-API variant beside KmqConsumer and reports its
figures (present and positive; their values are not judged on a shared machine)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_bench_consumer_share_reports_the_share_api_against_kmq(bootstrap):
    proc = subprocess.run(
        [sys.executable, "-m", "kmq", "bench", "consumer", "--share", "--messages", "3000", "--rounds", "1",
         "--bootstrap", bootstrap, "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("share_median", "share_ratio_median", "share_cpu_per_message_ratio_median", "kmq_median"):
        assert isinstance(result[key], float) and math.isfinite(result[key]) and result[key] > 0, key
    assert len(result["share_ratio_per_round"]) == 1
    assert "share API median" in proc.stdout
