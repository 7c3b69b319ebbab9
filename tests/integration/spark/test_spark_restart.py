"""`kmq lag-job` killed with SIGKILL mid-run, stopped with SIGTERM mid-run, and
restarted from its checkpoint each time: every window reaches the sinks exactly
once (Parquet) or with identical duplicates only (metrics topic, deduplicated by
key); SIGTERM exits 0 without a stack trace."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from kmq.spark.sinks import parquet_rows
from tests.helpers.kafka import read_all, wait_until
from tests.integration.spark.restart_workload import (
    PARTITIONS, PhaseWriter, batch_dirs, kill_group, model, rows_by_window, start_job,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]


def _wait_for_every_window(job: subprocess.Popen, tmp: Path, log_name: str, windows: int) -> None:
    def complete():
        assert job.poll() is None, (tmp / log_name).read_text()[-3000:]
        try:
            return len(rows_by_window(parquet_rows(str(tmp / "pq")))) >= windows
        except OSError:  # a batch folder being written
            return False

    wait_until(complete, timeout=150, interval=0.5, what="every window in the parquet sink")


def _run_until_batches(job: subprocess.Popen, tmp: Path, log_name: str, batches: int) -> None:
    wait_until(lambda: len(batch_dirs(tmp / "pq")) >= batches or job.poll() is not None, timeout=120,
               interval=0.2, what=f"{batches} batches in the parquet sink")
    assert job.poll() is None, (tmp / log_name).read_text()[-3000:]


def test_sigkill_then_sigterm_then_restart_neither_lose_nor_double_count(queue_topics, bootstrap, tmp_path):
    """Three runs from one checkpoint: SIGKILL mid-run; SIGTERM mid-run (as Kubernetes sends it:
    exit 0, no Java or Python stack trace; the batch refused at the stop is re-run); then to the
    end. Every window reaches Parquet exactly once and the metrics topic with identical
    duplicates only (deduplicated by key)."""
    cfg, q = queue_topics(partitions=PARTITIONS)
    cfg_path = tmp_path / "kmq.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.to_dict()))
    workload = PhaseWriter(cfg, q.markers_topic, seed=42)
    records, write_phase = workload.records, workload.write

    write_phase(700)
    job = start_job(cfg_path, tmp_path, "job1.log")
    try:
        _run_until_batches(job, tmp_path, "job1.log", 2)
        kill_group(job, signal.SIGKILL)  # mid-run: more than 2000 markers are still unread
    finally:
        kill_group(job, signal.SIGKILL)
    write_phase(300)
    want = model(records)
    assert len(want) > 40

    job = start_job(cfg_path, tmp_path, "job2.log")
    try:
        _run_until_batches(job, tmp_path, "job2.log", len(batch_dirs(tmp_path / "pq")) + 2)
        job.send_signal(signal.SIGTERM)  # the process only: the JVM is its child, as in a pod
        rc = job.wait(120)
    finally:
        kill_group(job, signal.SIGKILL)
    out = (tmp_path / "job2.log").read_text()
    assert rc == 0, out[-3000:]
    assert "\tat org.apache" not in out and "Traceback" not in out, out[-3000:]
    assert len(rows_by_window(parquet_rows(str(tmp_path / "pq")))) < len(want)  # stopped mid-run

    job = start_job(cfg_path, tmp_path, "job3.log")
    try:
        _wait_for_every_window(job, tmp_path, "job3.log", len(want))
        recs = wait_until(lambda: (lambda r: r if len({x.key for x in r}) >= len(want) else None)(
            read_all(bootstrap, q.metrics_topic)), timeout=30, what="every window in the metrics topic")
    finally:
        job.send_signal(signal.SIGTERM)
        assert job.wait(120) == 0, (tmp_path / "job3.log").read_text()[-3000:]
        kill_group(job, signal.SIGKILL)

    got = rows_by_window(parquet_rows(str(tmp_path / "pq")))
    assert set(got) == set(want)
    doubled = {k: len(v) for k, v in got.items() if len(v) != 1}
    assert doubled == {}, "windows written twice to parquet"
    for key, exp in want.items():
        (row,) = got[key]
        assert {k: row[k] for k in exp if k != "window_end_ms"} == {k: v for k, v in exp.items() if k != "window_end_ms"}, key

    by_key: dict[str, list[dict]] = {}
    for r in recs:
        v = json.loads(r.value)
        v.pop("batch_id")
        by_key.setdefault(r.key.decode(), []).append(v)
    assert set(by_key) == {f"{p}:{w}" for p, w in want}
    for (p, w), exp in want.items():
        values = by_key[f"{p}:{w}"]
        assert all(v == values[0] for v in values), "a re-sent window differs from its first copy"
        assert {k: values[0][k] for k in exp} == exp
