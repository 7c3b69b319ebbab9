"""kmq demo's account of its dead letters (pure: the fates of `kmq work` are a function of
origin and delivery count)."""

from __future__ import annotations

from kmq.dev.workload import fate
from kmq.dev.demo import DemoSettings, explain_dead_letters

S = DemoSettings()


def _origin_whose_last_delivery_is(kind: str) -> str:
    return next(o for o in (f"q/0/{i}" for i in range(100_000))
                if fate(o, S.max_deliveries, S.fail_rate, S.hang_rate, S.slow_rate) == kind)


def test_poison_rejections_are_not_counted_as_injected_or_unexplained():
    assert explain_dead_letters({"q/0/1": "rejected"}, set(), S) == (0, [])


def test_a_good_message_whose_last_delivery_was_made_to_fail_hang_or_run_slow_is_injected():
    dead = {_origin_whose_last_delivery_is("fail"): "nack-limit", _origin_whose_last_delivery_is("hang"): "timeout",
            _origin_whose_last_delivery_is("slow"): "timeout"}
    assert explain_dead_letters(dead, set(), S) == (3, [])


def test_a_timeout_of_a_delivery_that_was_not_slow_is_listed():
    ok = _origin_whose_last_delivery_is("ok")
    assert explain_dead_letters({ok: "timeout"}, set(), S) == (0, [f"{ok} (timeout)"])
    # ...unless another delivery of it was acked meanwhile (a slow one, or the guard's nack of a copy)
    assert explain_dead_letters({ok: "nack-limit"}, {ok}, S) == (1, [])


def test_an_unknown_reason_is_listed_even_for_a_failing_message():
    fail = _origin_whose_last_delivery_is("fail")
    assert explain_dead_letters({fail: "undeliverable"}, set(), S) == (0, [f"{fail} (undeliverable)"])
