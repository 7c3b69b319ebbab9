"""Chaos: `kmq work` with ``consumer.hand_over: started`` (batches reach the handlers once their
START is acknowledged, before their commit), SIGKILLed mid-run and restarted, twice.

Two workers (one on kafka-python, one on confluent-kafka) and one `kmq tracker run`; 3,000
messages produced at 300/s while the workers are killed one after the other, each while
messages are still unacked; each worker fails (NACK) and hangs 2 % of its messages. A kill lands on batches in every state: fetched, STARTed and
handed over with their commit in flight, committed, in a handler. End state: every message
acked at least once (nothing lost); the duplicates (acked more than once) are reported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from tests.helpers.fleet import KMQ_WORK, WorkerKind, acked_ids, timelines
from tests.helpers.kafka import read_all
from tests.integration.tracker_util import TrackerProcess

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(300)]

N = 3_000
PARTITIONS = 2
STARTED = (("KMQ_CONSUMER__HAND_OVER", "started"),)
FLEET = [
    WorkerKind("kmq work (kafka-python, hand_over started)", KMQ_WORK, STARTED),
    WorkerKind("kmq work (confluent, hand_over started)", KMQ_WORK, (*STARTED, ("KMQ_KAFKA__CLIENT", "confluent"))),
]
#: (worker index, acks so far): SIGKILLed then and restarted as the same kind.
KILLS = [(0, 600), (1, 1_500)]


class Worker:
    """A `kmq work` process of ``kind``, failing and hanging 2 % of its messages (no poison:
    every message must end acked)."""

    def __init__(self, kind: WorkerKind, cfg_path, queue: str, ack_log, out) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *kind.command, queue, "--config", str(cfg_path), "--fail-rate", "0.02",
             "--hang-rate", "0.02", "--ack-log", str(ack_log)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **dict(kind.env)})

    def stop(self, sig_kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill() if sig_kill else self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def test_workers_handing_over_at_start_killed_mid_run_lose_nothing(bootstrap, queue_topics, tmp_path):
    cfg, q = queue_topics(PARTITIONS, queue={"lease": "2s", "max_deliveries": 8}, tracker={"tick": "50ms"})
    cfg_path = tmp_path / "kmq.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.to_dict(redact=False)))
    out = open(tmp_path / "workers.log", "ab")
    logs = [tmp_path / f"acks-{i}.log" for i in range(len(FLEET) + len(KILLS))]
    tracker = TrackerProcess(cfg, tmp_path)
    workers = [Worker(kind, cfg_path, q.name, logs[i], out) for i, kind in enumerate(FLEET)]
    producer = None
    try:
        tracker.wait_ready(60)
        producer = subprocess.Popen(
            [sys.executable, "-m", "kmq", "produce", q.name, "--config", str(cfg_path), "-n", str(N), "--rate", "300"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )

        def acked() -> set[str]:
            return set(acked_ids(logs))

        for j, (i, at) in enumerate(KILLS):
            deadline = time.monotonic() + 120
            while len(acked()) < at:
                assert time.monotonic() < deadline, f"only {len(acked())} acked before kill {j}"
                time.sleep(0.05)
            assert len(acked()) < N, "every message was acked before the kill: not mid-run"
            workers[i].stop(sig_kill=True)
            workers[i] = Worker(FLEET[i], cfg_path, q.name, logs[len(FLEET) + j], out)
        assert producer.wait(120) == 0
        originals = {f"{q.name}/{r.partition}/{r.offset}" for r in read_all(bootstrap, q.name, timeout=30)
                     if not any(k == "kmq-origin" for k, _ in (r.headers or []))}
        assert len(originals) == N
        deadline = time.monotonic() + 150
        while not originals <= acked():
            missing = sorted(originals - acked())
            assert time.monotonic() < deadline, (f"{len(missing)} never acked, e.g. {missing[:5]}"
                                                 + timelines(cfg, q.name, missing[:3]))
            time.sleep(0.5)
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
        for w in workers:
            w.stop()
        tracker.close()
        out.close()
    counts = acked_ids(logs)
    twice = sum(1 for o in originals if counts[o] > 1)
    print(f"{N} messages, every one acked; {twice} acked more than once (kills and their leases)")
