"""``consumer.ordering: key`` through a worker SIGKILLed mid-run and another started: nothing is
lost (every message completed by a handler of one of them), with a real tracker redelivering what
the dead worker held, handed out and left unsettled.

Per-key order across the change of owner is not guaranteed in this release (docs/protocol.md,
"Per-key ordering"): the test counts the keys completed out of order and prints them, it does not
assert on them. With a backlog longer than one fetch, the new owner hands later messages of a key
before the copies of the dead worker's messages are fetched (a few keys of 30 in the runs so far);
copies fetched together with later messages take their origin's place and keep the order."""

from __future__ import annotations

import threading

import pytest

from kmq.client.kafka_python import clients
from kmq.client.topics import ensure_topics
from kmq.config import Config
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import wait_until
from tests.helpers.ordered_worker import spawn
from tests.integration.tracker_util import running_tracker

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

KEYS, PER_KEY = 30, 150


class Completions:
    """``DONE <value>`` lines of a worker's stdout, read on a thread."""

    def __init__(self, proc) -> None:
        self.proc, self.values = proc, []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("DONE "):
                self.values.append(line[5:].strip())


def test_nothing_is_lost_through_a_sigkilled_worker_and_a_restart(bootstrap):
    cfg = Config.from_dict({
        "kafka": {"bootstrap_servers": bootstrap, **TEST_GROUP_TIMING},
        "queues": [{"name": unique("q"), "lease": "3s", "max_deliveries": 10,
                    "backoff": {"initial": "100ms", "max": "300ms"}}],
        "consumer": {"group_id": unique("workers")},
        "tracker": {"group_id": unique("tracker"), "http_port": 0},
    })
    q = cfg.queues[0]
    ensure_topics(cfg.kafka, q, 2)
    p = clients.producer(cfg.kafka)
    for i in range(PER_KEY):
        for k in range(KEYS):
            p.send(q.name, key=b"k%d" % k, value=b"k%d/%d" % (k, i))
    p.flush()
    p.close()
    everything = {f"k{k}/{i}" for k in range(KEYS) for i in range(PER_KEY)}
    with running_tracker(cfg):
        first = spawn(bootstrap, q.name, cfg.consumer.group_id)
        a = Completions(first)
        try:
            wait_until(lambda: len(a.values) >= len(everything) // 4, 60, what="a quarter done by the first worker")
        finally:
            first.kill()  # SIGKILL: its handed-over and held messages are left to their leases
            first.wait(10)
        second = spawn(bootstrap, q.name, cfg.consumer.group_id)
        b = Completions(second)
        try:
            wait_until(lambda: everything <= set(a.values) | set(b.values), 120,
                       what="every message completed by one of the workers")
        finally:
            second.kill()
            second.wait(10)
    done = a.values + b.values
    assert everything <= set(done)
    by_key: dict[str, list[int]] = {}
    for v in dict.fromkeys(done):  # first completion of each
        key, seq = v.split("/")
        by_key.setdefault(key, []).append(int(seq))
    out_of_order = sorted(k for k, seqs in by_key.items() if seqs != sorted(seqs))
    print(f"killed after {len(a.values)} completions; {len(done) - len(set(done))} duplicate completions; "
          f"keys out of order across the change of owner: {len(out_of_order)} of {KEYS} {out_of_order}")
