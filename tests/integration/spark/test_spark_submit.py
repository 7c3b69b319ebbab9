"""The lag job runs under spark-submit with kmq shipped as a --py-files zip."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kmq.core import markers as mk
from kmq.spark.bundle import build_bundle
from kmq.spark.sinks import parquet_rows
from tests.helpers.kafka import wait_until
from tests.integration.spark.markers_workload import rec, write_records

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]


def test_spark_submit_with_zipped_package(queue_topics, tmp_path):
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        submit = shutil.which("spark-submit")
    assert submit, "spark-submit comes with pyspark"
    cfg, q = queue_topics(partitions=1)
    cfg_path = tmp_path / "kmq.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.to_dict()))
    t0 = 1_700_000_000_000
    write_records(cfg, q.markers_topic, [
        rec(0, t0 + 10, mk.Start(ranges=((0, 5),), lease_ms=1000, owner="w")),
        rec(0, t0 + 20, mk.End(ranges=((0, 5),))),
        rec(0, t0 + 5_000, mk.Start(ranges=((5, 1),), lease_ms=1000, owner="w")),
    ])
    zpath, main = build_bundle(tmp_path / "bundle")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(
        [str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false", "--py-files", str(zpath), str(main),
         "--config", str(cfg_path), "--sink", "parquet", "--parquet-path", str(tmp_path / "pq"),
         "--checkpoint", str(tmp_path / "ck"), "--trigger", "500ms", "--window", "1s", "--idle-close", "1s"],
        stdout=open(tmp_path / "submit.log", "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    try:
        def two_windows():
            assert proc.poll() is None, (tmp_path / "submit.log").read_text()[-3000:]
            try:
                return len(parquet_rows(str(tmp_path / "pq"))) >= 2
            except OSError:
                return False

        wait_until(two_windows, timeout=120, interval=0.5, what="two windows written under spark-submit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    rows = sorted(parquet_rows(str(tmp_path / "pq")), key=lambda r: r["window_start"])
    assert [(r["markers_start"], r["markers_end"], r["acked"], r["in_flight"]) for r in rows] == [(1, 1, 5, 0), (1, 0, 0, 1)]
