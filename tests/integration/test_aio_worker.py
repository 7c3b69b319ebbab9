"""``kmq work --asyncio`` as a real process: SIGKILLed mid-backlog, nothing is lost.

The asyncio worker runs the same handler as the threaded one (failure and poison
injection included) on AsyncKmqConsumer.run(). It is killed with no chance to
flush; a real tracker redelivers what it had started, a second asyncio worker
finishes the backlog: every message ends acked or (poison) in the DLQ.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kmq.dev.workload import is_poison_index, payload
from kmq.core.message import origin_of
from tests.helpers.kafka import produce, read_all, wait_until
from tests.helpers.workers import acked_origins
from tests.integration.tracker_util import running_tracker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 600


def _worker(conf: Path, queue: str, ack_log: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "kmq", "work", queue, "--asyncio", "--config", str(conf), "--workers", "4",
             "--processing-ms", "5", "--fail-rate", "0.05", "--ack-log", str(ack_log)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )



@pytest.mark.parametrize("client", ["threaded", "aiokafka"])
def test_asyncio_worker_sigkilled_mid_backlog_loses_nothing(queue_topics, bootstrap, tmp_path, client):
    cfg, q = queue_topics(partitions=2, queue={"lease": "3s", "max_deliveries": 10,
                                               "backoff": {"initial": "100ms", "max": "1s"}},
                          tracker={"tick": "100ms"})
    # As `kmq produce --poison-rate 0.01` writes them: 6 poison payloads.
    produce(cfg, q.name, MESSAGES, keys=b"%d", values=lambda i: payload(i, 100, is_poison_index(i, 0.01)), partitions=2)
    conf = tmp_path / "kmq.yaml"
    worker_cfg = cfg.to_dict(redact=False)
    if client == "aiokafka":  # the worker's consumer on its event loop; the tracker stays on kafka-python
        worker_cfg["kafka"]["client"] = "aiokafka"
        worker_cfg.setdefault("logging", {})["debug"] = "kmq.consumer.loop_driver"  # its "fetching on the event loop"
    conf.write_text(yaml.safe_dump(worker_cfg))
    ack_log = tmp_path / "acks.log"
    ack_log.touch()
    records = read_all(bootstrap, q.name, expect=MESSAGES)
    originals = {f"{q.name}/{r.partition}/{r.offset}" for r in records}
    poison = {f"{q.name}/{r.partition}/{r.offset}" for r in records if r.value.startswith(b"POISON:")}
    assert len(originals) == MESSAGES and len(poison) == 6
    workers: list[subprocess.Popen] = []
    with running_tracker(cfg):
        try:
            workers.append(_worker(conf, q.name, ack_log, tmp_path / "worker1.log"))
            wait_until(lambda: len(acked_origins(ack_log)) >= 100, 60, what="the asyncio worker under way")
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait(10)
            killed_at = len(acked_origins(ack_log))
            assert killed_at < MESSAGES, "the backlog was done before the kill: nothing tested"
            workers.append(_worker(conf, q.name, ack_log, tmp_path / "worker2.log"))

            def settled() -> bool:
                dead = {origin_of(r.headers, q.name, r.partition, r.offset) for r in read_all(bootstrap, q.dlq_topic, 2)}
                return originals <= acked_origins(ack_log) | dead

            wait_until(settled, 120, interval=0.5, what="every message acked or dead-lettered after the SIGKILL")
            workers[1].terminate()
            assert workers[1].wait(60) == 0, (tmp_path / "worker2.log").read_text()[-3000:]
            summary = (tmp_path / "worker2.log").read_text()
            assert "with 4 asyncio handlers" in summary and "settled: ok=" in summary, summary[-2000:]
            assert ("fetching on the event loop" in summary) == (client == "aiokafka"), summary[-2000:]
            # Every poison message is dead-lettered and nothing else is. A poison message can be
            # dead-lettered twice (at-least-once): one the killed worker had STARTed but not yet
            # committed is copied by the tracker when its lease ends and fetched again by the second
            # worker from the group's committed offset, and both deliveries are rejected.
            dead = read_all(bootstrap, q.dlq_topic, 2)
            assert all(r.value.startswith(b"POISON:") for r in dead), [r.value[:20] for r in dead]
            assert {origin_of(r.headers, q.name, r.partition, r.offset) for r in dead} == poison
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait(10)
    print(f"killed after {killed_at} acks of {MESSAGES}; {len(ack_log.read_text().splitlines())} acks in all")
