"""Chaos: a mixed fleet of real worker and `kmq tracker run` processes, killed mid-run.

10,000 messages (1 % poison) on 4 partitions; 4 workers of mixed kinds in one
group (`FLEET`: `kmq work` on kafka-python, `kmq work` on confluent-kafka,
`kmq work --asyncio` (kmq.aio), and a user's own confluent-kafka loop adopted
with MarkerWriter/@kmq.marked), all with the same failure, hang and
poison injection, the confluent loop SIGKILLed and restarted; 2 trackers, one
reading and producing with kafka-python and one with confluent-kafka
(`TRACKER_CLIENTS`), the kafka-python one SIGKILLed so the confluent one
finishes the run.
End state: every non-poison message acked at least once, every poison message
in the DLQ with its headers (twice only if delivered twice or inside the killed tracker's window
between a dead letter and its CLOSED marker), nothing lost; duplicates reported.

One hostile record of each kind rides along (produced with confluent-kafka,
which writes what kafka-python refuses): a poison record with a null header
value (dead-lettered, the header as b"" plus kmq-null-header), a tombstone
(acked, or dead-lettered as undeliverable), a poison record larger than the
trackers' max_request_size (closed as undeliverable, CLOSED outcome 4, and
named in the DLQ by a reference dead letter without its payload) and a poison
record with hostile kmq headers (dead-lettered as usual).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

import pytest
import yaml

from kmq.config import Config
from kmq.core.markers import Outcome, decode
from tests.helpers.fleet import KMQ_WORK, WorkerKind, acked_ids, timelines
from tests.helpers.kafka import read_all, set_max_message_bytes
from tests.integration.tracker_util import TrackerProcess, headers, markers_covering, metric

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(420)]

N = 10_000
POISON_RATE = 0.01
PARTITIONS = 4
MAX_REQUEST = 16_384  # the trackers' producer limit: the oversize hostile record exceeds it
HOSTILE = [
    {"key": b"h-null-header", "value": b"POISON:null-header", "headers": [("trace", None)]},
    {"key": None, "value": None},  # tombstone
    {"key": b"h-big", "value": b"POISON:" + b"x" * (2 * MAX_REQUEST)},
    {"key": b"h-kmq-headers", "value": b"POISON:kmq-headers",
     "headers": [("kmq-delivery-count", b"\xff\xfe"), ("kmq-origin", None)]},
]


def _produce_hostile(bootstrap: str, topic: str) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for i, rec in enumerate(HOSTILE):
        p.produce(topic, partition=i % PARTITIONS, **rec)
    assert p.flush(10) == 0


MARKED_LOOP = ("-m", "tests.helpers.marked_worker")  # a confluent-kafka loop with MarkerWriter/@kmq.marked

# The fleet, one line a worker; adding a kind is adding a line.
FLEET = [
    WorkerKind("kmq work (kafka-python)", KMQ_WORK),
    WorkerKind("confluent-kafka loop + MarkerWriter (confluent markers)", MARKED_LOOP, (("KMQ_KAFKA__CLIENT", "confluent"),)),
    WorkerKind("kmq work (confluent)", KMQ_WORK, (("KMQ_KAFKA__CLIENT", "confluent"),)),
    WorkerKind("kmq work --asyncio (kafka-python)", (*KMQ_WORK, "--asyncio")),
]
# (worker index, acks so far): SIGKILLed then and restarted as the same kind. Every kill must land
# while messages still arrive (asserted; the producer needs 14.3 s, and acks stall for a SIGKILL
# hand-over of ~9 s after each kill). The confluent loop is the kind no other crash test kills.
KILLED = [(1, 4_000)]
# One tracker per client (kafka.client: its group membership, originals read, copies and CLOSED markers produced);
# TRACKER_CLIENTS[0] is SIGKILLed and the other takes over its partitions.
TRACKER_CLIENTS = ["kafka-python", "confluent"]


class Worker:
    def __init__(self, kind: WorkerKind, cfg_path, queue: str, ack_log, out) -> None:
        self.kind = kind
        self.ack_log = ack_log
        self.proc = subprocess.Popen(
            [sys.executable, *kind.command, queue, "--config", str(cfg_path),
             "--fail-rate", "0.02", "--hang-rate", "0.02", "--poison-rate", str(POISON_RATE),
             "--ack-log", str(ack_log)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **dict(kind.env)},
        )

    def stop(self, sig_kill: bool = False) -> None:
        if self.proc.poll() is None:
            if sig_kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def with_client(cfg: Config, client: str) -> Config:
    """``cfg`` with ``kafka.client`` set to ``client``."""
    data = cfg.to_dict(redact=False)
    data["kafka"]["client"] = client
    return Config.from_dict(data)


def test_workers_and_trackers_killed_mid_run_lose_nothing(bootstrap, queue_topics, tmp_path):
    # max_deliveries 8: besides injected fails and hangs, every worker kill and rebalance costs a
    # delivery (in-flight leases expire, prefetched batches are NACKed on revoke), and a duplicate
    # copy starts its own lineage; 8 keeps a healthy message out of the DLQ, so any non-poison
    # dead letter below is a real fault.
    t_start = time.monotonic()
    cfg, q = queue_topics(PARTITIONS, queue={"lease": "2s", "max_deliveries": 8,
                                             "backoff": {"initial": "200ms", "max": "1s", "multiplier": 2.0}},
                          tracker={"tick": "50ms", "max_request_size": MAX_REQUEST})
    # Where the broker reports topic limits the trackers' producer follows them: the DLQ's is what the
    # oversize poison record exceeds there (tansu reports none, and the trackers' max_request_size decides).
    set_max_message_bytes(bootstrap, MAX_REQUEST, q.dlq_topic)
    cfg_path = tmp_path / "kmq.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg.to_dict(redact=False)))
    out = open(tmp_path / "workers.log", "ab")
    logs = [tmp_path / f"acks-{i}.log" for i in range(len(FLEET) + len(KILLED))]  # then the restarted workers
    trackers = [TrackerProcess(with_client(cfg, client), tmp_path) for client in TRACKER_CLIENTS]
    workers = [Worker(kind, cfg_path, q.name, logs[i], out) for i, kind in enumerate(FLEET)]
    producer = None
    try:
        for t in trackers:
            t.wait_ready(60)
        _produce_hostile(bootstrap, q.name)
        # Produced at 700/s in the background: the kills below happen while messages still arrive.
        producer = subprocess.Popen(
            [sys.executable, "-m", "kmq", "produce", q.name, "--config", str(cfg_path), "-n", str(N),
             "--poison-rate", str(POISON_RATE), "--rate", "700"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        produce_start, kills = time.monotonic(), []  # the producer needs N / 700 = 14.3 s

        def wait_acks(n: int, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while sum(acked_ids(logs).values()) < n:
                assert time.monotonic() < deadline, f"only {sum(acked_ids(logs).values())} acks"
                time.sleep(0.05)

        wait_acks(2_000, 120)
        assert producer.poll() is None, "the producer finished before the tracker kill: not mid-run"
        tracker_killed_ms = int(time.time() * 1000)
        trackers[0].kill()  # its partitions move to the other tracker after the session timeout
        for j, (i, acks) in enumerate(KILLED):
            wait_acks(acks, 120)
            assert producer.poll() is None, f"the producer finished before worker {i} was killed: not mid-run"
            workers[i].stop(sig_kill=True)
            kills.append(f"worker {i} at {time.monotonic() - produce_start:.1f}s")
            workers[i] = Worker(FLEET[i], cfg_path, q.name, logs[len(FLEET) + j], out)  # restarted
        assert producer.wait(120) == 0
        print(f"killed mid-run: {', '.join(kills)}; producer done at {time.monotonic() - produce_start:.1f}s")
        # Copies carry a non-null kmq-origin; an original may carry a null one (the hostile record).
        originals = [r for r in read_all(bootstrap, q.name, expect=None, timeout=30)
                     if not any(k == "kmq-origin" and v is not None for k, v in (r.headers or []))]
        originals = {f"{q.name}/{r.partition}/{r.offset}": r.value for r in originals}
        assert len(originals) == N + len(HOSTILE)
        poison = {o for o, v in originals.items() if v is not None and v.startswith(b"POISON:")}
        assert len(poison) == int(N * POISON_RATE) + 3
        (big,) = [o for o, v in originals.items() if v is not None and len(v) > MAX_REQUEST]
        (tombstone,) = [o for o, v in originals.items() if v is None]
        poison_dead = poison - {big}  # the oversize poison fits no DLQ copy: a reference, closed as undeliverable
        wanted = set(originals) - poison - {tombstone}

        deadline = time.monotonic() + 200
        dead: list = []
        while True:
            acked = acked_ids(logs)
            dead = read_all(bootstrap, q.dlq_topic, timeout=10)
            dead_origins = {headers(d)["kmq-origin"] for d in dead}
            if wanted <= set(acked) and poison_dead | {big} <= dead_origins and tombstone in set(acked) | dead_origins:
                break
            assert time.monotonic() < deadline, (
                f"not settled: {len(wanted - set(acked))} non-poison unacked "
                f"(e.g. {sorted(wanted - set(acked))[:5]}), {len(poison_dead - dead_origins)} poison not in the DLQ"
                + timelines(cfg, q.name, sorted(wanted - set(acked))[:3]))
            time.sleep(1)
        for w in workers:
            w.stop()
        redelivered = metric(trackers[1].wait_port(), "kmq_tracker_redelivered_total", queue=q.name)
        assert redelivered > 0  # hangs and fails went through the surviving tracker
        # Nothing lost: every message acked or dead-lettered, the oversize one closed as undeliverable.
        acked = acked_ids(logs)
        assert set(originals) - {big} <= set(acked) | dead_origins
        # Every kind of worker in the fleet did its share (a kind that never joined the group would not).
        kind_of_log = [k.name for k in FLEET] + [FLEET[i].name for i, _ in KILLED]
        acks_by_kind: collections.Counter = collections.Counter()
        for name, path in zip(kind_of_log, logs):
            acks_by_kind[name] += sum(acked_ids([path]).values())
        assert all(acks_by_kind[k.name] > 0 for k in FLEET), acks_by_kind
        big_offset = int(big.rsplit("/", 1)[1])
        undeliverable = [m for r in read_all(bootstrap, q.markers_topic, timeout=30)
                         if int.from_bytes(r.key, "big") == int(big.split("/")[1])
                         for m in [decode(r.value)] if m.TYPE.name == "CLOSED" and m.outcome is Outcome.UNDELIVERABLE]
        assert any(big_offset in rg for m in undeliverable for rg in m.ranges)
        # Every poison message in the DLQ, with its headers; nothing else there.
        by_origin = collections.Counter(headers(d)["kmq-origin"] for d in dead)
        unexpected = [(headers(d), acked.get(headers(d)["kmq-origin"], 0)) for d in dead
                      if headers(d)["kmq-origin"] not in poison_dead | {tombstone, big}]
        assert not unexpected, unexpected[:5]
        # A poison message is dead-lettered once per delivery (each delivery rejects it), and once
        # more only when the killed tracker wrote its dead letter and died before its CLOSED marker
        # (docs/protocol.md). At-least-once allows a second delivery of an original (e.g. a member
        # that still held a partition for a moment during a rebalance, as duplicate acks show): so
        # an origin dead-lettered n times needs n STARTs covering it, or a first copy before the kill.
        first_ts: dict = {}
        for d in dead:
            o = headers(d)["kmq-origin"]
            ts = int(headers(d)["kmq-dlq-ts"])  # when the tracker wrote it
            first_ts[o] = min(first_ts.get(o, ts), ts)
        twice = [o for o, c in by_origin.items() if c > 1]
        after_kill = [o for o in twice if first_ts[o] > tracker_killed_ms + 1000]
        covering = {o: markers_covering(bootstrap, q.markers_topic, o) for o in after_kill}
        unexplained = [o for o in after_kill if sum(m[1] == "START" for m in covering[o]) < by_origin[o]]
        assert not unexplained, [
            (o, [{k: v for k, v in headers(d).items() if k.startswith("kmq-")} for d in dead if headers(d)["kmq-origin"] == o],
             f"first {first_ts[o] - tracker_killed_ms} ms after the tracker kill", covering[o]) for o in unexplained][:3]
        print(f"dead-lettered twice: {len(twice) - len(after_kill)} in the tracker kill window, "
              f"{len(after_kill)} delivered twice; of {len(by_origin)}")
        for d in dead:
            h = headers(d)
            if h["kmq-origin"] == tombstone:
                assert h["kmq-dlq-reason"] == "undeliverable" and d.value == b""
                continue
            if h["kmq-origin"] == big:  # a reference: where the record is, its size; no payload
                assert h["kmq-dlq-reference"] == big and int(h["kmq-dlq-size"]) > 2 * MAX_REQUEST and not d.value
                assert h["kmq-dlq-reason"] == "undeliverable"
                continue
            if d.key == b"h-null-header":
                assert h["trace"] == "" and h["kmq-null-header"] == "trace"
            assert h["kmq-dlq-reason"] == "rejected" and h["kmq-dlq-error"] == "poison payload"
            assert int(h["kmq-dlq-ts"]) > 0 and int(h["kmq-delivery-count"]) >= 1
            assert d.value == originals[h["kmq-origin"]]
        duplicates = sum(c - 1 for c in acked.values() if c > 1)
        print(f"\nchaos: {N} messages + {len(HOSTILE)} hostile, {len(poison_dead)} poison dead-lettered once, "
              f"1 closed undeliverable (a reference dead letter names it), 0 lost, "
              f"{duplicates} duplicate acks ({sum(1 for c in acked.values() if c > 1)} messages acked more than once), "
              f"{sum(acked.values())} acks in all ({dict(acks_by_kind)}), {redelivered:.0f} redelivered by the "
              f"surviving tracker ({TRACKER_CLIENTS[1]}), {time.monotonic() - t_start:.0f}s")
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait(10)
        for w in workers:
            w.stop(sig_kill=True)
        for t in trackers:
            t.close()
        out.close()
