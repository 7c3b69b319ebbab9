"""A KmqConsumer worker process with ``consumer.ordering: key`` for crash tests.

Run as ``python -m tests.helpers.ordered_worker --bootstrap B --queue Q --group G``: handlers
print ``DONE <value>`` when they complete a message (before its ack) and fail the first delivery
of values whose number is a multiple of 7, so nacks and copies are in play when the test
SIGKILLs the process.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def spawn(bootstrap: str, queue: str, group: str, tracker_group: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.ordered_worker", "--bootstrap", bootstrap, "--queue", queue,
         "--group", group, "--tracker-group", tracker_group],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )


def _main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--tracker-group", required=True)
    args = ap.parse_args()

    from kmq.config import Config
    from kmq.consumer.consumer import KmqConsumer

    cfg = Config.from_dict({
        "kafka": {"bootstrap_servers": args.bootstrap, "session_timeout": "6s", "heartbeat_interval": "1s"},
        "queues": [{"name": args.queue, "lease": "3s", "max_deliveries": 10,
                    "backoff": {"initial": "100ms", "max": "300ms"}}],
        "consumer": {"group_id": args.group, "ordering": "key", "ack_flush_interval": "50ms"},
        "tracker": {"group_id": args.tracker_group},
    })
    lock = threading.Lock()
    rng = random.Random()

    def handle(msg) -> None:
        with lock:
            pause = rng.random() * 0.004
        threading.Event().wait(pause)
        if int(msg.value.split(b"/")[1]) % 7 == 3 and msg.delivery_count == 1:
            raise RuntimeError("first delivery fails")
        with lock:
            print(f"DONE {msg.value.decode()}", flush=True)

    KmqConsumer(cfg, queue=args.queue).run(handle, workers=4)


if __name__ == "__main__":
    _main()
