"""kmq.core.marker_batch.to_apply: which fetched markers a tracker step applies, over random fetches.

Only a partition owned and positioned before the fetch gets its records (one positioned in this
step was fetched from its old position; one not positioned is read again from its commit), all of
them, in fetch order, once; the fetch's floor only where the partition was at its log end.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.core.marker_batch import to_apply


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    timestamp: int = 0


@dataclass(eq=False)
class Owned:
    positioned: bool
    at_end: bool


TPS = [("a__markers", 0), ("a__markers", 1), ("b__markers", 0)]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), floor=st.none() | st.integers(0, 10**6))
def test_only_partitions_positioned_before_the_fetch_get_their_records_with_the_floor_at_their_end(data, floor):
    owned = {tp: Owned(data.draw(st.booleans(), label="positioned"), data.draw(st.booleans(), label="at end"))
             for tp in data.draw(st.sets(st.sampled_from(TPS)), label="owned")}
    just = data.draw(st.sets(st.sampled_from(TPS)), label="just positioned")
    fetched = data.draw(st.lists(st.sampled_from(TPS)), label="records' partitions")
    records = [Rec(t, p, i) for i, (t, p) in enumerate(fetched)]
    got = to_apply(records, owned, just, floor)
    applied = {id(o): (batch, f) for o, batch, f in got}
    assert len(applied) == len(got), "a partition's records in two batches"
    for tp in TPS:
        o = owned.get(tp)
        mine = [r for r in records if (r.topic, r.partition) == tp]
        if o is not None and o.positioned and tp not in just and mine:
            assert applied[id(o)] == (mine, floor if o.at_end else None)
        else:
            assert o is None or id(o) not in applied


def test_nothing_fetched_before_the_view_was_dropped_is_applied():
    owned = {tp: Owned(positioned=True, at_end=True) for tp in TPS}
    records = [Rec(t, p, i) for i, (t, p) in enumerate(TPS)]
    assert len(to_apply(records, owned, set(), 5)) == len(TPS)
    assert to_apply(records, owned, set(), 5, stale=True) == []  # the membership in doubt, the clock jumped
