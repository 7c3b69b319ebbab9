"""Bulk marker decoding gives exactly the per-record decoder's answer, bad records included."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.core import markers as mk
from kmq.core.markers_bulk import BAD, decode_records


def _reference(key, partition, value):
    """What kmq.core.markers says about one record: (type, ranges, outcome) or (BAD, reason)."""
    m = mk.decode_record(key, value, partition)
    if isinstance(m, mk.BadMarker):
        return (BAD, m.reason)
    outcome = int(m.outcome) if isinstance(m, mk.Closed) else 0
    return (int(m.TYPE), [(r.first, r.count) for r in m.ranges], outcome)


def _bulk(keys, partitions, values):
    d = decode_records(values, keys, partitions)
    out = []
    for i in range(len(values)):
        if d.mtype[i] == BAD:
            out.append((BAD, d.errors[i]))
        else:
            out.append((int(d.mtype[i]), d.ranges(i), int(d.outcome[i])))
    return out


def _valid_markers(rng: random.Random, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        first = rng.choice([0, rng.randrange(1 << 40), mk.MAX_I64 - 5])
        count = 1 if first > mk.MAX_I64 - 10 else rng.choice([1, 10, 500, mk.MAX_U32])
        if first + count - 1 > mk.MAX_I64:
            count = 1
        ranges = ((first, count),) if rng.random() < 0.8 else ((first, 1), (first + 3, 2))
        if ranges[-1][0] + ranges[-1][1] - 1 > mk.MAX_I64:
            ranges = ((first, 1),)
        kind = rng.randrange(6)
        m = [
            lambda r: mk.Start(ranges=r, lease_ms=rng.randrange(1 << 32), owner=rng.choice(["", "w-1", "wörker"])),
            lambda r: mk.End(ranges=r),
            lambda r: mk.Renew(ranges=r, lease_ms=30_000),
            lambda r: mk.Nack(ranges=r, delay_ms=rng.randrange(1 << 32)),
            lambda r: mk.Reject(ranges=r, reason=rng.choice(["", "bad input", "ünicode"])),
            lambda r: mk.Closed(ranges=r, outcome=rng.choice(list(mk.Outcome))),
        ][kind](ranges)
        out.append(mk.encode(m))
    return out


def _mutate(rng: random.Random, v: bytes) -> bytes | None:
    """A hostile variant of a valid marker: truncated, extended, a flipped byte, or gone."""
    choice = rng.randrange(6)
    if choice == 0:
        return v[: rng.randrange(len(v))]
    if choice == 1:
        return v + bytes([rng.randrange(256)])
    if choice == 2:
        i = rng.randrange(len(v))
        return v[:i] + bytes([rng.randrange(256)]) + v[i + 1 :]
    if choice == 3:
        return None
    if choice == 4:
        return b"\x01" + bytes([rng.choice([0, 7, 255])]) + v[2:]  # unknown type
    return v[:2] + b"\x00\x00" + v[4:]  # zero ranges


def test_valid_records_decode_like_the_reference():
    rng = random.Random(1)
    values = _valid_markers(rng, 2000)
    parts = [rng.randrange(4) for _ in values]
    keys = [mk.encode_key(p) for p in parts]
    got = _bulk(keys, parts, values)
    assert got == [_reference(k, p, v) for k, p, v in zip(keys, parts, values)]
    assert all(g[0] != BAD for g in got)


@pytest.mark.parametrize("seed", range(5))
def test_malformed_records_in_a_batch_are_bad_with_the_reference_reason(seed):
    rng = random.Random(seed)
    values: list[bytes | None] = _valid_markers(rng, 600)
    for i in rng.sample(range(len(values)), 200):
        values[i] = _mutate(rng, values[i])  # type: ignore[arg-type]
    parts = [rng.randrange(3) for _ in values]
    keys: list[bytes | None] = [mk.encode_key(p) for p in parts]
    for i in rng.sample(range(len(values)), 20):  # wrong partition, short key, no key
        keys[i] = rng.choice([mk.encode_key(parts[i] + 1), b"\x00\x01", None, b"\xff\xff\xff\xfe"])
    got = _bulk(keys, parts, values)
    want = [_reference(k, p, v) for k, p, v in zip(keys, parts, values)]
    assert got == want
    assert sum(g[0] == BAD for g in got) >= 100  # the batch really held bad records


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=20))
def test_arbitrary_bytes_never_crash_and_match_the_reference(values):
    parts = [0] * len(values)
    keys = [mk.encode_key(0)] * len(values)
    assert _bulk(keys, parts, values) == [_reference(k, p, v) for k, p, v in zip(keys, parts, values)]


def test_values_that_are_not_bytes_are_bad_not_a_crash():
    good = mk.encode(mk.End(ranges=((3, 2),)))
    d = decode_records([good, "text", good], [mk.encode_key(0)] * 3, [0, 0, 0])
    assert d.mtype.tolist() == [int(mk.MarkerType.END), BAD, int(mk.MarkerType.END)]
    assert "bytes" in d.errors[1]
    assert d.ranges(2) == [(3, 2)]


def test_without_keys_only_values_are_checked_and_empty_batches_work():
    d = decode_records([mk.encode(mk.Closed(ranges=((1, 1), (9, 2)), outcome=mk.Outcome.DEAD_LETTERED))])
    assert d.mtype.tolist() == [int(mk.MarkerType.CLOSED)] and d.outcome.tolist() == [2]
    assert d.ranges(0) == [(1, 1), (9, 2)]
    assert len(decode_records([])) == 0
    with pytest.raises(ValueError):
        decode_records([b""], keys=[b""])
    assert d.range_start.dtype == np.int64
