"""``kmq dlq list|replay`` on the real broker."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from kafka import KafkaProducer

from kmq.cli import cli
from tests.integration.tracker_util import Tail, headers

pytestmark = pytest.mark.integration


def _dead_letters(bootstrap, q):
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(3):
        p.send(q.dlq_topic, key=f"t{i}".encode(), value=b"late", partition=0, headers=[
            ("app", b"a"), ("kmq-delivery-count", b"5"), ("kmq-origin", f"{q.name}/0/{i}".encode()),
            ("kmq-dlq-reason", b"timeout"), ("kmq-dlq-ts", b"1")]).get(10)
    for i in range(2):
        p.send(q.dlq_topic, key=f"r{i}".encode(), value=b"bad", partition=1, headers=[
            ("app", b"b"), ("kmq-delivery-count", b"1"), ("kmq-origin", f"{q.name}/1/{i}".encode()),
            ("kmq-dlq-reason", b"rejected"), ("kmq-dlq-error", b"bad payload"), ("kmq-dlq-ts", b"1")]).get(10)
    p.close()


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
            assert h == {"app": "b", "kmq-origin": f"{q.name}/1/{r.key.decode()[1:]}"}  # count and dlq headers dropped
        # Unfiltered replay: its own group, limited and rate-capped, then the rest, each exactly once.
        assert "replayed 2 message(s)" in replay("--limit", "2", "--rate", "50")
        assert "replayed 3 message(s)" in replay()
        assert "replayed 0 message(s)" in replay()
        recs = tail.wait_for(7, what="all replays")
        assert sorted(r.key for r in recs) == sorted([b"r0", b"r1", b"r0", b"r1", b"t0", b"t1", b"t2"])
        assert all(r.partition == (0 if r.key.startswith(b"t") else 1) for r in recs)
    finally:
        tail.close()
