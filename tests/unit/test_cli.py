"""CLI manners: --version, --help everywhere, exit codes, one-line errors."""

from __future__ import annotations

import subprocess
import sys
import time

import click
import pytest
from click.testing import CliRunner

import kmq
from kmq.cli import cli


def _all_commands(group: click.Group, ctx: click.Context, prefix=()):
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, click.Context(cmd, parent=ctx), prefix + (name,))


def test_version():
    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0 and kmq.__version__ in res.output


def test_every_command_has_help():
    ctx = click.Context(cli)
    paths = [p for p, _ in _all_commands(cli, ctx)]
    assert ("topics", "create") in paths and ("dev", "broker") in paths
    for path in paths:
        res = CliRunner().invoke(cli, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        assert "Usage:" in res.output


def test_usage_error_exits_2():
    res = CliRunner().invoke(cli, ["topics", "create"])
    assert res.exit_code == 2 and "Missing argument" in res.output


def test_bad_config_is_one_line_exit_1(tmp_path):
    bad = tmp_path / "kmq.yaml"
    bad.write_text("queues: [{name: q, lease: soon}]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "kmq", "topics", "describe", "q", "--config", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == ["Error: queues[0].lease: expected a duration like 30s, got 'soon'"]
    assert "Traceback" not in proc.stderr


@pytest.mark.integration
def test_unreachable_broker_is_one_line_exit_1():
    from kmq.dev.broker import free_port

    proc = subprocess.run(
        [sys.executable, "-m", "kmq", "topics", "describe", "q", "--bootstrap", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60, env={**__import__("os").environ, "KMQ_KAFKA__CONNECT_TIMEOUT": "1s"},
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach Kafka" in lines[0] and "kmq dev broker" in lines[0], proc.stderr


@pytest.mark.parametrize("command", [["status", "q"], ["dlq", "list", "q"], ["dlq", "replay", "q", "--dry-run"],
                                     ["trace", "q", "q/0/1"], ["topics", "create", "q"], ["topics", "describe", "q"],
                                     ["produce", "q", "--count", "1"]])
def test_a_refused_connection_is_reported_at_once_not_after_the_connect_timeout(command):
    from kmq.dev.broker import free_port

    env = {**__import__("os").environ, "KMQ_KAFKA__CONNECT_TIMEOUT": "30s"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kmq", *command, "--bootstrap", f"127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, timeout=90, env=env)
    took = time.monotonic() - started
    assert proc.returncode == 1 and "connection refused by 127.0.0.1:" in proc.stderr, proc.stderr
    # The clients retry a refused connection for the whole connect timeout (30 s here); the check
    # before them answers in the time it takes to start the interpreter.
    assert took < 15, f"{command} took {took:.1f}s to report a refused connection"


def test_import_kmq_does_not_import_pyspark_or_redis():
    # pyspark belongs to the lag job only; redis (~8 MB RSS) to IdempotencyGuard only.
    code = "import sys, kmq; print(any(m.split('.')[0] in ('pyspark', 'redis') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
