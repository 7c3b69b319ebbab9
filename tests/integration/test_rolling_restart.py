"""A rolling deploy costs no delivery.

3 real `kmq work` processes and a tracker drain a backlog; each worker is
restarted in turn with SIGTERM (the deploy). Lease long (no lease can end),
max_deliveries 3, no failure injection. Before: every rebalance NACKed every
prefetched message (a copy with a higher delivery count each time), and good
messages ended in the DLQ as nack-limit. Now: copies <= 1 %, 0 dead letters,
and no message that was never handed to a handler comes back as a copy.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kmq.config import Config
from kmq.client.topics import ensure_topics
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import read_all, wait_until
from tests.integration.tracker_util import TrackerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
N = 3000
PARTITIONS = 4


class Worker:
    def __init__(self, conf: Path, queue: str, ack_log: Path, log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:  # the child keeps its own copy of the file descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kmq", "work", queue, "--config", str(conf), "--workers", "4",
                 "--processing-ms", "50", "--ack-log", str(ack_log)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )

    def assigned(self) -> set[int]:
        """The queue partitions this worker holds now, from its "assigned partitions [..]" and
        "partitions [..] revoked" log lines (incremental: what a cooperative rebalance reports)."""
        held: set[int] = set()
        for line in self.log.read_text(errors="replace").splitlines():
            m = re.search(r"assigned partitions \[([\d, ]*)\]|: partitions \[([\d, ]*)\] revoked$", line)
            if m:
                parts = {int(x) for x in (m.group(1) if m.group(1) is not None else m.group(2)).split(",") if x.strip()}
                held = held | parts if m.group(1) is not None else held - parts
        return held

    def terminate(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError("a worker did not stop within 60 s of SIGTERM") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _group_state(bootstrap: str, group: str) -> str:
    """The broker's view of the workers' group (members and their partitions), for a failure message."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return repr(admin.describe_groups([group]))[:3000]
    except Exception as exc:  # noqa: BLE001 - a diagnostic only
        return f"(describe failed: {exc})"
    finally:
        admin.close()


def _assignment_lines(logs: list[Path]) -> list[str]:
    return [f"{log.name}: {line[:200]}" for log in logs for line in log.read_text(errors="replace").splitlines()
            if "assigned partitions" in line or "revoked" in line][-30:]


def _wait_for_progress(cond, timeout: float, what: str, workers: list[Worker], diagnose, skip_on_tansu) -> None:
    """``wait_until(cond)``; when it times out while a queue partition is held by no running worker,
    the group stalled: reproduced with plain kafka-python consumers, no kmq code (three members
    restarted 2.5 s apart: in 3 of 6 tries tansu handed out no partition for 60 s). On tansu that
    stall is the broker's and skips the test; on any other broker, and with every partition held,
    the timeout fails it."""
    try:
        wait_until(cond, timeout, what=what)
    except AssertionError as exc:
        held = set().union(*(w.assigned() for w in workers))
        seen = f"{exc}; partitions held: {sorted(held)}; {diagnose()}"
        if held != set(range(PARTITIONS)):
            skip_on_tansu(f"the group stalled with partitions {sorted(set(range(PARTITIONS)) - held)} held by "
                          f"no worker (a member restarted while the group still rebalanced): {seen}")
        raise AssertionError(seen) from None


def _acks(logs: list[Path]) -> list[tuple[str, str]]:
    out = []
    for path in logs:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out.append((parts[0], parts[1]))
    return out


def test_rolling_restart_with_sigterm_costs_no_delivery(bootstrap, tmp_path, kafka_client, skip_on_tansu):
    # On both clients: the workers' KmqConsumer (cooperative rebalances, give-back on close) and the tracker.
    if kafka_client == "confluent":
        # Reproduced with plain confluent-kafka consumers, no kmq code: 2 members, a 3rd joins, one of the
        # first leaves about 1 s into that rebalance, a 4th joins; in 3 of 7 tries (with range and with
        # cooperative-sticky) the group never hands out the left member's partitions again (40 s).
        # kafka-python members (older JoinGroup/LeaveGroup versions) go through the same deploy on tansu.
        skip_on_tansu("a confluent-kafka (librdkafka) member leaving during a rebalance can leave the group "
                      "without assignments for good")
    q = unique("q")
    cfg = Config.from_dict({
        "kafka": {"bootstrap_servers": bootstrap, **TEST_GROUP_TIMING, "client": kafka_client},
        "queues": [{"name": q, "lease": "60s", "max_deliveries": 3}],
        "consumer": {"group_id": unique("workers")},
        "tracker": {"group_id": unique("tracker"), "http_port": 0},
        "logging": {"level": "INFO"},  # the workers' partition assignments in their logs (the stall check)
    })
    ensure_topics(cfg.kafka, cfg.queues[0], PARTITIONS)
    conf = tmp_path / "kmq.yaml"
    conf.write_text(yaml.safe_dump(cfg.to_dict()))
    subprocess.run([sys.executable, "-m", "kmq", "produce", q, "--count", str(N), "--config", str(conf)],
                   check=True, cwd=ROOT, capture_output=True, timeout=60)
    logs: list[Path] = []
    worker_logs: list[Path] = []
    workers: list[Worker] = []
    tracker = TrackerProcess(cfg, tmp_path)

    def start(slot: int) -> Worker:
        logs.append(tmp_path / f"acks-{len(logs)}.log")
        logs[-1].touch()
        worker_logs.append(tmp_path / f"worker-{len(worker_logs)}.log")
        return Worker(conf, q, logs[-1], worker_logs[-1])

    def diagnose() -> str:
        return (f"group: {_group_state(bootstrap, cfg.consumer.group_id)}; workers' assignments: "
                f"{_assignment_lines(worker_logs)}")

    try:
        tracker.wait_ready()
        workers = [start(i) for i in range(3)]
        wait_until(lambda: len(_acks(logs)) >= 300, 60, what="the workers under way")
        for i in range(3):  # the deploy: each worker in turn
            assert workers[i].terminate() == 0
            workers[i] = start(i)
            done = len(_acks(logs))
            _wait_for_progress(lambda done=done: len(_acks(logs)) >= done + 200, 60, "work going on after a restart",
                               workers, diagnose, skip_on_tansu)
        _wait_for_progress(lambda: len({o for _, o in _acks(logs)}) >= N, 120, f"all {N} messages acked",
                           workers, diagnose, skip_on_tansu)
        for w in workers:
            assert w.terminate() == 0
    finally:
        for w in workers:
            w.kill()
        tracker.close()
    acks = _acks(logs)
    origins = collections.Counter(o for _, o in acks)
    records = read_all(bootstrap, q, timeout=10)
    copies = [r for r in records if any(k == "kmq-origin" for k, _ in (r.headers or []))]
    dead = read_all(bootstrap, cfg.queues[0].dlq_topic, timeout=5)
    handed_originals = {where for where, origin in acks if where == origin}
    never_handed_copies = [r for r in copies if dict(r.headers)["kmq-origin"].decode() not in handed_originals]
    print(f"rolling restart: {N} messages, {len(copies)} copies ({100 * len(copies) / N:.2f}%), "
          f"{sum(origins.values()) - len(origins)} duplicate acks, {len(dead)} dead letters")
    assert len(origins) == N  # nothing lost
    assert not dead
    assert len(copies) <= 0.01 * N
    assert not never_handed_copies, [dict(r.headers)["kmq-origin"] for r in never_handed_copies[:10]]
