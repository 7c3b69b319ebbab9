"""MarkerRetry: failed settlement markers kept, merged and resent within a budget (time passed in)."""

from __future__ import annotations

import pytest

from kmq.consumer.marker_retry import MarkerRetry, describe
from kmq.core.markers import End, Nack, Reject, Renew, Start


def offsets(pending, kind=End, partition=0):
    return sorted(o for p, m, _ in pending if isinstance(m, kind) and p == partition for r in m.ranges for o in r.offsets())


def test_failures_merge_into_ranges_and_come_back_once_per_interval():
    retry = MarkerRetry(budget=60, interval=1.0)
    for first in range(0, 1000, 10):  # 100 failed ENDs of 10 consecutive offsets each
        retry.add(0, End(((first, 10),)), since=100.0)
    retry.add(0, Nack(((2000, 1),), 500), since=100.5)
    retry.add(1, End(((7, 1),)), since=101.0)
    assert len(retry) == 1002 and retry.range_count == 3  # merged: bounded memory
    resend, given_up = retry.take(now=101.0)
    assert given_up == []
    assert [(p, m) for p, m, _ in resend] == [(0, End(((0, 1000),))), (0, Nack(((2000, 1),), 500)), (1, End(((7, 1),)))]
    assert [since for _, _, since in resend] == [100.0, 100.5, 101.0]  # first-failure times travel along
    assert not retry
    retry.add(0, End(((0, 1000),)), since=100.0)  # failed again
    assert retry.take(now=101.5) == ([], [])  # not before the interval: no busy loop
    assert offsets(retry.take(now=102.0)[0]) == list(range(1000))
    retry.add(0, End(((0, 1),)), since=100.0)
    assert retry.take(now=102.1, force=True)[0]  # flush/close do not wait for the interval


def test_markers_past_the_budget_are_given_up():
    retry = MarkerRetry(budget=60, interval=0)
    retry.add(0, End(((1, 2),)), since=0.0)
    retry.add(0, End(((10, 1),)), since=30.0)  # merged entry keeps the oldest first-failure time
    retry.add(0, Renew(((5, 1),), 30000), since=30.0)
    resend, given_up = retry.take(now=59.9)
    assert offsets(resend) == [1, 2, 10] and offsets(resend, Renew) == [5]
    for p, m, since in resend:
        retry.add(p, m, since)
    resend, given_up = retry.take(now=60.0)
    assert offsets(given_up) == [1, 2, 10] and offsets(resend, Renew) == [5]


def test_renews_come_before_ends_of_the_same_partition():
    retry = MarkerRetry(budget=60, interval=0)
    retry.add(0, Reject(((3, 1),), "bad"), since=1.0)
    retry.add(0, End(((1, 1),)), since=1.0)
    retry.add(0, Renew(((1, 1),), 1000), since=1.0)
    assert [type(m) for _, m, _ in retry.take(now=2.0)[0]] == [Renew, End, Reject]


def test_memory_bound_gives_up_the_oldest_first():
    retry = MarkerRetry(budget=60, interval=0, max_ranges=3)
    assert retry.add(0, End(((0, 1),)), since=1.0) == []
    retry.add(1, End(((0, 1),)), since=2.0)
    retry.add(2, End(((0, 1),)), since=3.0)
    given_up = retry.add(3, End(((0, 1),)), since=4.0)
    assert [(p, since) for p, _, since in given_up] == [(0, 1.0)]
    assert retry.range_count == 3 and retry.oldest() == 2.0


def test_more_ranges_than_one_marker_carries_are_split():
    retry = MarkerRetry(budget=60, interval=0, max_ranges=200_000)
    for i in range(70_000):
        retry.add(0, End(((2 * i, 1),)), since=1.0)  # every other offset: 70,000 ranges
    resend, _ = retry.take(now=1.0)
    assert [len(m.ranges) for _, m, _ in resend] == [0xFFFF, 70_000 - 0xFFFF]


def test_start_markers_are_not_retried_here():
    with pytest.raises(TypeError):
        MarkerRetry(budget=60).add(0, Start(((0, 1),), 1000, "me"), since=0.0)


def test_describe_names_type_count_and_offsets():
    text = describe([(0, End(((5, 12),)), 0.0), (2, Nack(((7, 1),), 0), 0.0)])
    assert text == "END 12 msgs [0] 5..16; NACK 1 msg [2] 7..7"


def test_a_nack_not_a_delivery_is_resent_as_one_and_kept_apart_from_counted_ones():
    retry = MarkerRetry(budget=60, interval=1.0)
    retry.add(0, Nack(((5, 1),), 0, counted=False), since=1.0)
    retry.add(0, Nack(((6, 1),), 0), since=1.0)
    resend, _ = retry.take(now=2.0)
    assert sorted(m.counted for _, m, _ in resend) == [False, True]
    assert {m.ranges[0].first: m.counted for _, m, _ in resend} == {5: False, 6: True}
