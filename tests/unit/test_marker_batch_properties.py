"""kmq.core.marker_batch over random batches of markers records, with records that are no marker
and markers of a newer wire version mixed in, without I/O:

* a batch applies to the state exactly what its readable markers apply one by one, in order, and
  nothing after a marker of a newer version it cannot read (the partition is held there: the
  position stays at that marker, so the commit never passes it);
* a record that is no marker is skipped (the position moves past it) and named, never applied;
* a marker of a newer version that keeps the version-1 layout is applied by those fields;
* the counts by type and the STARTs for the skew gauge are those of the markers applied.
"""

from __future__ import annotations

from collections import Counter, namedtuple

from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.config import BackoffConfig
from kmq.core.lease_state import PartitionState
from kmq.core.marker_batch import apply_batch
from kmq.core.markers import End, Nack, Renew, Start, decode_record, encode, encode_key

Rec = namedtuple("Rec", "offset key value timestamp")
BACKOFF = BackoffConfig(initial=1.0, max=8.0, multiplier=2.0)
P = 0


def state() -> PartitionState:
    return PartitionState(BACKOFF.delay, 5, position=0)


ranges = st.tuples(st.integers(0, 30), st.integers(1, 4)).map(lambda r: [r])
markers = st.one_of(
    st.builds(lambda r, lease: Start(r, lease_ms=lease, owner="w"), ranges, st.integers(100, 5_000)),
    st.builds(End, ranges),
    st.builds(lambda r, lease: Renew(r, lease_ms=lease), ranges, st.integers(100, 5_000)),
    st.builds(lambda r, d: Nack(r, d), ranges, st.integers(0, 2_000)),
)
# (kind, marker): "ok" a marker, "newer" one of wire version 3 in the version-1 layout, "bad" no
# marker at all, "held" a newer marker this tracker cannot read.
records = st.lists(st.tuples(st.sampled_from(["ok", "ok", "ok", "newer", "bad", "held"]), markers), max_size=15)


def value(kind: str, marker) -> bytes:
    raw = encode(marker)
    if kind == "newer":
        return bytes([3]) + raw[1:] + b"\x00\x07later fields"
    if kind == "held":
        return b"\x03\x09" + raw[2:] + b"body of a later type"
    if kind == "bad":
        return b"\x01"  # a version byte and nothing else
    return raw


@settings(max_examples=300, deadline=None)
@given(batch=records, floor=st.one_of(st.none(), st.integers(0, 10_000)), read_ms=st.integers(10_000, 20_000))
def test_a_batch_applies_what_its_markers_apply_one_by_one_and_nothing_past_a_held_one(batch, floor, read_ms):
    recs = [Rec(i, encode_key(P), value(kind, m), 1_000 + i) for i, (kind, m) in enumerate(batch)]
    got, want = state(), state()
    out = apply_batch(got, recs, P, read_ms, floor)
    held_at = next((i for i, (kind, _) in enumerate(batch) if kind == "held"), None)
    applied = batch if held_at is None else batch[:held_at]
    types: Counter = Counter()
    starts = []
    for i, (kind, m) in enumerate(applied):
        if kind == "bad":
            want.skip(i)
            continue
        want.apply(decode_record(recs[i].key, recs[i].value, P), i, recs[i].timestamp, read_ms, floor)
        types[m.TYPE.name.lower()] += 1
        if floor is not None and isinstance(m, Start):
            starts.append((m.owner, recs[i].timestamp))
    assert got.position == want.position == (held_at if held_at is not None else len(batch)) or not batch
    assert got.open_ranges() == want.open_ranges() and got.in_flight == want.in_flight
    assert got.next_due_ms() == want.next_due_ms()
    assert (out.held[0] if out.held else None) == held_at
    assert [off for off, _ in out.bad] == [i for i, (kind, _) in enumerate(applied) if kind == "bad"]
    assert out.newer == [3 for kind, _ in applied if kind == "newer"]
    assert out.types == types and out.starts == starts
