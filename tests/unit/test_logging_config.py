"""``logging: {level, format, debug}`` in kmq.yaml and env, applied by the CLI entry."""

from __future__ import annotations

import io
import json
import logging

import click
import pytest
from click.testing import CliRunner

from kmq.cli.common import config_options
from kmq.config import Config, LoggingConfig
from kmq.core.errors import ConfigError
from kmq.telemetry.logs import configure_logging


@pytest.fixture(autouse=True)
def restore_root_logging():
    root, kafka = logging.getLogger(), logging.getLogger("kafka")
    handlers, level, kafka_level = list(root.handlers), root.level, kafka.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    kafka.setLevel(kafka_level)


def test_json_format_writes_one_parseable_object_per_line():
    out = io.StringIO()
    configure_logging(LoggingConfig(level="INFO", format="json"), stream=out)
    log = logging.getLogger("kmq.test")
    log.info("assigned %d partition(s)", 3, extra={"queue": "orders"})
    log.debug("not shown at INFO")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["level"], r["logger"], r["message"]) for r in lines] == [
        ("INFO", "kmq.test", "assigned 3 partition(s)"), ("ERROR", "kmq.test", "failed")]
    assert lines[0]["queue"] == "orders" and lines[0]["ts"].endswith("+00:00")
    assert "ValueError: boom" in lines[1]["exc"]


def test_verbose_flags_only_raise_the_configured_level():
    configure_logging(LoggingConfig(level="ERROR"), verbose=1, stream=io.StringIO())
    assert logging.getLogger().level == logging.INFO
    configure_logging(LoggingConfig(level="DEBUG"), verbose=0, stream=io.StringIO())
    assert logging.getLogger().level == logging.DEBUG
    assert logging.getLogger("kafka").level == logging.DEBUG
    configure_logging(LoggingConfig(level="INFO"), verbose=0, stream=io.StringIO())
    assert logging.getLogger("kafka").level == logging.CRITICAL


def test_debug_shows_the_named_loggers_at_debug_and_no_other():
    out = io.StringIO()
    names = ("kafka.producer.sender", "kmq.test.one")
    configure_logging(LoggingConfig(level="WARNING", debug=" kafka.producer.sender, kmq.test.one,"), stream=out)
    try:
        logging.getLogger("kafka.producer.sender").debug("a batch answered")
        logging.getLogger("kafka.producer.kafka").debug("each record sent")  # its parent "kafka" stays quiet
        logging.getLogger("kmq.test.one").debug("one")
        logging.getLogger("kmq.test.two").debug("two")
    finally:
        for name in names:
            logging.getLogger(name).setLevel(logging.NOTSET)
    assert [line.split(": ", 1)[1] for line in out.getvalue().splitlines()] == ["a batch answered", "one"]


def test_logging_keys_from_file_and_env_and_bad_values():
    cfg = Config.from_dict({"logging": {"level": "info"}}, {"KMQ_LOGGING__FORMAT": "json"})
    assert (cfg.logging.level, cfg.logging.format) == ("INFO", "json")
    with pytest.raises(ConfigError, match="logging.level"):
        Config.from_dict({"logging": {"level": "loud"}})
    cfg = Config.from_dict({}, {"KMQ_LOGGING__DEBUG": "kafka.producer.sender,tracker.redeliver"})
    assert cfg.logging.debug_loggers == ["kafka.producer.sender", "tracker.redeliver"]
    with pytest.raises(ConfigError, match="logging.debug.*logger names separated by commas"):
        Config.from_dict({"logging": {"debug": "kafka producer"}})


def test_cli_commands_apply_the_configured_logging(tmp_path, monkeypatch):
    # The same shape as `kmq`: a root group with -v, a command taking --config.
    @click.group()
    @click.option("-v", "--verbose", count=True)
    def root(verbose: int) -> None:
        pass

    @root.command("log-probe")
    @config_options
    def probe(cfg: Config) -> None:
        logging.getLogger("kmq.probe").info("hello from %s", "probe")
        logging.getLogger("kmq.probe").debug("debug from %s", "probe")

    config = tmp_path / "kmq.yaml"
    config.write_text("logging: {level: INFO, format: json}\n")
    res = CliRunner().invoke(root, ["log-probe", "--config", str(config)])
    assert res.exit_code == 0, res.output
    (line,) = res.stderr.splitlines()
    assert json.loads(line)["message"] == "hello from probe"
    monkeypatch.setenv("KMQ_LOGGING__FORMAT", "text")
    res = CliRunner().invoke(root, ["-vv", "log-probe", "--config", str(config)])
    assert res.stderr.splitlines()[-1].endswith("DEBUG kmq.probe: debug from probe")
