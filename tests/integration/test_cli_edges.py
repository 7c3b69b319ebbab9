"""Edges of the command line on the real broker: a taken HTTP port is one line and exit 3,
``kmq trace -o json``, ``kmq dlq replay --dry-run`` and ``-o json``, progress without ``\\r``
when stderr is no terminal."""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner
from kafka import KafkaProducer

from kmq.cli import cli
from tests.helpers.kafka import produce

pytestmark = pytest.mark.integration


@pytest.fixture
def taken_port():
    """A loopback port held by a listening socket for the test."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


def _config_file(tmp_path, cfg, **tracker) -> str:
    import yaml

    path = tmp_path / "kmq.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": cfg.kafka.bootstrap_servers},
        "queues": [{"name": q.name} for q in cfg.queues],
        "tracker": {"group_id": cfg.tracker.group_id, **tracker},
        "consumer": {"group_id": cfg.consumer.group_id},
    }))
    return str(path)


def test_a_taken_tracker_port_is_one_line_and_exit_3(queue_topics, tmp_path, taken_port):
    cfg, _q = queue_topics(1)
    res = CliRunner().invoke(cli, ["tracker", "run", "--http-host", "127.0.0.1",
                                   "--config", _config_file(tmp_path, cfg, http_port=taken_port)])
    assert res.exit_code == 3, res.output  # kmq.cli.EXIT_CANNOT_LISTEN
    assert f"cannot listen on 127.0.0.1:{taken_port}" in res.output and "tracker.http_port" in res.output
    _one_error_line(res.output)


def _one_error_line(output: str) -> None:
    """The failure is one line (log lines of the start-up may come before it), no traceback."""
    assert "Traceback" not in output, output
    assert [line for line in output.splitlines() if line.startswith("Error:")] == [output.strip().splitlines()[-1]]


def test_a_taken_worker_metrics_port_is_one_line_and_exit_3(queue_topics, taken_port):
    cfg, q = queue_topics(1)
    res = CliRunner().invoke(cli, ["work", q.name, "--metrics-port", str(taken_port), "--max-messages", "1",
                                   "--bootstrap", cfg.kafka.bootstrap_servers])
    assert res.exit_code == 3, res.output
    assert f"cannot listen on 127.0.0.1:{taken_port}" in res.output and "--metrics-port" in res.output
    _one_error_line(res.output)


def test_a_taken_ui_port_is_the_same_one_line_and_exit_3(taken_port):
    pytest.importorskip("uvicorn", reason="kmq ui needs the ui extra")
    res = CliRunner().invoke(cli, ["ui", "--port", str(taken_port)])
    assert res.exit_code == 3, res.output
    assert res.output == f"Error: kmq ui cannot listen on 127.0.0.1:{taken_port}: Address already in use; " \
                         "pick another --port/--host\n"


def test_trace_json_with_o_and_plain_progress_lines_off_a_terminal(queue_topics):
    cfg, q = queue_topics(1)
    p = KafkaProducer(bootstrap_servers=cfg.kafka.bootstrap_servers, acks="all")
    p.send(q.name, key=b"k", value=b"v", partition=0).get(10)
    p.close()
    res = CliRunner().invoke(cli, ["trace", q.name, f"{q.name}/0/0", "--since", "10m", "-o", "json",
                                   "--bootstrap", cfg.kafka.bootstrap_servers])
    assert res.exit_code == 0, res.output
    (message,) = json.loads(res.stdout)["messages"]
    assert (message["origin"], message["state"]) == (f"{q.name}/0/0", "queued")
    # CliRunner's stderr is no terminal: whole lines, no carriage returns for a log file to garble.
    assert "scanning " in res.stderr and "\r" not in res.stderr, repr(res.stderr)
    assert all(line.startswith("scanning ") for line in res.stderr.splitlines()), repr(res.stderr)


def _dead_letters(cfg, q, n: int) -> None:
    produce(cfg.kafka.bootstrap_servers, q.dlq_topic, n, keys=b"k%d", values=b"v%d", flush_each=True,
            headers=lambda i: [("kmq-origin", f"{q.name}/1/{i}".encode()), ("kmq-dlq-reason", b"rejected"),
                               ("kmq-delivery-count", b"3")])


def _queue_end(cfg, q) -> int:
    from kmq.client import open_log_reader

    reader = open_log_reader(cfg.kafka)
    try:
        return sum(end for _start, end in reader.bounds([(q.name, 0), (q.name, 1)]).values())
    finally:
        reader.close()


def test_dlq_replay_dry_run_shows_what_would_be_replayed_and_writes_nothing(queue_topics):
    cfg, q = queue_topics(2)
    _dead_letters(cfg, q, 3)
    args = ["dlq", "replay", q.name, "--bootstrap", cfg.kafka.bootstrap_servers]
    res = CliRunner().invoke(cli, [*args, "--dry-run", "--limit", "2", "-o", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["queue"], doc["dry_run"], doc["replayed"], doc["unreplayable"]) == (q.name, True, 2, [])
    assert [(c["partition"], c["offset"], c["reason"], c["target_partition"], c["key"]) for c in doc["would_replay"]] == [
        (0, 0, "rejected", 1, "k0"), (0, 1, "rejected", 1, "k1")]
    text = CliRunner().invoke(cli, [*args, "--dry-run"])
    assert text.exit_code == 0, text.output
    assert "dry run: would replay 3 message(s)" in text.stdout and "0:2  reason=rejected  key=k2  -> partition 1" in text.stdout
    # Nothing was written: no copy in the queue, no position in the replay group.
    assert _queue_end(cfg, q) == 0
    real = CliRunner().invoke(cli, [*args, "-o", "json"])
    assert real.exit_code == 0, real.output
    done = json.loads(real.stdout)
    assert (done["dry_run"], done["replayed"], done["already_copied"]) == (False, 3, 0) and "would_replay" not in done
    assert _queue_end(cfg, q) == 3
