"""examples/share_service.py runs as written (a real process, SIGTERM to stop) on kmq.share
with a tracker: a record accepted, a flaky one released and accepted on its second delivery,
a poison one rejected into the DLQ."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kmq.client.kafka_python import clients
from tests.helpers.kafka import read_all, wait_until
from tests.integration.tracker_util import running_tracker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUEUE = {"lease": "2s", "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0}}


def test_the_share_service_example_accepts_retries_and_dead_letters(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, queue=QUEUE)
    p = clients.producer(cfg.kafka)
    for v in (b"ok-1", b"flaky-1", b"poison-1"):
        p.send(q.name, value=v)
    p.flush()
    p.close()
    extra = {"kmq.session.timeout.ms": 6000, "kmq.heartbeat.interval.ms": 1000, "kmq.lease.ms": 2000,
             "kmq.ack.flush.interval.ms": 50}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHARE_BOOTSTRAP": bootstrap, "SHARE_GROUP": cfg.consumer.group_id,
           "SHARE_TOPIC": q.name, "SHARE_CONFIG": json.dumps(extra)}
    lines: list[str] = []
    with running_tracker(cfg):
        proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "share_service.py")], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            wanted = ["ACCEPT ok-1 delivery=1", "RELEASE flaky-1 delivery=1", "ACCEPT flaky-1 delivery=2",
                      "REJECT poison-1 delivery=1"]
            wait_until(lambda: proc.poll() is None and all(any(w in line for line in lines) for w in wanted), 60,
                       what=f"the service's outcomes; output so far: {lines[-20:]}")
            dlq = wait_until(lambda: read_all(bootstrap, q.dlq_topic, timeout=2, expect=1), 30, what="the dead letter")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    reader.join(10)
    assert [r.value for r in dlq] == [b"poison-1"]
    assert any("stopped" in line for line in lines)
