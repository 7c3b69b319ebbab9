"""LeaseSchedule (consumer auto-renew): renew before the lease ends, never past max_lease."""

from __future__ import annotations

import pytest

from kmq.core.lease import LeaseSchedule, default_margin


def run(schedule, until, step=0.05):
    """Advance a fake clock; return [(time, lease)] renewals and exhaustion time per key."""
    renewals, exhausted = [], {}
    for i in range(int(round(until / step)) + 1):
        t = round(i * step, 6)
        due = schedule.due(t)
        for lease, keys in due.renew.items():
            renewals.extend((round(t, 3), lease, k) for k in keys)
        for k in due.exhausted:
            exhausted[k] = round(t, 3)
    return renewals, exhausted


def test_renews_before_deadline_and_stops_at_max_lease():
    s = LeaseSchedule(lease=1.0, max_lease=2.5, margin=0.25)
    s.track("m", 0.0)
    renewals, exhausted = run(s, 5.0)
    assert [(t, lease) for t, lease, _ in renewals] == [(0.75, 1.0), (1.5, 1.0)]
    # last deadline 2.5 = START + max_lease; never beyond
    assert exhausted == {"m": 2.25}
    assert len(s) == 0


def test_lease_is_shortened_to_fit_the_budget():
    s = LeaseSchedule(lease=1.0, max_lease=1.5, margin=0.25)
    s.track("m", 0.0)
    renewals, exhausted = run(s, 3.0)
    assert [(t, lease) for t, lease, _ in renewals] == [(0.75, 0.75)]
    assert exhausted == {"m": 1.25}


def test_settled_message_is_not_renewed_and_explicit_renew_moves_the_deadline():
    s = LeaseSchedule(lease=1.0, max_lease=100.0, margin=0.25)
    s.track("a", 0.0)
    s.track("b", 0.0)
    s.forget("a")
    s.renewed("b", 0.5, 2.0)  # deadline 2.5 -> renew at 2.25
    assert s.due(0.8).renew == {}
    due = s.due(2.25)
    assert due.renew == {1.0: ["b"]}
    assert due.next_in == pytest.approx(0.75)


def test_next_in_is_none_when_nothing_is_tracked():
    s = LeaseSchedule(lease=1.0, max_lease=10.0, margin=0.1)
    assert s.due(0.0).next_in is None
    s.track("x", 0.0)
    assert s.due(0.0).next_in == pytest.approx(0.9)


def test_many_messages_with_one_start_renew_together():
    s = LeaseSchedule(lease=2.0, max_lease=60.0, margin=0.5)
    for i in range(1000):
        s.track(("p0", i), 10.0)
    due = s.due(11.5)
    assert list(due.renew) == [2.0] and len(due.renew[2.0]) == 1000


@pytest.mark.parametrize("lease, interval, expected", [(30.0, 0.1, 7.5), (1.0, 0.1, 0.4), (0.4, 0.1, 0.2)])
def test_default_margin(lease, interval, expected):
    assert default_margin(lease, interval) == pytest.approx(expected)


@pytest.mark.parametrize("lease, max_lease, margin", [(1.0, 2.5, 0.3), (1.0, 2.45, 0.3), (0.3, 1.0, 0.25), (1.0, 1.0001, 0.5)])
def test_always_terminates_and_never_passes_the_budget(lease, max_lease, margin):
    s = LeaseSchedule(lease=lease, max_lease=max_lease, margin=margin)
    s.track("m", 0.0)
    renewals, exhausted = run(s, max_lease + 2 * lease, step=0.01)
    assert "m" in exhausted
    for t, new_lease, _ in renewals:
        assert t + new_lease <= max_lease + 1e-3
    assert exhausted["m"] >= renewals[-1][0] if renewals else True


def test_a_batch_is_one_heap_entry_and_its_settled_keys_are_skipped():
    s = LeaseSchedule(lease=1.0, max_lease=2.5, margin=0.25)
    s.track_many(["a", "b", "c"], 0.0)
    s.renewed("c", 0.5, 1.0)  # an explicit renew moves c out of the batch's deadline
    assert len(s._heap) == 2  # the batch, and c's own entry
    s.forget("a")
    renewals, exhausted = run(s, 5.0)
    assert [(t, k) for t, _, k in renewals] == [(0.75, "b"), (1.25, "c"), (1.5, "b"), (2.0, "c")]
    assert exhausted == {"b": 2.25, "c": 2.25} and len(s) == 0
    assert s.due(10.0).next_in is None and not s._heap  # every group of settled keys dropped


def test_a_group_whose_keys_were_all_settled_is_dropped_without_a_wake_up():
    s = LeaseSchedule(lease=10.0, max_lease=60.0, margin=1.0)
    s.track_many(list(range(1000)), 0.0)
    s.track_many([1000], 5.0)
    for k in range(1000):
        s.forget(k)
    assert s.due(0.0).next_in == pytest.approx(14.0)  # the live key's renewal, not the settled batch's


class _Key:
    """A hashable key a weak reference can watch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        return self.n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.n == self.n


def _settle_all(s: LeaseSchedule, keys: list) -> list:
    """Forget every key of ``keys`` (settled); weak references to watch them go by."""
    import weakref

    refs = [weakref.ref(k) for k in keys]
    for k in keys:
        s.forget(k)
    return refs


def test_settled_keys_are_not_kept_alive_until_their_renewal_time():
    """A busy consumer settles each batch long before its renewal is due: the schedule must let go
    of those keys (the consumer's messages) at its next look, not hold a lease's worth of them."""
    import gc

    s = LeaseSchedule(lease=30.0, max_lease=600.0, margin=5.0)
    batch = [_Key(i) for i in range(100)]
    s.track_many(batch, 0.0)
    other = [_Key(1000 + i) for i in range(3)]
    s.track_many(other, 0.1)
    refs = _settle_all(s, batch)
    del batch
    assert s.due(0.5).renew == {}  # the keeper's next look, long before the renewal time
    gc.collect()
    assert all(r() is None for r in refs)
    s.renewed(other[0], 1.0)  # moved to a group of its own; the rest stay in theirs
    s.forget(other[1])
    due = s.due(25.1)  # the group's renewal time: only the one still tracked in it
    assert due.renew == {30.0: [other[2]]}
    assert s.due(26.0).renew == {30.0: [other[0]]}


def test_a_group_lets_go_of_its_keys_when_its_last_key_is_settled_without_a_look():
    """Keys are released the moment the last of their group is settled, wherever the group sits in
    the heap: holding settled messages until the keeper's next look kept half a second of a busy
    consumer's messages alive (and the cyclic collector visiting them)."""
    s = LeaseSchedule(lease=30.0, max_lease=600.0, margin=5.0)
    head = [_Key(i) for i in range(3)]
    s.track_many(head, 0.0)
    behind = [_Key(100 + i) for i in range(50)]
    s.track_many(behind, 0.1)
    refs = _settle_all(s, behind)
    del behind
    assert all(r() is None for r in refs)  # no due(), no gc.collect(): nothing refers to them any more
    assert s.due(25.0).renew == {30.0: head}


def test_a_key_tracked_again_leaves_its_old_group():
    s = LeaseSchedule(lease=10.0, max_lease=60.0, margin=1.0)
    a, b = _Key(1), _Key(2)
    s.track_many([a, b, b], 0.0)  # a key twice in one batch counts once
    s.track_many([b], 2.0)
    s.forget(a)
    assert s._heap[0][2].keys == []  # the first group has no key left in it
    assert s.due(9.0).renew == {}
    assert s.due(11.0).renew == {10.0: [b]}
    assert len(s) == 1


def _soon_schedule(settled: set, **kw) -> LeaseSchedule:
    return LeaseSchedule(lease=10.0, max_lease=60.0, margin=1.0,
                         unsettled=lambda keys: [k for k in keys if k not in settled], **kw)


def test_a_batch_tracked_soon_costs_nothing_for_the_keys_settled_before_its_look():
    settled: set = set()
    s = _soon_schedule(settled)
    batch = ["a", "b", "c", "d"]
    s.track_soon(batch, started=0.0, now=0.5)  # handed over half a second after its START
    settled.update({"a", "c"})  # settled by user code within the grace: no forget() needed
    s.look(0.505)
    assert s._entries == {}  # not looked at before its grace is over
    s.look(0.51)
    assert set(s._entries) == {"b", "d"}
    assert s.due(8.9).renew == {}
    assert s.due(9.0).renew == {10.0: ["b", "d"]}  # the START's deadline, not the hand-over's


def test_due_looks_at_every_batch_tracked_soon_even_within_its_grace():
    settled: set = set()
    s = _soon_schedule(settled, grace=5.0)
    s.track_soon(["a", "b"], started=0.0, now=0.0)
    settled.add("a")
    assert s.due(4.0).next_in == pytest.approx(5.0)  # b's renewal at 9.0: the keeper knows of it
    assert s.due(9.0).renew == {10.0: ["b"]}


def test_untrack_and_renewed_of_a_key_tracked_soon_take_effect_before_its_look():
    settled: set = set()
    s = _soon_schedule(settled)
    s.track_soon(["a", "b", "c"], started=0.0, now=0.0)
    s.untrack("a")  # its lease ended unsettled: never renewed again
    s.renewed("b", 0.001, 10.0)  # an explicit renew: b's own deadline
    assert s.due(9.0).renew == {10.0: ["c"]}
    assert s.due(9.001).renew == {10.0: ["b"]}
    assert "a" not in s and len(s) == 2


def test_without_a_settled_check_track_soon_tracks_at_once():
    s = LeaseSchedule(lease=10.0, max_lease=60.0, margin=1.0)
    s.track_soon(["a"], started=0.0, now=0.0)
    assert s._entries.keys() == {"a"}


def test_tracked_is_a_live_view_a_settler_may_skip_forget_on_while_it_is_empty():
    settled: set = set()
    s = _soon_schedule(settled)
    view = s.tracked
    s.track_soon(["a", "b"], started=0.0, now=0.0)
    settled.add("a")  # settled before the look: nothing tracked yet, no forget() call needed
    assert not view
    s.look(0.1)
    assert set(view) == {"b"}  # the same object, not a copy taken at construction
    s.forget("b")
    assert not view and s.due(9.0).renew == {}


def test_a_batch_tracked_soon_until_taken_has_its_grace_from_the_take():
    settled: set = set()
    s = _soon_schedule(settled)
    batch = ["a", "b", "c", "d"]
    s.track_soon(batch, started=0.0, now=0.5, until_taken=True)
    s.look(2.0)  # waiting to be taken for 1.5 s: no look yet (user code settled nothing meanwhile)
    assert s._entries == {}
    s.taken([["x"], batch], now=2.0)  # a list it does not know is passed over
    settled.update({"a", "b", "c"})  # user code settles within the grace
    s.look(2.005)
    assert s._entries == {}
    s.look(2.01)
    assert set(s._entries) == {"d"}
    assert s.due(9.0).renew == {10.0: ["d"]}  # the START's deadline, not the take's


def test_due_tracks_a_batch_waiting_to_be_taken_so_its_renewal_is_not_missed():
    settled: set = set()
    s = _soon_schedule(settled)
    s.track_soon(["a", "b"], started=0.0, now=0.0, until_taken=True)
    assert s.due(1.0).next_in == pytest.approx(8.0)  # the keeper knows of a and b's renewal at 9.0
    assert s.due(9.0).renew == {10.0: ["a", "b"]}
    s.taken([["a", "b"]], now=9.5)  # taken late: nothing left to look at
    assert not s._soon
