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
    def __init__(self, conf: Path, queue: str, ack_log: Path, out) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kmq", "work", queue, "--config", str(conf), "--workers", "4",
             "--processing-ms", "50", "--ack-log", str(ack_log)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )

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


def _assignment_lines(log: Path) -> list[str]:
    return [line[:200] for line in log.read_text(errors="replace").splitlines()
            if "assigned partitions" in line or "revoked" in line][-20:]


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
        "logging": {"level": "INFO"},  # the workers' partition assignments in workers.log, for a failure
    })
    ensure_topics(cfg.kafka, cfg.queues[0], PARTITIONS)
    conf = tmp_path / "kmq.yaml"
    conf.write_text(yaml.safe_dump(cfg.to_dict()))
    subprocess.run([sys.executable, "-m", "kmq", "produce", q, "--count", str(N), "--config", str(conf)],
                   check=True, cwd=ROOT, capture_output=True, timeout=60)
    out = open(tmp_path / "workers.log", "wb")  # noqa: SIM115 - closed below
    logs: list[Path] = []
    workers: list[Worker] = []
    tracker = TrackerProcess(cfg, tmp_path)

    def start(slot: int) -> Worker:
        logs.append(tmp_path / f"acks-{len(logs)}.log")
        logs[-1].touch()
        return Worker(conf, q, logs[-1], out)

    try:
        tracker.wait_ready()
        workers = [start(i) for i in range(3)]
        wait_until(lambda: len(_acks(logs)) >= 300, 60, what="the workers under way")
        for i in range(3):  # the deploy: each worker in turn
            assert workers[i].terminate() == 0
            workers[i] = start(i)
            done = len(_acks(logs))
            try:
                wait_until(lambda: len(_acks(logs)) >= done + 200, 60, what="work going on after a restart")
            except AssertionError as exc:
                seen = (f"{exc}; group: {_group_state(bootstrap, cfg.consumer.group_id)}; workers' "
                        f"assignments: {_assignment_lines(tmp_path / 'workers.log')}")
                # Reproduced with plain kafka-python consumers, no kmq code: three members restarted
                # 2.5 s apart, and in 3 of 6 tries tansu handed out no partition at all for 60 s.
                # On tansu that stall is the broker's; on any other broker it fails the test.
                skip_on_tansu(f"the group stalled after a restart with no partition assigned (a member "
                              f"restarted while the group still rebalanced): {seen}")
                raise AssertionError(seen) from None
        wait_until(lambda: len({o for _, o in _acks(logs)}) >= N, 120, what=f"all {N} messages acked")
        for w in workers:
            assert w.terminate() == 0
    finally:
        for w in workers:
            w.kill()
        tracker.close()
        out.close()
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
