"""The simulated cluster is deterministic: the same seed gives the same history, byte for byte,
in this process and in another one with a different string-hash seed."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

from kmq.client import ClientCommitFailed, ProduceFailed
from kmq.dev.sim import FaultPlan, SimCluster, SimConsumer, SimProducer

ROOT = Path(__file__).resolve().parents[2]


def scenario(seed: int, horizon: float = 40.0) -> SimCluster:
    """Two group members and a producer under a fault plan drawn from ``seed``; every choice of the
    workload comes from the seed too."""
    plan = FaultPlan.random(seed, topics={"q": 3}, consumers=["w1", "w2"], group="g", horizon=horizon, count=12)
    c = SimCluster(seed, plan, session_timeout=10.0, latency=(0.0, 0.05), segment_records=20)
    c.create_topic("q", 3)
    rng = random.Random(seed)
    producer = SimProducer(c, delivery_timeout=5.0)
    members = []
    for name in ("w1", "w2"):
        m = SimConsumer(c, name, group_id="g")
        m.subscribe(["q"], lambda s, n=name: c.record(f"callback {n} assigned {sorted(s)}"),
                    lambda s, n=name: c.record(f"callback {n} revoked {sorted(s)}"))
        members.append(m)
    n = 0
    while c.t() < horizon:
        for _ in range(rng.randint(0, 3)):
            fut = producer.send("q", b"v%d" % n, key=b"k%d" % rng.randint(0, 9))
            fut.add_both(lambda result, i=n: c.record(f"delivery {i}: {type(result).__name__}"))
            n += 1
        m = rng.choice(members)
        if c.frozen(m.name):  # a frozen process makes no calls (the others go on)
            c.clock.advance(0.01)
            continue
        got = m.fetch(rng.uniform(0.0, 0.5), 20)
        if got:
            try:
                m.commit({(r.topic, r.partition): r.offset + 1 for r in got})
            except ClientCommitFailed as exc:
                c.record(f"workload saw a failed commit: rebalanced={exc.rebalanced}")
        c.clock.advance(0.01)
    try:
        producer.flush(10.0)
    except ProduceFailed:
        pass
    return c


def test_the_same_seed_gives_the_same_history_byte_for_byte():
    first, second = scenario(7), scenario(7)
    assert len(first.history) > 200
    assert first.history_bytes() == second.history_bytes()


def test_different_seeds_give_different_histories():
    assert len({scenario(seed).digest() for seed in (1, 2, 3)}) == 3


def test_the_history_does_not_depend_on_the_process_hash_seed():
    """Set and dict order of strings changes with PYTHONHASHSEED; the simulation must not."""
    code = "from tests.unit.test_sim_determinism import scenario; print(scenario(11).digest())"
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        digests.add(done.stdout.strip())
    assert digests == {scenario(11).digest()}
