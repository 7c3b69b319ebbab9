"""PartitionLagState.apply_decoded (the lag job's batch path) equals apply() record by record."""

from __future__ import annotations

import random

import pytest

from kmq.core import markers as mk
from kmq.core.markers_bulk import decode_records
from kmq.core.lag_state import PartitionLagState

W = 1000


def _workload(rng: random.Random, n: int, partition: int = 0) -> list[tuple[int, bytes | None]]:
    """(timestamp, value) records: starts, acks (some late or partial), re-starts, nacks,
    rejects, closes, renews, junk; timestamps mostly rising, sometimes from the past."""
    out: list[tuple[int, bytes | None]] = []
    ts, off = 10_000, 0
    open_: list[tuple[int, int]] = []
    done: list[tuple[int, int]] = []
    while len(out) < n:
        ts += rng.choice([0, 1, 5, 40, 300, 1500])
        t = ts - rng.choice([0, 0, 0, 0, 2500])  # a marker from a closed window now and then
        roll = rng.random()
        if roll < 0.35 or not open_:
            size = rng.randint(1, 30)
            gap = rng.choice([0, 0, 0, 3])
            out.append((t, mk.encode(mk.Start(ranges=((off + gap, size),), lease_ms=1, owner="w"))))
            open_.append((off + gap, size))
            off += gap + size
        elif roll < 0.65:
            b = open_.pop(rng.randrange(len(open_)))
            if rng.random() < 0.2 and b[1] > 2:  # a partial ack
                b = (b[0] + 1, b[1] - 2)
            out.append((t, mk.encode(mk.End(ranges=(b,)))))
            done.append(b)
        elif roll < 0.7 and done:
            out.append((t, mk.encode(mk.Start(ranges=(rng.choice(done),), lease_ms=1))))  # re-START of closed offsets
        elif roll < 0.75 and done:
            out.append((t, mk.encode(mk.End(ranges=(rng.choice(done),)))))  # late ack
        elif roll < 0.8 and len(open_) >= 2:
            a, b = open_.pop(0), open_.pop(0)
            if a[0] + a[1] < b[0]:
                out.append((t, mk.encode(mk.End(ranges=(a, b)))))  # two ranges in one marker
                done += [a, b]
        elif roll < 0.85:
            b = open_.pop(0)
            out.append((t, mk.encode(mk.Nack(ranges=(b,), delay_ms=0))))
            out.append((t, mk.encode(mk.Closed(ranges=(b,), outcome=rng.choice(list(mk.Outcome))))))
        elif roll < 0.9:
            b = open_.pop(0)
            out.append((t, mk.encode(mk.Reject(ranges=(b,), reason="x"))))
        elif roll < 0.95:
            out.append((t, rng.choice([b"\x01", None, b"\x01\x02\x00\x00"])))  # malformed
        else:
            out.append((t, mk.encode(mk.Renew(ranges=(open_[-1],), lease_ms=5))))
    return out


def _per_record(st: PartitionLagState, recs, start_offset: int):
    out = []
    for i, (ts, v) in enumerate(recs):
        try:
            m = mk.decode(v)
        except mk.MarkerDecodeError:
            out += st.apply(start_offset + i, ts, "BAD")
            continue
        outcome = int(m.outcome) if isinstance(m, mk.Closed) else None
        out += st.apply(start_offset + i, ts, m.TYPE.name, [(r.first, r.count) for r in m.ranges], outcome)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_batch_apply_equals_per_record_apply(seed):
    rng = random.Random(seed)
    recs = _workload(rng, 1500)
    a, b = PartitionLagState(2, W), PartitionLagState(2, W)
    got_a, got_b = [], []
    pos = 0
    while pos < len(recs):  # batches of varying size, with a state round trip between them as Spark does
        n = rng.randint(1, 300)
        chunk = recs[pos : pos + n]
        got_a += _per_record(a, chunk, pos)
        d = decode_records([v for _, v in chunk], [mk.encode_key(2)] * len(chunk), [2] * len(chunk))
        got_b += b.apply_decoded(list(range(pos, pos + len(chunk))), [t for t, _ in chunk], d)
        b = PartitionLagState.from_json(b.to_json())
        pos += n
    got_a += a.expire(2**62, 0)
    got_b += b.expire(2**62, 0)
    assert [w.as_row() for w in got_b] == [w.as_row() for w in got_a]
    assert len(got_a) > 5 and sum(w.acked for w in got_a) > 0 and sum(w.late_acks for w in got_a) > 0


def test_replayed_offsets_are_skipped():
    st = PartitionLagState(0, W)
    vals = [mk.encode(mk.Start(ranges=((0, 5),), lease_ms=1)), mk.encode(mk.End(ranges=((0, 5),)))]
    d = decode_records(vals)
    st.apply_decoded([0, 1], [100, 110], d)
    st.apply_decoded([0, 1], [100, 110], d)  # the same offsets again: no effect
    (w,) = st.expire(2**62, 0)
    assert (w.markers["START"], w.markers["END"], w.acked, w.late_acks) == (1, 1, 5, 0)
    assert w.markers_high_water == 2
