"""AckBuffer: settlements coalesced into one marker per partition per type."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq.consumer.ack_buffer import AckBuffer
from kmq.core.markers import End, Nack, Reject, Renew, decode, encode
from kmq.core.ranges import OffsetRange


def test_out_of_order_acks_coalesce_into_one_end_per_partition():
    buf = AckBuffer()
    offsets = list(range(100, 600))
    random.Random(1).shuffle(offsets)
    for off in offsets:
        buf.ack(0, off)
    buf.ack(1, 7)
    buf.ack(1, 9)
    out = buf.drain()
    assert out.markers == [(0, End((OffsetRange(100, 500),))), (1, End((OffsetRange(7, 1), OffsetRange(9, 1))))]
    assert out.counts == {"acked": 502}
    assert len(buf) == 0 and not buf.drain()


def test_types_and_parameters_get_their_own_markers():
    buf = AckBuffer()
    buf.ack(0, 1)
    buf.nack(0, 2, 0)
    buf.nack(0, 3, 0)
    buf.nack(0, 4, 5000)
    buf.reject(0, 5, "bad payload")
    buf.reject(0, 6, "bad payload")
    buf.renew(0, 7, 30000)
    buf.renew(0, 8, 30000)
    out = buf.drain()
    assert out.markers == [
        (0, Renew((OffsetRange(7, 2),), 30000)),
        (0, End((OffsetRange(1, 1),))),
        (0, Nack((OffsetRange(2, 2),), 0)),
        (0, Nack((OffsetRange(4, 1),), 5000)),
        (0, Reject((OffsetRange(5, 2),), "bad payload")),
    ]
    assert out.counts == {"acked": 1, "nacked": 3, "rejected": 2, "renewed": 2}
    for _, marker in out.markers:  # every marker is valid wire format
        assert decode(encode(marker)) == marker


def test_renew_of_a_message_settled_in_the_same_flush_is_dropped():
    buf = AckBuffer()
    buf.renew_many(0, [1, 2, 3], 1000)
    buf.ack(0, 2)
    buf.nack(0, 3)
    out = buf.drain()
    renews = [m for _, m in out.markers if isinstance(m, Renew)]
    assert renews == [Renew((OffsetRange(1, 1),), 1000)]
    assert isinstance(out.markers[0][1], Renew)  # renews go first, settlements after


def test_drop_partition_forgets_only_that_partition():
    buf = AckBuffer()
    buf.ack(0, 1)
    buf.nack(1, 2)
    buf.reject(1, 3, "x")
    buf.renew(1, 4, 10)
    assert buf.drop_partition(1) == 3
    assert len(buf) == 1
    assert buf.drain().markers == [(0, End((OffsetRange(1, 1),)))]


def test_more_ranges_than_a_marker_holds_are_split():
    buf = AckBuffer(max_ranges=3)
    for off in range(0, 20, 2):  # 10 gaps -> 10 ranges
        buf.ack(0, off)
    out = buf.drain()
    assert [len(m.ranges) for _, m in out.markers] == [3, 3, 3, 1]


@given(st.dictionaries(st.integers(0, 3), st.sets(st.integers(0, 10_000), min_size=1, max_size=200), max_size=4))
def test_drained_end_ranges_cover_exactly_the_acked_offsets(acks):
    buf = AckBuffer()
    for p, offs in acks.items():
        for off in offs:
            buf.ack(p, off)
    out = buf.drain()
    got: dict[int, set[int]] = {}
    for p, m in out.markers:
        assert isinstance(m, End)
        for r in m.ranges:
            got.setdefault(p, set()).update(r.offsets())
    assert got == acks
    # one record per partition (all fit in one marker)
    assert sorted(p for p, _ in out.markers) == sorted(acks)


def test_negative_offsets_are_refused_by_the_marker():
    buf = AckBuffer()
    buf.ack(0, -1)
    with pytest.raises(ValueError):
        buf.drain()


def test_a_released_nack_is_a_nack_not_a_delivery_of_its_own():
    from kmq.core.message import NACK
    from kmq.core.settlement import Released

    b = AckBuffer()
    b.settle(0, 5, NACK, Released(0.0))
    b.settle(0, 6, NACK, 0.0)
    b.settle(0, 7, NACK, Released(0.0))
    markers = sorted(b.drain().markers, key=lambda pm: pm[1].counted)
    assert markers == [(0, Nack([(5, 1), (7, 1)], 0, counted=False)), (0, Nack([(6, 1)], 0))]
    assert decode(encode(markers[0][1])) == markers[0][1]
