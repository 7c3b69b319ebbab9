"""`kmq demo --duration 20` end to end; its guarantee line is checked against an
independent count made here from the three topics."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kmq.dev.workload import fate
from kmq.core.markers import End, decode, decode_key
from tests.helpers.kafka import read_all

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _header(record, name):
    for k, v in record.headers or ():
        if k == name:
            return v.decode()
    return None


def test_demo_runs_to_its_summary_and_the_guarantee_line_is_true(bootstrap):
    proc = subprocess.run(
        [sys.executable, "-m", "kmq", "demo", "--duration", "20", "--messages", "800", "--bootstrap", bootstrap],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "[" in out and "running]" in out  # progress was shown while it ran
    line = next(s for s in out.splitlines() if s.startswith("guarantee:"))
    m = re.match(
        r"guarantee: 0 lost \| produced (\d+) \| acked (\d+) \| dead-lettered (\d+) \((.*)\) \| redelivered (\d+) \| duplicates (\d+)",
        line,
    )
    assert m, line
    produced, acked, dead, reasons, redelivered, duplicates = m.groups()
    queue = re.search(r"messages produced to (\S+);", out).group(1)

    # Independent count from the topics.
    queue_records = read_all(bootstrap, queue)
    originals = {f"{queue}/{r.partition}/{r.offset}" for r in queue_records if _header(r, "kmq-origin") is None}
    origin_of = {(r.partition, r.offset): _header(r, "kmq-origin") or f"{queue}/{r.partition}/{r.offset}" for r in queue_records}
    acked_origins = set()
    for rec in read_all(bootstrap, f"{queue}__markers"):
        marker = decode(rec.value)
        if isinstance(marker, End):
            p = decode_key(rec.key)
            acked_origins |= {origin_of[(p, o)] for r in marker.ranges for o in r.offsets()}
    dlq = read_all(bootstrap, f"{queue}__dlq")
    dead_origins = {_header(r, "kmq-origin") for r in dlq}
    poison = {o for o in originals if any(r.value.startswith(b"POISON:") for r in queue_records if origin_of[(r.partition, r.offset)] == o)}

    assert len(originals) == int(produced) == 800
    assert len(acked_origins & originals) == int(acked)
    assert len(dead_origins) == int(dead) == len(dlq)  # each dead letter exactly once
    assert originals == (acked_origins | dead_origins) & originals  # 0 lost
    assert poison <= dead_origins and not (acked_origins & poison)
    # A good message is dead-lettered only when the demo's injected fates made its last delivery fail,
    # hang or run slow (fail 3 % + hang 1 % + slow 1 % a delivery, 3 deliveries: about 1 run in 20
    # has one), or when it was also acked (a slow delivery acked after its copies reached the limit).
    for o in dead_origins - poison:
        assert o in acked_origins or fate(o, 3, 0.03, 0.01, 0.01) != "ok", o
    reason_of = {_header(r, "kmq-origin"): _header(r, "kmq-dlq-reason") for r in dlq}
    assert {reason_of[o] for o in poison} <= {"rejected"} and f"rejected {len(poison)}" in reasons
    assert {reason_of[o] for o in dead_origins - poison} <= {"nack-limit", "timeout"}
    # The demo's own account agrees (it exits non-zero on a dead letter no injection explains).
    injected = re.search(r"(\d+) of the dead letters are good messages", out)
    assert (int(injected.group(1)) if injected else 0) == len(dead_origins - poison)
    assert "no injected cause" not in out
    assert len(queue_records) - len(originals) >= int(redelivered) > 0  # hangs and fails were redelivered
    # With Redis (the suite installs redis-server), every duplicate ack was a guard skip: no second effect.
    guard = re.search(r"IdempotencyGuard \(local Redis\): (\d+) duplicate deliveries", out)
    if guard is not None:
        assert int(guard.group(1)) == int(duplicates)
    else:
        assert "IdempotencyGuard: off" in out
