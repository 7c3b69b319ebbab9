"""Random marker phases with a model of the lag job's output, and the lag job as a process a test can kill."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

from kmq.core import markers as mk
from kmq.core.lag_state import PartitionLagState
from kmq.spark.decode import decode_batch
from tests.helpers.kafka import recent_ms
from tests.integration.spark.markers_workload import rec, write_records

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


def start_job(cfg_path: Path, tmp: Path, log_name: str) -> subprocess.Popen:
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


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    proc.wait(60)


def batch_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.glob("batch_id=*") if any(p.glob("*.parquet")))


def rows_by_window(rows: list[dict]) -> dict[tuple[int, int], list[dict]]:
    out: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        ws = r.get("window_start_ms")
        if ws is None:
            ws = int(r["window_start"].timestamp() * 1000)
        out.setdefault((r["partition"], ws), []).append(r)
    return out
