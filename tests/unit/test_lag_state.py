"""Pure per-partition lag state of the Spark job (kmq/core/lag_state.py)."""

from __future__ import annotations

import random

import pytest

from kmq.core import markers as mk
from kmq.spark.decode import decode_batch
from kmq.core.lag_state import (
    LATENCY_BUCKETS_MS,
    OpenSegments,
    PartitionLagState,
    percentile_from_buckets,
)

W = 1000


def test_open_segments_keep_first_start_time_and_merge():
    s = OpenSegments()
    s.add(0, 10, 100)
    s.add(5, 10, 200)  # 5..9 already open at 100; 10..14 open at 200
    assert list(s.segments()) == [(0, 10, 100), (10, 15, 200)]
    assert s.size == 15
    s.add(15, 5, 200)
    assert list(s.segments()) == [(0, 10, 100), (10, 20, 200)]
    assert s.remove(8, 4) == [(2, 100), (2, 200)]
    assert list(s.segments()) == [(0, 8, 100), (12, 20, 200)]
    assert s.size == 16
    assert s.oldest() == 100


def test_open_segments_match_a_per_offset_model():
    rng = random.Random(7)
    s = OpenSegments()
    model: dict[int, int] = {}
    for step in range(2000):
        first, count, ts = rng.randrange(200), rng.randrange(1, 20), step
        if rng.random() < 0.5:
            s.add(first, count, ts)
            for o in range(first, first + count):
                model.setdefault(o, ts)
        else:
            got = sorted(s.remove(first, count))
            want: dict[int, int] = {}
            for o in range(first, first + count):
                if o in model:
                    t = model.pop(o)
                    want[t] = want.get(t, 0) + 1
            agg: dict[int, int] = {}
            for n, t in got:
                agg[t] = agg.get(t, 0) + n
            assert agg == want
        flat = {o: t for a, b, t in s.segments() for o in range(a, b)}
        assert flat == model and s.size == len(model)
    # Memory is bounded by ranges: segments never touch with equal times.
    segs = list(s.segments())
    assert all(not (a[1] == b[0] and a[2] == b[2]) for a, b in zip(segs, segs[1:]))


def test_percentiles_use_bucket_upper_bounds():
    counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    counts[LATENCY_BUCKETS_MS.index(100)] = 90
    counts[LATENCY_BUCKETS_MS.index(1000)] = 10
    assert percentile_from_buckets(counts, 0.5) == 100
    assert percentile_from_buckets(counts, 0.9) == 100
    assert percentile_from_buckets(counts, 0.95) == 1000
    assert percentile_from_buckets([0] * len(counts), 0.5) is None


def test_window_output_counts_in_flight_latency_and_outcomes():
    st = PartitionLagState(3, W)
    out = []
    out += st.apply(0, 100, "START", [(0, 10)])
    out += st.apply(1, 150, "START", [(10, 5)])
    out += st.apply(2, 180, "END", [(0, 4)])  # latency 80 ms
    out += st.apply(3, 300, "NACK", [(4, 1)])
    out += st.apply(4, 400, "CLOSED", [(4, 1)], outcome=1)
    out += st.apply(5, 500, "REJECT", [(5, 1)])
    out += st.apply(6, 600, "CLOSED", [(5, 1)], outcome=2)
    out += st.apply(7, 700, "END", [(0, 2)])  # late ack x2
    out += st.apply(8, 800, "BAD")
    out += st.apply(9, 900, "RENEW", [(6, 4)])
    assert out == []
    out = st.apply(10, 2500, "END", [(6, 4)])  # window 2: latency 2400 ms
    assert len(out) == 1
    w = out[0]
    assert (w.window_start_ms, w.window_end_ms) == (0, 1000)
    assert w.markers == {"START": 2, "END": 2, "RENEW": 1, "NACK": 1, "REJECT": 1, "CLOSED": 2}
    assert w.bad_markers == 1
    assert w.acked == 4 and w.late_acks == 2
    assert w.redeliveries == 1 and w.dead_letters == 1
    assert w.in_flight == 15 - 4 - 1 - 1  # 6..14 open at the window end
    assert w.oldest_in_flight_ms == 1000 - 100
    assert w.percentile(0.5) == 100 and w.percentile(0.99) == 100
    assert w.markers_high_water == 10
    # Window 1 (1000..2000) had no markers: no row. A marker from the past joins the open window.
    st.apply(11, 1200, "START", [(100, 1)])
    (w2,) = st.expire(now_ms=3000, grace_ms=0)
    assert (w2.window_start_ms, w2.markers["START"], w2.markers["END"]) == (2000, 1, 1)
    assert w2.in_flight == 5 + 1  # 10..14 plus 100
    assert w2.oldest_in_flight_ms == 3000 - 150
    assert w2.percentile(0.5) == 5000  # 2400 ms falls in the (2000, 5000] bucket
    assert st.expire(now_ms=10_000, grace_ms=0) == []
    # After expiry a late marker goes to the next window, never to a closed one.
    st.apply(12, 2100, "END", [(100, 1)])
    assert st.current.window_start_ms == 3000


def test_state_round_trips_through_json():
    st = PartitionLagState(0, W)
    st.apply(0, 10, "START", [(0, 100)])
    st.apply(1, 20, "END", [(0, 50)])
    st.apply(2, 30, "START", [(200, 3)])
    back = PartitionLagState.from_json(st.to_json())
    assert back.to_json() == st.to_json()
    a = st.apply(3, 5000, "END", [(50, 10)])
    b = back.apply(3, 5000, "END", [(50, 10)])
    assert [x.as_row() for x in a] == [x.as_row() for x in b]


def test_decode_batch_marks_bad_records_and_keeps_good_ones():
    good = mk.encode(mk.Start(ranges=((5, 3),), lease_ms=1000, owner="w"))
    closed = mk.encode(mk.Closed(ranges=((1, 1), (9, 2)), outcome=mk.Outcome.DEAD_LETTERED))
    out = decode_batch(
        [0, 0, 0, 0, 1],
        [10, 11, 12, 13, 14],
        [1, 2, 3, 4, 5],
        [mk.encode_key(0), mk.encode_key(0), b"xx", mk.encode_key(0), mk.encode_key(0)],
        [good, closed, good, b"\x01\x09", good],
    )
    assert out["mtype"] == ["START", "CLOSED", "BAD", "BAD", "BAD"]
    assert out["firsts"][0] == [5] and out["counts"][0] == [3]
    assert out["firsts"][1] == [1, 9] and out["outcome"][1] == 2
    assert "4 bytes" in out["error"][2]
    assert "partition 0" in out["error"][4]


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        PartitionLagState(0, 0)


def test_closed_memory_is_bounded_and_huge_counts_are_ranges_not_offsets():
    from kmq.core.lag_state import PartitionLagState
    from kmq.core.ranges import CLOSED_MEMORY_RANGES  # the tracker's bound too (lease_state)

    st = PartitionLagState(0, 1000)
    st.apply(0, 10, "START", [(0, 0xFFFFFFFF)])
    assert st.open.size == 0xFFFFFFFF
    for i in range(CLOSED_MEMORY_RANGES + 100):
        st.apply(i + 1, 20, "END", [(2 * i, 1)])
    assert st.closed.range_count == CLOSED_MEMORY_RANGES
    assert st.open.size == 0xFFFFFFFF - CLOSED_MEMORY_RANGES - 100
