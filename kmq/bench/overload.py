"""``kmq bench overload``: a backlog of several leases of work, drained by real workers.

The redelivery-storm scenario: messages are produced before any
worker starts, so the backlog is ``backlog / capacity`` seconds of work, at
least three leases by default (3,000 messages, one ``kmq work --workers 4
--processing-ms 20`` = 200 msg/s of capacity = 15 s, lease 5 s). Real
``kmq work`` processes with a fixed per-message time, one real tracker,
default settings except the lease.

Reported: goodput / capacity (distinct messages acked per second, from the
first ack to the last distinct one, over what the handlers can do), copies
(redelivered records the tracker appended to the queue), duplicate acks (a
message acked more than once) and dead letters. Targets: goodput >= 0.9,
0 dead letters, copies <= 1 % of the messages.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
import yaml

from kmq.dev.broker import broker_unless

__all__ = ["command", "run"]


def _count(bootstrap: str, topic: str, with_header: str | None = None) -> int:
    """Records of ``topic`` (with the header ``with_header``), read to the end of each partition."""
    from kmq.client import open_log_reader
    from kmq.config import KafkaConfig

    reader = open_log_reader(KafkaConfig(bootstrap_servers=bootstrap))
    try:
        starts = {(topic, p): None for p in range(reader.partition_count(topic))}
        return sum(1 for _tp, batch in reader.scan(starts) for r in batch
                   if with_header is None or any(k == with_header for k, _ in (r.headers or [])))
    finally:
        reader.close()


def _acks(path: Path) -> list[str]:
    return [line.split()[1] for line in path.read_text().splitlines() if len(line.split()) == 2]


def run(messages: int = 3000, lease: str = "5s", processing_ms: float = 20.0, workers: int = 4, processes: int = 1,
        partitions: int = 4, max_deliveries: int = 5, timeout: float = 0.0, bootstrap: str | None = None,
        echo: Any = None) -> dict:
    """Run the scenario once; returns the figures (also printed through ``echo``)."""
    from kmq.config import Config, parse_duration
    from kmq.dev.processes import stop_processes
    from kmq.client.topics import ensure_topics

    say = echo or (lambda *_: None)
    lease_s = parse_duration(lease)
    capacity = processes * workers * 1000.0 / processing_ms
    work_s = messages / capacity
    timeout = timeout or max(120.0, 4 * work_s + 3 * lease_s)
    bootstrap, broker = broker_unless(bootstrap)
    procs: list[subprocess.Popen] = []
    logs: list = []
    tmp = Path(tempfile.mkdtemp(prefix="kmq-overload-"))
    try:
        queue = f"overload-{uuid.uuid4().hex[:8]}"
        cfg = Config.from_dict({
            "kafka": {"bootstrap_servers": bootstrap, "session_timeout": "6s", "heartbeat_interval": "1s"},
            "queues": [{"name": queue, "lease": lease, "max_deliveries": max_deliveries}],
            "consumer": {"group_id": f"{queue}-workers"},
            "tracker": {"group_id": f"{queue}-tracker", "http_port": 0},
        })
        ensure_topics(cfg.kafka, cfg.queues[0], partitions)
        conf = tmp / "kmq.yaml"
        conf.write_text(yaml.safe_dump(cfg.to_dict()))
        py = [sys.executable, "-m", "kmq"]
        subprocess.run([*py, "produce", queue, "--count", str(messages), "--config", str(conf)], check=True,
                       capture_output=True, timeout=300)
        say(f"backlog: {messages} messages on {partitions} partitions = {work_s:.1f}s of work at {capacity:.0f} msg/s "
            f"({processes} x kmq work --workers {workers} --processing-ms {processing_ms:g}) = {work_s / lease_s:.1f} "
            f"leases of {lease_s:g}s")
        logs.append(open(tmp / "tracker.log", "wb"))  # noqa: SIM115 - closed below
        procs.append(subprocess.Popen([*py, "tracker", "run", "--config", str(conf)], stdout=logs[0],
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        ack_logs = [tmp / f"acks-{i}.log" for i in range(processes)]
        for i, ack in enumerate(ack_logs):
            ack.touch()
            logs.append(open(tmp / f"work-{i}.log", "wb"))  # noqa: SIM115 - closed below
            procs.append(subprocess.Popen(
                [*py, "work", queue, "--config", str(conf), "--workers", str(workers), "--processing-ms",
                 str(processing_ms), "--ack-log", str(ack)],
                stdout=logs[-1], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        first = last = None
        distinct: set[str] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            acks = [a for path in ack_logs for a in _acks(path)]
            if acks and first is None:
                first = time.monotonic()
            if len(set(acks)) > len(distinct):
                distinct = set(acks)
                last = time.monotonic()
            if len(distinct) >= messages:
                break
            if any(p.poll() is not None for p in procs):
                raise click.ClickException(f"a process exited early; logs in {tmp}")
            time.sleep(0.2)
        # Let leases that were running when the last message was acked end, so late copies are counted.
        time.sleep(min(lease_s + 2.0, 35.0))
        acks = [a for path in ack_logs for a in _acks(path)]
        stop_processes(procs, 30)
        took = (last - first) if first is not None and last is not None and last > first else float("nan")
        goodput = len(set(acks)) / took if took == took else 0.0
        copies = _count(bootstrap, queue, with_header="kmq-origin")
        dead = _count(bootstrap, cfg.queues[0].dlq_topic)
        result = {
            "messages": messages, "lease_s": lease_s, "processing_ms": processing_ms, "workers": workers,
            "processes": processes, "partitions": partitions, "capacity_msgs_per_s": capacity,
            "work_seconds": round(work_s, 1), "leases_of_work": round(work_s / lease_s, 2),
            "acked_distinct": len(set(acks)), "drain_seconds": round(took, 2),
            "goodput_msgs_per_s": round(goodput, 1), "goodput_ratio": round(goodput / capacity, 3),
            "copies": copies, "copies_pct": round(100.0 * copies / messages, 2),
            "duplicate_acks": len(acks) - len(set(acks)), "dead_letters": dead,
        }
        ok = result["goodput_ratio"] >= 0.9 and dead == 0 and copies <= 0.01 * messages
        say(f"drained {result['acked_distinct']}/{messages} in {took:.1f}s: goodput {goodput:.0f} msg/s = "
            f"{result['goodput_ratio']:.2f} of capacity (target >= 0.9)")
        say(f"copies {copies} ({result['copies_pct']:.2f}% of messages, target <= 1%), duplicate acks "
            f"{result['duplicate_acks']}, dead letters {dead} (target 0): {'met' if ok else 'NOT met'}")
        result["targets_met"] = ok
        return result
    finally:
        stop_processes(procs, 10)
        for f in logs:
            f.close()
        if broker is not None:
            broker.stop()


@click.command("overload")
@click.option("--messages", type=click.IntRange(min=1), default=3000, show_default=True, help="Backlog, produced first.")
@click.option("--lease", default="5s", show_default=True, help="queues[0].lease (the only non-default setting).")
@click.option("--processing-ms", type=click.FloatRange(min=0.1), default=20.0, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=4, show_default=True, help="Handler threads per process.")
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True, help="`kmq work` processes.")
@click.option("--partitions", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--bootstrap", default=None, help="Use this broker instead of an embedded one.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON too.")
def command(as_json: bool, **opts: Any) -> None:
    """A backlog of several leases of work drained by real `kmq work` processes and a tracker."""
    result = run(echo=click.echo, **opts)
    if as_json:
        click.echo(json.dumps(result))
