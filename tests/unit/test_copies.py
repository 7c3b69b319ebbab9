"""How the tracker copies records kafka-python cannot produce as they are (pure)."""

from __future__ import annotations

import pytest

from kmq.core.copies import Fallback, Step, copy_problem, fallback, producible_headers, restore_null_headers


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
    (Step.DEAD_LETTER, True, Fallback.UNDELIVERABLE),
])
def test_a_failed_send_is_retried_only_when_it_can_succeed_later(step, permanent, move):
    assert fallback(step, permanent) is move
