"""`kmq produce` and `kmq work`: deterministic failure injection, ack log, SIGTERM drain."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kmq.cli import cli
from kmq.config.process import GEN0_THRESHOLD
from kmq.dev.workload import fate, is_poison
from kmq.dev.broker import free_port
from kmq.core.markers import End, Nack, Reject
from tests.helpers.kafka import read_all, wait_until
from tests.helpers.workers import markers_by_partition

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def config_file(tmp_path: Path, cfg) -> Path:
    path = tmp_path / "kmq.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return path


def covered(markers, kind) -> set[int]:
    return {o for m in markers if isinstance(m, kind) for r in m.ranges for o in r.offsets()}


def test_work_settles_each_message_as_its_injected_fate_says(queue_topics, bootstrap, tmp_path):
    cfg, q = queue_topics(partitions=1, consumer={"ack_flush_interval": "50ms"})
    conf = config_file(tmp_path, cfg)
    res = CliRunner().invoke(cli, ["produce", q.name, "--count", "40", "--poison-rate", "0.1", "--config", str(conf)])
    assert res.exit_code == 0, res.output
    assert "produced 40 messages (4 poison)" in res.output
    ack_log = tmp_path / "acks.log"
    res = CliRunner().invoke(cli, ["work", q.name, "--config", str(conf), "--workers", "3", "--fail-rate", "0.3",
                                   "--hang-rate", "0.2", "--max-messages", "40", "--ack-log", str(ack_log)])
    assert res.exit_code == 0, res.output
    assert gc.get_threshold()[0] == GEN0_THRESHOLD  # kmq work tunes its process's collector
    # What the fates predict, from the payloads and origins alone.
    records = read_all(bootstrap, q.name)
    expect = {"ok": set(), "fail": set(), "hang": set(), "poison": set()}
    for r in records:
        kind = "poison" if is_poison(r.value) else fate(f"{q.name}/0/{r.offset}", 1, 0.3, 0.2)
        expect[kind].add(r.offset)
    assert all(expect.values()), expect  # every fate occurs in 40 messages
    assert f"settled: ok={len(expect['ok'])} fail={len(expect['fail'])} hang={len(expect['hang'])} poison=4" in res.output
    lines = ack_log.read_text().splitlines()
    assert sorted(int(line.split()[0].rsplit("/", 1)[1]) for line in lines) == sorted(expect["ok"])
    assert all(line.split()[1] == line.split()[0] for line in lines)  # first delivery: origin = itself
    markers = markers_by_partition(bootstrap, q.markers_topic)[0]
    assert covered(markers, End) == expect["ok"]
    assert covered(markers, Nack) == expect["fail"]
    assert covered(markers, Reject) == expect["poison"]
    assert all(m.reason == "poison payload" for m in markers if isinstance(m, Reject))
    settled = covered(markers, End) | covered(markers, Nack) | covered(markers, Reject)
    assert not settled & expect["hang"]  # hung messages stay in flight for the tracker


def test_work_drains_and_flushes_on_sigterm(queue_topics, bootstrap, tmp_path, kafka_client):
    # kmq work honours kafka.client: the same drain on either client.
    cfg, q = queue_topics(partitions=2, consumer={"ack_flush_interval": "1s"}, kafka={"client": kafka_client})
    conf = config_file(tmp_path, cfg)
    res = CliRunner().invoke(cli, ["produce", q.name, "--count", "300", "--config", str(conf)])
    assert res.exit_code == 0, res.output
    ack_log = tmp_path / "acks.log"
    port = free_port("127.0.0.2")  # --metrics-host: served where it is told, not on 127.0.0.1 only
    proc = subprocess.Popen(
        [sys.executable, "-c", "from kmq.cli import main; main()", "work", q.name, "--config", str(conf), "--workers", "2",
         "--processing-ms", "20", "--ack-log", str(ack_log), "--metrics-port", str(port),
         "--metrics-host", "127.0.0.2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        def thirty_acks():
            assert proc.poll() is None, f"kmq work exited early: {proc.communicate()[1][-2000:]}"
            return ack_log.exists() and len(ack_log.read_text().splitlines()) >= 30

        wait_until(thirty_acks, 60, what="30 acks")
        metrics = urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=5).read().decode()
        assert f'kmq_consumer_messages_total{{outcome="received",queue="{q.name}"}}' in metrics
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert "settled: ok=" in out
    acked = {(int(p), int(o)) for line in ack_log.read_text().splitlines() for _, p, o in [line.split()[0].rsplit("/", 2)]}
    assert 30 <= len(acked) < 300  # it stopped early
    markers = markers_by_partition(bootstrap, q.markers_topic)
    ended = {(p, o) for p, ms in markers.items() for o in covered(ms, End)}
    assert acked <= ended  # every logged ack was flushed before exit (flush interval 1s: only close did it)
