"""The lag job runs under spark-submit with kmq shipped as a --py-files zip: on Spark's Kafka
connector given with --packages (as docs/spark.md shows), and without it, stopping with the
--packages argument to add."""

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
from kmq.spark import connector as cn
from kmq.spark.bundle import build_bundle
from kmq.spark.sinks import parquet_rows
from tests.helpers.kafka import wait_until
from tests.integration.spark.markers_workload import rec, write_records
from tests.helpers.kafka import recent_ms

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]


def _submit() -> str:
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        submit = shutil.which("spark-submit")
    assert submit, "spark-submit comes with pyspark"
    return str(submit)


def _job_args(cfg_path: Path, tmp_path: Path, zpath: Path, main: Path, spark_args: list[str]) -> list[str]:
    return [_submit(), "--master", "local[2]", "--conf", "spark.ui.enabled=false", *spark_args, "--py-files", str(zpath),
            str(main), "--config", str(cfg_path), "--sink", "parquet", "--parquet-path", str(tmp_path / "pq"),
            "--checkpoint", str(tmp_path / "ck"), "--trigger", "500ms", "--window", "1s", "--idle-close", "1s"]


def test_spark_submit_with_zipped_package_on_sparks_connector(queue_topics, tmp_path, kafka_broker):
    cfg, q = queue_topics(partitions=1)
    cfg_path = tmp_path / "kmq.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.to_dict()))  # spark.source: kafka, the default
    t0 = recent_ms()
    write_records(cfg, q.markers_topic, [
        rec(0, t0 + 10, mk.Start(ranges=((0, 5),), lease_ms=1000, owner="w")),
        rec(0, t0 + 20, mk.End(ranges=((0, 5),))),
        rec(0, t0 + 5_000, mk.Start(ranges=((5, 1),), lease_ms=1000, owner="w")),
    ], one_per_batch=kafka_broker.is_tansu)  # tests.helpers.kafka.LATEST_OFFSET_GAP
    zpath, main = build_bundle(tmp_path / "bundle")
    # --packages as on a cluster, resolved from the jars cache the launcher keeps (no download here).
    packages = cn.prepare(cfg.spark.jars_cache, cfg.spark.maven_repository, cn.installed())
    spark_args = ["--packages", packages.pop("spark.jars.packages")]
    for k, v in packages.items():
        spark_args += ["--conf", f"{k}={v}"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(_job_args(cfg_path, tmp_path, zpath, main, spark_args),
                            stdout=open(tmp_path / "submit.log", "wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
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


def test_spark_submit_without_the_connector_names_the_packages_to_add(queue_topics, tmp_path):
    cfg, q = queue_topics(partitions=1)
    cfg_path = tmp_path / "kmq.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.to_dict()))
    zpath, main = build_bundle(tmp_path / "bundle")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    out = subprocess.run(_job_args(cfg_path, tmp_path, zpath, main, []), capture_output=True, text=True, env=env,
                         timeout=180)
    assert out.returncode == 1, out.stderr[-3000:]
    said = [ln for ln in (out.stdout + out.stderr).splitlines() if "--packages" in ln]
    assert len(said) == 1, (out.stdout + out.stderr)[-3000:]
    assert f"--packages {cn.installed().coordinate} to spark-submit" in said[0] and "--source python" in said[0]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
