"""How the tracker copies records kafka-python cannot produce as they are (pure)."""

from __future__ import annotations

import pytest

from kmq.core.copies import (
    COPY_HEADROOM,
    Fallback,
    Step,
    copy_headers,
    copy_headers_for,
    copy_problem,
    copy_request_size,
    dead_letter_headers,
    fallback,
    producible_headers,
    record_size,
    reference_headers,
    reference_of,
    restore_null_headers,
)
from kmq.core.message import origin_of


def test_null_header_values_become_empty_bytes_named_by_a_header_and_come_back():
    original = [("trace", None), ("app", b"1"), ("empty", b""), ("trace2", None)]
    sent = producible_headers(original)
    assert all(isinstance(v, bytes) for _, v in sent)
    assert sent == [("trace", b""), ("app", b"1"), ("empty", b""), ("trace2", b""),
                    ("kmq-null-header", b"trace"), ("kmq-null-header", b"trace2")]
    assert restore_null_headers(sent) == original


def test_only_a_tombstone_cannot_be_copied_as_it_is():
    assert copy_problem(None, None) and "tombstone" in copy_problem(None, None)
    assert copy_problem(b"k", None) is None and copy_problem(None, b"") is None


@pytest.mark.parametrize("step, permanent, move", [
    (Step.COPY, False, Fallback.RETRY),
    (Step.DEAD_LETTER, False, Fallback.RETRY),
    (Step.COPY, True, Fallback.DEAD_LETTER),
    (Step.REFERENCE, False, Fallback.RETRY),
    (Step.DEAD_LETTER, True, Fallback.REFERENCE),
    (Step.REFERENCE, True, Fallback.UNDELIVERABLE),
])
def test_a_failed_send_is_retried_only_when_it_can_succeed_later(step, permanent, move):
    assert fallback(step, permanent) is move


def test_a_copy_keeps_the_application_headers_and_replaces_kmq_ones():
    original = [("app", b"1"), ("kmq-delivery-count", b"2"), ("kmq-origin", b"q/0/3"), ("trace", None),
                ("kmq-dlq-reason", b"timeout")]
    assert copy_headers(original, "q/0/3", 2) == [
        ("app", b"1"), ("trace", b""), ("kmq-null-header", b"trace"),
        ("kmq-delivery-count", b"3"), ("kmq-origin", b"q/0/3")]


@pytest.mark.parametrize("original", [None, [], [("app", b"1")], [("kmq-origin", b"q/2/9"), ("kmq-delivery-count", b"4")],
                                      [("kmq-origin", b"other/0/1")]])
def test_the_copy_headers_of_a_record_agree_with_its_origin_whether_it_has_headers_or_not(original):
    # Records without headers take a shorter path: it must give what the general one gives.
    assert copy_headers_for(original, "q", 0, 7, 3) == copy_headers(original, origin_of(original, "q", 0, 7), 3)
    assert copy_headers_for(None, "q", 0, 7, 3) == [("kmq-delivery-count", b"4"), ("kmq-origin", b"q/0/7")]


def test_a_dead_letter_carries_reason_error_and_time_and_cuts_a_long_error():
    h = dict(dead_letter_headers([("app", b"1")], "q/1/7", 3, "rejected", "x" * 5000, 42))
    assert h["app"] == b"1" and h["kmq-delivery-count"] == b"3" and h["kmq-origin"] == b"q/1/7"
    assert h["kmq-dlq-reason"] == b"rejected" and h["kmq-dlq-ts"] == b"42" and len(h["kmq-dlq-error"]) == 2000
    assert "kmq-dlq-error" not in dict(dead_letter_headers([], "q/1/7", 3, "timeout", "", 42))


def test_a_reference_dead_letter_names_where_the_record_is_and_its_size_without_its_headers():
    headers = reference_headers("q/0/1", "q/0/9", 1_500_123, 2, "undeliverable", "too large", 42)
    h = dict(headers)
    assert h == {"kmq-delivery-count": b"2", "kmq-origin": b"q/0/1", "kmq-dlq-reference": b"q/0/9",
                 "kmq-dlq-size": b"1500123", "kmq-dlq-reason": b"undeliverable", "kmq-dlq-error": b"too large",
                 "kmq-dlq-ts": b"42"}
    assert reference_of(headers) == "q/0/9" and reference_of([("kmq-origin", b"q/0/1")]) is None


def test_record_size_counts_key_value_and_headers():
    assert record_size(None, None, None) == 0
    assert record_size(b"kk", b"vvv", [("ab", b"c"), ("n", None)]) == 2 + 3 + 3 + 1


def test_the_producer_is_sized_for_the_largest_topic_limit_and_names_the_unknown_ones():
    assert copy_request_size(1_048_576, {"q": 2_000_000, "q__dlq": None}) == (2_000_000 + COPY_HEADROOM, ["q__dlq"])
    assert copy_request_size(5_000_000, {"q": 2_000_000}) == (5_000_000, [])  # configured is the floor
    assert copy_request_size(1_048_576, {"q": None, "q__dlq": 0}) == (1_048_576, ["q", "q__dlq"])


def test_a_record_under_every_topics_limit_refused_as_too_large_was_refused_with_its_batch():
    from kmq.core.copies import COPY_HEADROOM, refused_with_its_batch, smallest_record_limit

    limit = smallest_record_limit(1_048_576, {"q": None, "q__dlq": 16_384})
    assert limit == 16_384
    assert refused_with_its_batch(103, limit)
    assert refused_with_its_batch(limit - COPY_HEADROOM, limit)
    assert not refused_with_its_batch(limit - COPY_HEADROOM + 1, limit)
    assert not refused_with_its_batch(32_780, limit)
    assert smallest_record_limit(16_384, {"q": 1_048_588}) == 16_384  # the configured size caps it


def test_a_copy_of_a_record_given_back_without_a_delivery_keeps_its_delivery_count():
    from kmq.core.copies import copy_count
    from kmq.core.message import delivery_count_of

    assert (copy_count(2, "release"), copy_count(2, "nack"), copy_count(2, "timeout")) == (2, 3, 3)
    kept = copy_headers_for([("kmq-delivery-count", b"2")], "q", 0, 7, 2, counted=False)
    assert delivery_count_of(kept) == 2
    assert delivery_count_of(copy_headers_for(None, "q", 0, 7, 1, counted=False)) == 1
    assert delivery_count_of(copy_headers_for(None, "q", 0, 7, 1)) == 2
