"""A KmqConsumer worker process for crash tests, plus readers and checks of what workers left behind.

Run as ``python -m tests.helpers.workers --bootstrap B --queue Q --group G --pause-at STAGE
[--hand-over started]``: the worker prints ``STAGE <stage> <json spans>`` at every fetcher stage
("polled", "started", "committed"; "handed" instead of "committed" with ``consumer.hand_over:
started``) and blocks forever at ``STAGE`` so the test can SIGKILL it at exactly that step.
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
import threading
from pathlib import Path

from kafka import TopicPartition

from kmq.core.markers import End, Start, decode, decode_key
from tests.helpers.kafka import produce, read_all

ROOT = Path(__file__).resolve().parents[2]


def spawn(bootstrap: str, queue: str, group: str, pause_at: str, hand_over: str = "committed") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.workers", "--bootstrap", bootstrap, "--queue", queue,
         "--group", group, "--pause-at", pause_at, "--hand-over", hand_over],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )


def acked_origins(ack_log: Path) -> set[str]:
    """Origins (``queue/partition/offset`` of the first delivery) a ``kmq work --ack-log`` file
    says were acked so far."""
    return {line.split()[1] for line in ack_log.read_text().splitlines() if len(line.split()) == 2}


def markers_by_partition(bootstrap: str, topic: str) -> dict[int, list]:
    """Decoded markers of ``topic`` per queue partition, in log order."""
    out: dict[int, list] = {}
    for r in read_all(bootstrap, topic):
        out.setdefault(decode_key(r.key), []).append(decode(r.value))
    return out


def started_offsets(markers: dict[int, list]) -> dict[int, set[int]]:
    return {p: {o for m in ms if isinstance(m, Start) for r in m.ranges for o in r.offsets()} for p, ms in markers.items()}


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """Committed offsets of ``group`` on ``topic`` (partition -> next offset); no group join."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        out = {}
        for p in sorted(c.partitions_for_topic(topic) or ()):
            off = c.committed(TopicPartition(topic, p))
            if off is not None and off >= 0:
                out[p] = off
        return out
    finally:
        c.close()


def logged_partitions(records: list, event: str) -> list[int]:
    """Partitions in the consumer's "partitions [..] revoked" / "assigned partitions [..]" log lines."""
    out: list[int] = []
    for r in records:
        text = r.getMessage()
        if (event == "revoked" and text.endswith(" revoked")) or (event == "assigned" and "assigned partitions [" in text):
            inside = text[text.rindex("[") + 1:text.rindex("]")]
            out.extend(int(x) for x in inside.split(",") if x.strip())
    return out


def check_adoption(cfg, q, original: str, with_kmq: str, n: int = 50) -> None:
    """A user's consumer loop (``original``, Python source) adopts kmq in at most five changed
    lines (``with_kmq``), and both handle ``n`` records over ``q``'s two partitions: the plain
    loop in a group of its own, the adopted one with every offset STARTed, ENDed and committed.
    The sources run with ``topic``, ``bootstrap``, ``group``, ``n``, ``handled`` and ``cfg``."""
    changed = [line for line in difflib.ndiff(original.splitlines(), with_kmq.splitlines()) if line[:2] in ("+ ", "- ")]
    assert len(changed) <= 5, changed
    bootstrap = cfg.kafka.bootstrap_servers
    produce(cfg, q.name, n, values=b"v%d", partitions=2)
    for source, group in ((original, cfg.consumer.group_id + "-plain"), (with_kmq, cfg.consumer.group_id)):
        handled: list = []
        exec(source, {"topic": q.name, "bootstrap": bootstrap, "group": group, "n": n, "handled": handled, "cfg": cfg})
        assert sorted(handled) == sorted((i % 2, i // 2) for i in range(n))

    markers = markers_by_partition(bootstrap, q.markers_topic)
    for p in (0, 1):
        started = {o for m in markers[p] if isinstance(m, Start) for r in m.ranges for o in r.offsets()}
        ended = {o for m in markers[p] if isinstance(m, End) for r in m.ranges for o in r.offsets()}
        assert started == ended == set(range(n // 2))
    assert committed(bootstrap, cfg.consumer.group_id, q.name) == {0: n // 2, 1: n // 2}


def _main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--pause-at", choices=["polled", "started", "committed", "handed"], required=True)
    ap.add_argument("--hand-over", choices=["committed", "started"], default="committed")
    args = ap.parse_args()

    from kmq.config import Config
    from kmq.consumer.consumer import KmqConsumer

    cfg = Config.from_dict({
        "kafka": {"bootstrap_servers": args.bootstrap, "session_timeout": "6s", "heartbeat_interval": "1s"},
        "queues": [{"name": args.queue}],
        "consumer": {"group_id": args.group, "hand_over": args.hand_over},
    })
    block = threading.Event()

    def hook(stage: str, spans: dict) -> None:
        print(f"STAGE {stage} {json.dumps({str(p): s for p, s in spans.items()})}", flush=True)
        if stage == args.pause_at:
            block.wait()  # until SIGKILL

    consumer = KmqConsumer(cfg, queue=args.queue, stage_hook=hook)
    while True:
        for msg in consumer.poll(timeout=1.0):
            msg.ack()


if __name__ == "__main__":
    _main()


__all__ = ["spawn", "markers_by_partition", "started_offsets", "committed", "logged_partitions", "check_adoption"]
