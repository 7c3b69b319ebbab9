"""Offset-range arithmetic against a plain set model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.core.ranges import OffsetRange, RangeOverlapError, RangeSet, coalesce, missing, normalize


def test_kip_example_merges_to_one_range():
    assert coalesce([45, 46, 47, 48, 49, 50]) == [OffsetRange(45, 6)]


@pytest.mark.parametrize(
    "offsets,expected",
    [([], []), ([3], [(3, 1)]), ([5, 3, 4, 9], [(3, 3), (9, 1)]), ([1, 1, 2], [(1, 2)]),
     # lists whose first, last and length look like one range but are not (the fast path must not take them)
     ([1, 1, 3], [(1, 1), (3, 1)]), ([1, 3, 2], [(1, 3)]), ([3, 2, 1], [(1, 3)]), ([2, 2, 2, 5], [(2, 1), (5, 1)])],
)
def test_coalesce(offsets, expected):
    assert coalesce(offsets) == [OffsetRange(*e) for e in expected]
    assert coalesce(iter(offsets)) == [OffsetRange(*e) for e in expected]


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=30))
def test_coalesce_matches_the_set_model(offsets):
    ranges = coalesce(offsets)
    assert [o for r in ranges for o in r.offsets()] == sorted(set(offsets))
    assert all(a.end < b.first for a, b in zip(ranges, ranges[1:]))  # merged: no two touch


def test_normalize_merges_adjacent_and_rejects_overlap():
    assert normalize([(5, 2), (1, 4)]) == (OffsetRange(1, 6),)
    with pytest.raises(RangeOverlapError):
        normalize([(1, 5), (5, 1)])
    with pytest.raises(ValueError):
        normalize([(1, 0)])


ops = st.lists(st.tuples(st.booleans(), st.integers(0, 200), st.integers(1, 30)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_rangeset_matches_a_set_model(operations):
    rs, model = RangeSet(), set()
    for is_add, first, count in operations:
        span = set(range(first, first + count))
        if is_add:
            assert rs.add(first, count) == len(span - model)
            model |= span
        else:
            removed = rs.remove(first, count)
            assert sum(r.count for r in removed) == len(span & model)
            model -= span
        assert len(rs) == len(model)
        assert [o for r in rs for o in r.offsets()] == sorted(model)
        # stored coalesced: no two ranges touch
        rl = rs.ranges()
        assert all(a.end < b.first for a, b in zip(rl, rl[1:]))
        assert rs.max_end() == (max(model) + 1 if model else 0)
    probe = set(range(0, 240))
    assert {o for o in probe if o in rs} == model & probe
    assert [o for r in rs.intersection(50, 100) for o in r.offsets()] == sorted(model & set(range(50, 150)))


def test_rangeset_memory_is_per_range_not_per_offset():
    rs = RangeSet()
    rs.add(0, 1_000_000)
    assert rs.range_count == 1 and len(rs) == 1_000_000
    rs.remove(500, 1)
    assert rs.range_count == 2 and len(rs) == 999_999 and rs.min() == 0


@pytest.mark.parametrize("adds", [
    [(0, 1), (2, 1), (4, 1), (6, 1)],  # rising: the O(1) append path
    [(6, 1), (4, 1), (2, 1), (0, 1)],  # falling: the general path
    [(0, 2), (2, 1), (10, 1), (4, 1), (8, 1)],
])
def test_add_bounded_forgets_the_lowest_ranges_beyond_the_bound(adds):
    rs, model = RangeSet(), RangeSet()
    for first, count in adds:
        rs.add_bounded(first, count, 2)
        model.add(first, count)
        while model.range_count > 2:  # the rule: the lowest ranges go first
            lowest = model.ranges()[0]
            model.remove(lowest.first, lowest.count)
        assert rs == model and len(rs) == len(model) and rs.range_count <= 2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 30)), max_size=8),
       st.lists(st.integers(0, 260), max_size=80))
def test_missing_is_wanted_minus_found(wanted, found):
    """What both log readers (kafka-python and confluent) report as not in the log."""
    model = {o for f, c in wanted for o in range(f, f + c)} - set(found)
    out = missing(wanted, found)
    assert [o for r in out for o in r.offsets()] == sorted(model)
    assert all(a.end < b.first for a, b in zip(out, out[1:]))  # coalesced


def test_missing_never_walks_a_huge_range():
    # A START marker may cover billions of offsets; the answer is two ranges, computed at once.
    assert missing([(0, 10**12)], [5, 6, 7]) == [OffsetRange(0, 5), OffsetRange(8, 10**12 - 8)]
