"""`kmq lag-job` killed with SIGKILL mid-run, stopped with SIGTERM mid-run, and
restarted from its checkpoint each time: every window reaches the sinks exactly
once (Parquet) or with identical duplicates only (metrics topic, deduplicated by
key); SIGTERM exits 0 without a stack trace."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kmq.core import markers as mk
from kmq.spark.decode import decode_batch
from kmq.core.lag_state import PartitionLagState
from kmq.spark.sinks import parquet_rows
from tests.helpers.kafka import read_all, wait_until
from tests.integration.spark.markers_workload import rec, write_records
from tests.helpers.kafka import recent_ms

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3
WINDOW_MS = 1000
T0 = recent_ms()


def phase(p: int, rng: random.Random, first_offset: int, t_start: int, n: int) -> tuple[list, int, int]:
    """``n`` markers for partition ``p``: starts, acks (some late), nacks, rejects, closes, junk."""
    out = []
    ts = t_start
    off = first_offset
    open_batches: list[tuple[int, int]] = []
    done: list[tuple[int, int]] = []
    while len(out) < n:
        ts += rng.randint(5, 120)
        roll = rng.random()
        if roll < 0.4 or not open_batches:
            size = rng.randint(1, 20)
            out.append(rec(p, ts, mk.Start(ranges=((off, size),), lease_ms=30_000, owner="w")))
            open_batches.append((off, size))
            off += size
        elif roll < 0.75:
            b = open_batches.pop(rng.randrange(len(open_batches)))
            out.append(rec(p, ts, mk.End(ranges=(b,))))
            done.append(b)
        elif roll < 0.82:
            b = open_batches.pop(0)
            out.append(rec(p, ts, mk.Nack(ranges=(b,), delay_ms=0)))
            out.append(rec(p, ts + 1, mk.Closed(ranges=(b,), outcome=mk.Outcome.REDELIVERED)))
        elif roll < 0.87:
            b = open_batches.pop(0)
            out.append(rec(p, ts, mk.Reject(ranges=(b,), reason="x")))
            out.append(rec(p, ts + 1, mk.Closed(ranges=(b,), outcome=mk.Outcome.DEAD_LETTERED)))
        elif roll < 0.92 and done:
            out.append(rec(p, ts, mk.End(ranges=(done[rng.randrange(len(done))],))))  # late ack
        elif roll < 0.95:
            out.append((p, ts, mk.encode_key(p), b"\x01"))  # malformed
        else:
            out.append(rec(p, ts, mk.Renew(ranges=(open_batches[-1],), lease_ms=30_000)))
    return out, off, ts


def model(records_by_partition: dict[int, list]) -> dict[tuple[int, int], dict]:
    """Expected window rows: the pure state machine over the records in log order."""
    want = {}
    for p, recs in records_by_partition.items():
        st = PartitionLagState(p, WINDOW_MS)
        d = decode_batch([r[0] for r in recs], list(range(len(recs))), [r[1] for r in recs],
                         [r[2] for r in recs], [r[3] for r in recs])
        closed = []
        for i in range(len(recs)):
            closed += st.apply(i, d["ts_ms"][i], d["mtype"][i], zip(d["firsts"][i], d["counts"][i]), d["outcome"][i])
        closed += st.expire(now_ms=2**62, grace_ms=0)
        for w in closed:
            row = w.as_row()
            want[(p, row.pop("window_start_ms"))] = row
    return want


class PhaseWriter:
    """Writes :func:`phase` markers for every partition to ``topic`` and keeps them (``records``) for :func:`model`."""

    def __init__(self, cfg, topic: str, seed: int) -> None:
        self.cfg, self.topic, self.rng = cfg, topic, random.Random(seed)
        self.records: dict[int, list] = {p: [] for p in range(PARTITIONS)}
        self._state = {p: (0, T0) for p in range(PARTITIONS)}

    def write(self, n: int) -> None:
        batch = []
        for p in range(PARTITIONS):
            recs, off, ts = phase(p, self.rng, self._state[p][0], self._state[p][1], n)
            self._state[p] = (off, ts + 1000)
            self.records[p].extend(recs)
            batch.extend(recs)
        write_records(self.cfg, self.topic, batch)


def _start_job(cfg_path: Path, tmp: Path, log_name: str) -> subprocess.Popen:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    args = [
        # The Python source only: a second run of these restarts on Spark's connector would add minutes
        # to the Spark tests; both sources' figures are checked in test_spark_lag_job.
        sys.executable, "-m", "kmq", "lag-job", "--config", str(cfg_path), "--source", "python",
        "--sink", "topic", "--sink", "parquet", "--parquet-path", str(tmp / "pq"),
        "--checkpoint", str(tmp / "ck"), "--trigger", "500ms", "--window", "1s", "--idle-close", "2s",
        "--max-offsets-per-trigger", "300", "--prometheus-port", "0",
        "--conf", "spark.ui.enabled=false",
    ]
    log = open(tmp / log_name, "wb")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _kill(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    proc.wait(60)


def _wait_for_every_window(job: subprocess.Popen, tmp: Path, log_name: str, windows: int) -> None:
    def complete():
        assert job.poll() is None, (tmp / log_name).read_text()[-3000:]
        try:
            return len(_rows_by_window(parquet_rows(str(tmp / "pq")))) >= windows
        except OSError:  # a batch folder being written
            return False

    wait_until(complete, timeout=150, interval=0.5, what="every window in the parquet sink")


def _batch_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.glob("batch_id=*") if any(p.glob("*.parquet")))


def _rows_by_window(rows: list[dict]) -> dict[tuple[int, int], list[dict]]:
    out: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        ws = r.get("window_start_ms")
        if ws is None:
            ws = int(r["window_start"].timestamp() * 1000)
        out.setdefault((r["partition"], ws), []).append(r)
    return out


def _run_until_batches(job: subprocess.Popen, tmp: Path, log_name: str, batches: int) -> None:
    wait_until(lambda: len(_batch_dirs(tmp / "pq")) >= batches or job.poll() is not None, timeout=120,
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
    job = _start_job(cfg_path, tmp_path, "job1.log")
    try:
        _run_until_batches(job, tmp_path, "job1.log", 2)
        _kill(job, signal.SIGKILL)  # mid-run: more than 2000 markers are still unread
    finally:
        _kill(job, signal.SIGKILL)
    write_phase(300)
    want = model(records)
    assert len(want) > 40

    job = _start_job(cfg_path, tmp_path, "job2.log")
    try:
        _run_until_batches(job, tmp_path, "job2.log", len(_batch_dirs(tmp_path / "pq")) + 2)
        job.send_signal(signal.SIGTERM)  # the process only: the JVM is its child, as in a pod
        rc = job.wait(120)
    finally:
        _kill(job, signal.SIGKILL)
    out = (tmp_path / "job2.log").read_text()
    assert rc == 0, out[-3000:]
    assert "\tat org.apache" not in out and "Traceback" not in out, out[-3000:]
    assert len(_rows_by_window(parquet_rows(str(tmp_path / "pq")))) < len(want)  # stopped mid-run

    job = _start_job(cfg_path, tmp_path, "job3.log")
    try:
        _wait_for_every_window(job, tmp_path, "job3.log", len(want))
        recs = wait_until(lambda: (lambda r: r if len({x.key for x in r}) >= len(want) else None)(
            read_all(bootstrap, q.metrics_topic)), timeout=30, what="every window in the metrics topic")
    finally:
        job.send_signal(signal.SIGTERM)
        assert job.wait(120) == 0, (tmp_path / "job3.log").read_text()[-3000:]
        _kill(job, signal.SIGKILL)

    got = _rows_by_window(parquet_rows(str(tmp_path / "pq")))
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
