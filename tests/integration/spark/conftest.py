"""One local[2] SparkSession shared by every in-process Spark test (it costs ~1.8 GB and 4-8 s).

It is launched with Spark's Kafka connector on its classpath (the lag job's launcher, from the
jars cache), so tests of either source share it: the kmq-kafka Python source needs no jars and
is not disturbed by them. ``SOURCES`` parametrizes a test over both."""

from __future__ import annotations

import os
import sys

import pytest

#: The lag job's two markers sources (spark.source): Spark's Kafka connector and the kmq-kafka Python source.
SOURCES = pytest.mark.parametrize("source", ["kafka", "python"])

pytest.importorskip("pyspark", reason="pyspark not installed (the spark extra, kmq[spark])")


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from kmq.spark.job import JobOptions, spark_session

    session = spark_session(JobOptions(source="kafka"), app_name="kmq-tests", master="local[2]")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()
