"""Random and mutated marker records written to a live tracker's markers topic.

The tracker (a real ``kmq tracker run`` process) must not crash, must keep its
memory bounded (segments, not offsets: STARTs of 4 billion offsets included),
must count every record that is not a valid marker, and must still redeliver
ordinary work afterwards. A mutation that looks like a marker of a newer wire
version the tracker cannot read (a marker's header and ranges, an unknown type)
is not garbage by the protocol's rule for rolling upgrades: it holds the
partition. Those are written last, and the tracker must hold, not crash.
"""

from __future__ import annotations

import random

import pytest

from kmq.core.errors import MarkerDecodeError
from kmq.core.markers import (BadMarker, Closed, End, Nack, Outcome, Reject, Renew, Start, decode, decode_key,
                              decode_record, encode, encode_key)
from tests.helpers.kafka import wait_until
from tests.integration.tracker_util import MarkerProducer, Tail, TrackerProcess, http_status, metric

pytestmark = pytest.mark.integration

confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")

N = 4000
U32 = 0xFFFFFFFF


def _ranges(rnd: random.Random):
    out, at = [], rnd.choice([0, rnd.randrange(1 << 20), rnd.randrange(1 << 62)])
    for _ in range(rnd.randint(1, 4)):
        count = rnd.choice([1, rnd.randint(1, 500), U32])
        if at + count > (1 << 63) - 1:
            break
        out.append((at, count))
        at += count + rnd.randint(1, 1000)
    return out or [(0, 1)]


def _valid(rnd: random.Random) -> bytes:
    r = _ranges(rnd)
    kind = rnd.randrange(6)
    if kind == 0:
        return encode(Start(r, lease_ms=rnd.choice([1, 50, U32]), owner="f" * rnd.randint(0, 255)))
    if kind == 1:
        return encode(End(r))
    if kind == 2:
        return encode(Renew(r, lease_ms=rnd.choice([0, U32])))
    if kind == 3:
        return encode(Nack(r, delay_ms=rnd.choice([0, U32])))
    if kind == 4:
        return encode(Reject(r, reason="r" * rnd.randint(0, 300)))
    return encode(Closed(r, rnd.choice(list(Outcome))))


def _mutate(rnd: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    how = rnd.randrange(4)
    if how == 0 and b:
        for _ in range(rnd.randint(1, 4)):
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
    elif how == 1:
        del b[rnd.randrange(len(b) + 1):]
    elif how == 2:
        b += bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
    else:
        b[1:2] = bytes([rnd.randrange(256)])
    return bytes(b)


def _records(seed: int = 11):
    rnd = random.Random(seed)
    for _ in range(N):
        pick = rnd.random()
        key = encode_key(0)
        if pick < 0.35:
            value = _valid(rnd)
        elif pick < 0.8:
            value = _mutate(rnd, _valid(rnd))
        elif pick < 0.9:
            value = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 64)))
        else:
            value = None
            key = rnd.choice([None, b"", b"\x00\x00\x00\x00\x00", encode_key(-1), encode_key(1), encode_key(0)])
        if rnd.random() < 0.05:
            key = rnd.choice([None, b"xx", encode_key(3)])
        yield key, value


def _is_bad(key, value) -> bool:
    try:
        if decode_key(key) != 0:
            return True
        decode(value)
    except MarkerDecodeError:
        return True
    return False


def _holds(key, value) -> bool:
    """Whether the tracker holds partition 0 at this record: a marker of a newer version it cannot read."""
    got = decode_record(key, value, 0)
    return isinstance(got, BadMarker) and got.newer is not None


def _rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_fuzzed_markers_never_crash_the_tracker_and_bad_ones_are_counted(bootstrap, queue_topics, tmp_path):
    cfg, q = queue_topics(1, queue={"lease": "1s", "max_deliveries": 3,
                                    "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0}})
    tracker = TrackerProcess(cfg, tmp_path)
    try:
        port = tracker.wait_ready()
        rss_before = _rss_kb(tracker.proc.pid)
        p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        bad = 0
        records = list(_records())
        holding = [(k, v) for k, v in records if _holds(k, v)]
        for key, value in records:
            if (key, value) in holding:
                continue
            bad += _is_bad(key, value)
            p.produce(q.markers_topic, partition=0, key=key, value=value)
            p.poll(0)
        assert p.flush(30) == 0
        assert 1000 < bad < N  # the mix really holds both
        wait_until(lambda: metric(port, "kmq_tracker_bad_markers_total") == bad, 60, what=f"{bad} bad markers counted")
        assert tracker.proc.poll() is None and http_status(port, "/healthz") == 200
        # STARTs for offsets the (empty) queue never had are past its end: held, billions at a time,
        # and never closed (nothing is below its log start).
        wait_until(lambda: metric(port, "kmq_tracker_offsets_past_log_end_total", queue=q.name) > U32, 60,
                   what="huge STARTs held past the log end")
        assert metric(port, "kmq_tracker_missing_offsets_total", queue=q.name) == 0
        rss_after = _rss_kb(tracker.proc.pid)
        assert rss_after - rss_before < 150_000, (rss_before, rss_after)

        # Ordinary work afterwards is redelivered as usual.
        from tests.helpers.kafka import APP_RECORD, produce

        base = produce(bootstrap, q.name, 1, **APP_RECORD)[0].offset
        tail = Tail(bootstrap, q.name)
        markers = MarkerProducer(bootstrap, q.markers_topic)
        try:
            markers.send(0, Start([(base, 1)], lease_ms=500, owner="w"))
            copy = tail.wait_for(2, what="the ordinary redelivery")[1]
            assert dict(copy.headers)["kmq-origin"] == f"{q.name}/0/{base}".encode()
        finally:
            tail.close()
            markers.close()
        # Last, the mutations that look like markers of a newer version: the partition is held, nothing crashes.
        assert holding, "the seed's mix holds no such record any more: pick one that does"
        for key, value in holding:
            p.produce(q.markers_topic, partition=0, key=key, value=value)
        assert p.flush(30) == 0
        del p  # librdkafka threads end with the producer, before the broker does
        wait_until(lambda: metric(port, "kmq_tracker_held_partitions", queue=q.name) == 1, 30, what="partition held")
        assert metric(port, "kmq_tracker_newer_markers_total", queue=q.name, handling="held") == 1
        assert metric(port, "kmq_tracker_bad_markers_total") == bad
        assert tracker.proc.poll() is None and http_status(port, "/healthz") == 200
        assert b"Traceback" not in tracker.log_path.read_bytes()  # no unexpected failure, even a survived one
        print(f"\nfuzz: {N} records, {bad} bad counted, {len(holding)} held at, RSS {rss_before // 1024} -> "
              f"{rss_after // 1024} MB")
    finally:
        tracker.close()
