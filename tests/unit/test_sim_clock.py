"""The simulation's virtual clock: events in time order, ties in scheduling order, waits that stop early."""

from __future__ import annotations

from kmq.dev.sim.clock import EPOCH_S, VirtualClock


def test_the_clock_stands_still_until_advanced_and_runs_due_events_in_order():
    clock = VirtualClock()
    seen = []
    clock.call_later(2.0, lambda: seen.append(("b", clock.monotonic())))
    clock.call_later(1.0, lambda: seen.append(("a", clock.monotonic())))
    clock.call_later(2.0, lambda: seen.append(("c", clock.monotonic())))  # same time as b: after it
    assert clock.now() == EPOCH_S and seen == []
    clock.advance(1.5)
    assert seen == [("a", 1.0)] and clock.monotonic() == 1.5
    clock.advance(10)
    assert seen == [("a", 1.0), ("b", 2.0), ("c", 2.0)] and clock.monotonic() == 11.5


def test_a_wait_stops_at_the_event_that_made_it_ready_and_otherwise_at_its_deadline():
    clock = VirtualClock()
    box = []
    clock.call_later(3.0, lambda: box.append(1))
    assert clock.run_until(clock.now() + 5.0, lambda: bool(box)) is True
    assert clock.monotonic() == 3.0
    assert clock.run_until(clock.now() + 1.0, lambda: len(box) > 1) is False
    assert clock.monotonic() == 4.0


def test_an_event_scheduled_in_the_past_runs_now_and_the_clock_never_goes_back():
    clock = VirtualClock()
    clock.advance(5)
    seen = []
    clock.call_at(EPOCH_S + 1, lambda: seen.append(clock.monotonic()))
    clock.advance(0)
    assert seen == [5.0]


def test_a_wait_from_inside_an_event_runs_nothing_and_answers_at_once():
    clock = VirtualClock()
    inner = []
    clock.call_later(1.0, lambda: inner.append(clock.run_until(clock.now() + 100, lambda: False)))
    clock.call_later(2.0, lambda: inner.append("second"))
    clock.advance(1.0)
    assert inner == [False] and clock.monotonic() == 1.0  # the nested wait did not jump the clock
    clock.advance(1.0)
    assert inner == [False, "second"]


def test_milliseconds_and_microseconds_are_exact_integers():
    clock = VirtualClock(start_s=0.0)
    for _ in range(1000):
        clock.advance(0.001)
    assert clock.now_ms() == 1000 and clock.now_us() == 1_000_000
