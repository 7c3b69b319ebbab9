"""``kmq work --share`` as a real process: the demo worker through kmq.share.ShareConsumer.

The worker acknowledges explicitly (ACCEPT, RELEASE for the fail band, REJECT for poison) and
leaves the hang band unacknowledged; a real tracker redelivers what was released or left to its
lock's end. Every produced message ends acked (its --ack-log line) or, when poison, in the DLQ.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kmq.core.message import origin_of
from kmq.dev.workload import is_poison_index, payload
from tests.helpers.kafka import produce, read_all, wait_until
from tests.helpers.workers import acked_origins
from tests.integration.tracker_util import running_tracker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 200
POISON_RATE = 0.02  # 4 poison payloads



def test_share_worker_acks_every_message_and_dead_letters_the_poison(queue_topics, bootstrap, tmp_path):
    cfg, q = queue_topics(partitions=2, queue={"lease": "2s", "max_deliveries": 10,
                                               "backoff": {"initial": "100ms", "max": "1s"}},
                          tracker={"tick": "100ms"})
    # As `kmq produce --poison-rate 0.02` writes them.
    produce(cfg, q.name, MESSAGES, keys=b"%d", values=lambda i: payload(i, 100, is_poison_index(i, POISON_RATE)),
            partitions=2)
    conf = tmp_path / "kmq.yaml"
    conf.write_text(yaml.safe_dump(cfg.to_dict(redact=False)))
    ack_log = tmp_path / "acks.log"
    ack_log.touch()
    records = read_all(bootstrap, q.name, expect=MESSAGES)
    poison = {f"{q.name}/{r.partition}/{r.offset}" for r in records if r.value.startswith(b"POISON:")}
    good = {f"{q.name}/{r.partition}/{r.offset}" for r in records} - poison
    assert len(poison) == 4 and len(good) == MESSAGES - 4
    log = tmp_path / "worker.log"

    def dead() -> set[str]:
        return {origin_of(r.headers, q.name, r.partition, r.offset) for r in read_all(bootstrap, q.dlq_topic, 2)}

    with running_tracker(cfg), open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kmq", "work", q.name, "--share", "--config", str(conf), "--workers", "4",
             "--processing-ms", "2", "--fail-rate", "0.1", "--hang-rate", "0.05", "--slow-rate", "0.01",
             "--ack-log", str(ack_log)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_until(lambda: proc.poll() is None and good <= acked_origins(ack_log) and poison <= dead(), 120,
                       interval=0.5, what="every message acked or (poison) dead-lettered")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    output = log.read_text()
    assert "with 4 share-API workers" in output, output[-2000:]
    summary = next(line for line in output.splitlines() if line.startswith("settled: "))
    counts = dict(kv.split("=") for kv in summary.removeprefix("settled: ").split())
    assert set(counts) == {"ok", "fail", "hang", "poison", "slow", "duplicate"}
    assert int(counts["poison"]) == 4 and int(counts["fail"]) > 0 and int(counts["hang"]) > 0, summary
    assert dead() == poison  # nothing else dead-lettered: released and hung records came back
