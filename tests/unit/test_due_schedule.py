"""The tracker's wake-up schedule: which partitions are due now and when the next one is."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.core.due_schedule import DueSchedule


def test_pop_due_returns_the_keys_due_at_or_before_now_earliest_first_and_removes_them():
    s: DueSchedule[str] = DueSchedule()
    s.set("c", 30)
    s.set("a", 10)
    s.set("b", 20)
    assert s.next_ms() == 10
    assert s.pop_due(20) == ["a", "b"]
    assert s.pop_due(20) == [] and "a" not in s and len(s) == 1
    assert s.next_ms() == 30


def test_setting_a_key_again_replaces_its_time_earlier_or_later():
    s: DueSchedule[str] = DueSchedule()
    s.set("a", 10)
    s.set("a", 50)
    assert s.pop_due(40) == [] and s.next_ms() == 50
    s.set("a", 5)
    assert s.next_ms() == 5 and s.pop_due(5) == ["a"]
    assert s.pop_due(100) == []  # the stale entries at 10 and 50 are gone with it


def test_none_and_discard_unschedule_a_key():
    s: DueSchedule[str] = DueSchedule()
    s.set("a", 10)
    s.set("b", 20)
    s.set("a", None)
    s.discard("b")
    s.discard("never")
    assert s.next_ms() is None and s.pop_due(100) == [] and len(s) == 0


def test_a_popped_key_set_again_at_the_same_time_is_due_again():
    s: DueSchedule[str] = DueSchedule()
    s.set("a", 10)
    assert s.pop_due(10) == ["a"]
    s.set("a", 10)  # served, still due (e.g. more than one step's limit was due)
    assert s.pop_due(10) == ["a"]


def test_rescheduling_one_key_many_times_keeps_the_heap_bounded():
    s: DueSchedule[int] = DueSchedule()
    for t in range(10_000):
        s.set(1, t)
    assert len(s._heap) <= 2 * len(s) + 64
    assert s.pop_due(10_000) == [1]


ops = st.lists(st.tuples(st.sampled_from(["set", "none", "pop"]), st.integers(0, 7), st.integers(0, 50)),
               max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_it_answers_like_a_plain_dict_of_times(steps):
    s: DueSchedule[int] = DueSchedule()
    model: dict[int, int] = {}
    for op, key, t in steps:
        if op == "set":
            s.set(key, t)
            model[key] = t
        elif op == "none":
            s.set(key, None)
            model.pop(key, None)
        else:
            due = sorted((at, k) for k, at in model.items() if at <= t)
            assert s.pop_due(t) == [k for _, k in due]
            for _, k in due:
                del model[k]
        assert s.next_ms() == min(model.values(), default=None)
        assert len(s) == len(model) and all(s.get(k) == at for k, at in model.items())
