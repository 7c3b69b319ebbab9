"""`kmq lag-job` argument handling (nothing here starts Spark)."""

from __future__ import annotations

import sys

from click.testing import CliRunner

from kmq.cli import cli
from kmq.spark.job import _summary


def test_help_lists_the_options_without_importing_pyspark():
    before = "pyspark" in sys.modules
    res = CliRunner().invoke(cli, ["lag-job", "--help"])
    assert res.exit_code == 0, res.output
    for opt in ("--source", "--sink", "--checkpoint", "--trigger", "--window", "--parquet-path"):
        assert opt in res.output
    assert ("pyspark" in sys.modules) == before


def test_usage_errors_exit_2():
    r = CliRunner().invoke(cli, ["lag-job", "--sink", "parquet"])
    assert r.exit_code == 2 and "--parquet-path" in r.output
    r = CliRunner().invoke(cli, ["lag-job", "--trigger", "soon"])
    assert r.exit_code == 2 and "duration" in r.output
    r = CliRunner().invoke(cli, ["lag-job", "--source", "jdbc"])
    assert r.exit_code == 2


def test_error_summary_prefers_the_kmq_error_line():
    text = ("[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed\nTraceback (most recent call last):\n"
            '  File "x", line 1\nkmq.spark.source.SourceError: topic \'x\' does not exist\n\tat org.apache.Foo')
    assert _summary(Exception(text)) == "kmq.spark.source.SourceError: topic 'x' does not exist"
    assert _summary(Exception("java.lang.IllegalStateException: boom")) == "java.lang.IllegalStateException: boom"
