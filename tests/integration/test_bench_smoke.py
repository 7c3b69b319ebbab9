"""``kmq bench all --quick`` runs every benchmark and reports a figure for each.

``kmq bench aio`` once broke silently after a merge because no test ran the
bench commands. This runs the real command as a user would (a subprocess,
against the session broker) and checks that each section produced its
figures: present, finite and positive, and that its output (stdout and
stderr, the Spark JVM's included: it inherits them) carries no Java stack
trace and no Python traceback (a normal stop of the Spark benchmark once
printed about a thousand lines of them: kmq/spark/stopping.py). Their values
are not judged here
(timings are not pass/fail on a shared 2-core machine; the README's figures
come from full runs). About 100-115 s here (2 cores shared), most of it group joins
and Spark's start.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark not installed (the spark extra, kmq[spark]): bench all runs the lag job")
pytest.importorskip("confluent_kafka", reason="confluent-kafka not installed: bench all runs both clients")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ("kafka-python", "confluent")

# Per section, the figures the README and the report's readers use (paths into its result).
FIGURES: dict[str, list[tuple[str, ...]]] = {
    "consumer": [(c, k) for c in CLIENTS for k in ("plain_median", "kmq_median", "ratio_median")],
    "consumer_latency": [(c, "median", v, "p50_ms") for c in CLIENTS for v in ("plain", "kmq")],
    "aio": [(k, v) for k in ("median_msgs_per_s",) for v in ("threads", "aio-for", "aio-run")]
           + [("ratio_to_threads", v) for v in ("aio-for", "aio-run")],
    "overload": [("goodput_msgs_per_s",), ("goodput_ratio",), ("drain_seconds",)],
    "tracker": [("throughput", "messages_per_s"), ("memory", "contiguous", "rss_mb"), ("memory", "holes", "rss_mb"),
                ("redelivery_delay", "p99_ms"), ("recovery", "ready_s"), ("recovery", "replayed")]
               + [("redelivery_throughput", c, "copies_per_s") for c in CLIENTS],
    "spark": [("markers_per_s",), ("latency_window_end_to_sink_s", "p50"), ("live_windows",)],
}


# What a normal run must never print: a Java stack trace (frames, an uncaught exception, the
# cancelled-job error of a query stopped mid-batch, the overflow of a deep trace) or a Python traceback.
NOISE = ("\tat org.apache", "Exception in thread", "SPARK_JOB_CANCELLED", "StackOverflowError", "Traceback")


def _noise(name: str, text: str) -> list[str]:
    """Each NOISE marker found in ``text``, with the lines around its first occurrence."""
    found = []
    lines = text.splitlines()
    for marker in NOISE:
        at = next((i for i, line in enumerate(lines) if marker in line), None)
        if at is not None:
            context = "\n".join(lines[max(0, at - 3):at + 8])
            found.append(f"{name} has {marker!r} (line {at + 1}):\n{context}")
    return found


def _at(result: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result


def _is_figure(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_bench_all_quick_reports_a_figure_for_every_section(bootstrap, tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",  # Spark binds loopback, not the host's address
           "PYSPARK_PYTHON": sys.executable}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "kmq", "bench", "all", "--quick", "--bootstrap", bootstrap,
                          "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    took = time.monotonic() - t0
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    noise = _noise("stdout", res.stdout) + _noise("stderr", res.stderr)
    assert not noise, "kmq bench all --quick printed a stack trace:\n\n" + "\n\n".join(noise)
    report = json.loads(out.read_text())
    assert report["quick"] is True
    assert report["skipped"] == {}, report["skipped"]  # every extra is in the dev install
    results = report["results"]
    assert set(results) == set(FIGURES)
    missing = {f"{name}.{'.'.join(path)}": _at(results[name], path)
               for name, paths in FIGURES.items() for path in paths if not _is_figure(_at(results[name], path))}
    assert not missing, f"figures missing or not finite and > 0: {missing}"
    assert report["targets"] is None and "targets: not judged on a --quick run" in res.stdout
    walls = ", ".join(f"{name} {r['wall_seconds']}s" for name, r in results.items())
    print(f"kmq bench all --quick: {took:.0f} s ({walls})")


def test_bench_badday_small_loses_nothing_and_every_process_survives(tmp_path):
    """``kmq bench badday`` at a small scale, on its own durable broker (the broker-kill phase needs
    one it may SIGKILL): every phase comes, nothing is lost, no process dies. About 30 s here."""
    from kmq.bench.badday import run

    lines: list[str] = []
    result = run(messages=200, lease="3s", processing_ms=10, freeze="2s", outage="5s", timeout=120,
                 workdir=str(tmp_path / "badday"), echo=lines.append)
    report = "\n".join(lines)
    assert [p["phase"] for p in result["phases"]][:7] == [
        "worker a started", "worker b joined (rebalance)", "worker b frozen (SIGSTOP)", "worker b resumed (SIGCONT)",
        "broker killed (SIGKILL)", "broker restarted", "worker a stopped (SIGTERM)"], report
    assert result["originals"] == 200 + result["hostile"], report
    assert result["lost"] == 0, report
    assert all(result["alive"].values()) and result["replaced_exit_code"] == 0, report
    assert result["ok"], report
