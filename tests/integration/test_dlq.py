"""``kmq dlq list|replay`` on the real broker."""

from __future__ import annotations

import collections

import pytest
from click.testing import CliRunner

from kmq.cli import cli
from tests.helpers.kafka import produce
from tests.integration.tracker_util import Tail, headers

pytestmark = pytest.mark.integration


def _dead_letters(bootstrap, q):
    produce(bootstrap, q.dlq_topic, 3, keys=b"t%d", values=b"late", flush_each=True, headers=lambda i: [
        ("app", b"a"), ("kmq-delivery-count", b"5"), ("kmq-origin", f"{q.name}/0/{i}".encode()),
        ("kmq-dlq-reason", b"timeout"), ("kmq-dlq-ts", b"1")])
    produce(bootstrap, q.dlq_topic, 2, keys=b"r%d", values=b"bad", partition=1, flush_each=True, headers=lambda i: [
        ("app", b"b"), ("kmq-delivery-count", b"1"), ("kmq-origin", f"{q.name}/1/{i}".encode()),
        ("kmq-dlq-reason", b"rejected"), ("kmq-dlq-error", b"bad payload"), ("kmq-dlq-ts", b"1")])


def test_list_and_replay_once_with_reason_limit_and_rate(bootstrap, queue_topics):
    cfg, q = queue_topics(2)
    _dead_letters(bootstrap, q)
    run = CliRunner()
    res = run.invoke(cli, ["dlq", "list", q.name, "--bootstrap", bootstrap])
    assert res.exit_code == 0, res.output
    assert res.output.count("kmq-dlq-reason: timeout") == 3 and "kmq-dlq-error: bad payload" in res.output
    assert "5 dead letter(s)" in res.output
    res = run.invoke(cli, ["dlq", "list", q.name, "--reason", "rejected", "--bootstrap", bootstrap])
    assert res.exit_code == 0, res.output
    assert "2 dead letter(s)" in res.output and "kmq-dlq-reason: timeout" not in res.output

    def replay(*extra):
        r = run.invoke(cli, ["dlq", "replay", q.name, "--bootstrap", bootstrap, *extra])
        assert r.exit_code == 0, r.output
        return r.output

    assert "replayed 2 message(s)" in replay("--reason", "rejected")
    assert "replayed 0 message(s)" in replay("--reason", "rejected")  # position committed: not repeated
    tail = Tail(bootstrap, q.name, (0, 1))
    try:
        recs = tail.wait_for(2, what="replayed rejected messages")
        for r in recs:
            h = headers(r)
            assert r.partition == 1 and r.value == b"bad"
            assert h.pop("kmq-replay-of").startswith(f"{q.dlq_topic}/1/")
            # Count and dlq headers dropped; kmq-group keeps the replay its group's (the default group here).
            assert h == {"app": "b", "kmq-origin": f"{q.name}/1/{r.key.decode()[1:]}", "kmq-group": "default"}
        # Unfiltered replay: its own group, limited and rate-capped, then the rest, each exactly once.
        assert "replayed 2 message(s)" in replay("--limit", "2", "--rate", "50")
        assert "replayed 3 message(s)" in replay()
        assert "replayed 0 message(s)" in replay()
        recs = tail.wait_for(7, what="all replays")
        assert sorted(r.key for r in recs) == sorted([b"r0", b"r1", b"r0", b"r1", b"t0", b"t1", b"t2"])
        assert all(r.partition == (0 if r.key.startswith(b"t") else 1) for r in recs)
    finally:
        tail.close()


def test_replay_handles_hostile_dead_letters_without_a_traceback(bootstrap, queue_topics):
    confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
    cfg, q = queue_topics(2)
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 5_000_000})
    for rec in [
        {"key": b"nh", "value": b"1", "headers": [("trace", None), ("kmq-origin", f"{q.name}/1/0".encode())]},
        {"key": None, "value": None, "headers": [("kmq-origin", f"{q.name}/0/1".encode())]},  # tombstone
        {"key": b"neg", "value": b"2", "headers": [("kmq-origin", f"{q.name}/-1/5".encode())]},
        {"key": b"junk", "value": b"3", "headers": [("kmq-origin", b"\xff\xfe/x/y"), ("kmq-dlq-reason", None)]},
        {"key": b"big", "value": b"x" * 3000, "headers": []},
        {"key": b"ok", "value": b"4", "headers": [("kmq-origin", f"{q.name}/0/9".encode())]},
    ]:
        p.produce(q.dlq_topic, partition=0, **rec)
    assert p.flush(10) == 0
    del p
    res = CliRunner().invoke(cli, ["dlq", "replay", q.name, "--bootstrap", bootstrap],
                             env={"KMQ_TRACKER__MAX_REQUEST_SIZE": "2048"})
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert "replayed 4 message(s)" in res.output
    assert res.output.count("not replayable, left in the DLQ") == 2 and "0:1 tombstone" in res.output
    assert "0:4 RecordTooLarge: MessageSizeTooLargeError" in res.output  # kmq's class, the client's in its text
    tail = Tail(bootstrap, q.name, (0, 1))
    try:
        recs = {r.key: r for r in tail.wait_for(4, what="replayed copies")}
    finally:
        tail.close()
    assert set(recs) == {b"nh", b"neg", b"junk", b"ok"}
    nh = dict(recs[b"nh"].headers)
    assert recs[b"nh"].partition == 1 and nh["trace"] == b"" and nh["kmq-null-header"] == b"trace"
    assert recs[b"ok"].partition == 0
    assert "replayed 0 message(s)" in CliRunner().invoke(cli, ["dlq", "replay", q.name, "--bootstrap", bootstrap]).output


def test_replay_killed_mid_batch_then_rerun_copies_nothing_twice(bootstrap, queue_topics, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from tests.helpers.kafka import read_all
    from tests.integration.tracker_util import committed

    n = 300
    cfg, q = queue_topics(1)
    produce(bootstrap, q.dlq_topic, n, keys=b"k%d", values=b"v", settings={"linger_ms": 5}, headers=lambda i: [
        ("kmq-origin", f"{q.name}/0/{i}".encode()), ("kmq-dlq-reason", b"timeout")])
    log = open(tmp_path / "replay.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "kmq", "dlq", "replay", q.name, "--bootstrap", bootstrap,
                             "--rate", "40"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    tail = Tail(bootstrap, q.name)
    try:
        tail.wait_for(60, timeout=60, what="the first copies of the replay")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
        tail.close()
    group = f"{cfg.tracker.group_id}-dlq-replay-{q.name}"
    copied = len(read_all(bootstrap, q.name, timeout=5))
    position = committed(bootstrap, group, q.dlq_topic) or 0
    assert position < copied < n  # killed inside a batch: copies exist that the DLQ position does not cover
    res = CliRunner().invoke(cli, ["dlq", "replay", q.name, "--bootstrap", bootstrap])
    assert res.exit_code == 0, res.output
    assert f"{copied - position} already copied by an interrupted run" in res.output
    recs = read_all(bootstrap, q.name, timeout=10)
    of = collections.Counter(dict(r.headers)["kmq-replay-of"] for r in recs)
    assert len(recs) == n and len(of) == n and max(of.values()) == 1  # each dead letter copied exactly once
