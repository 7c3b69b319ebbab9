"""One local[2] SparkSession shared by every in-process Spark test (it costs ~1.8 GB and 4-8 s)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("pyspark", reason="pyspark not installed (pip install 'kmq[spark]')")


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from kmq.spark.job import JobOptions, spark_session

    session = spark_session(JobOptions(), app_name="kmq-tests", master="local[2]")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()
