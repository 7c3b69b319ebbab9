"""The lag job's retry of a sink step through a broker outage (clock and sleep passed in)."""

from __future__ import annotations

import pytest

from kmq.spark.sink_retry import retry_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


class Down(Exception):
    pass


def flaky(failures: int):
    calls = {"n": 0}

    def step():
        calls["n"] += 1
        if calls["n"] <= failures:
            raise Down(f"try {calls['n']}")
        return "written"
    return step, calls


def test_a_step_that_works_runs_once_without_sleeping():
    clock = Clock()
    step, calls = flaky(0)
    assert retry_until("x", step, (Down,), budget=60, clock=clock, sleep=clock.sleep) == "written"
    assert calls["n"] == 1 and clock.sleeps == []


def test_failures_are_retried_with_a_capped_doubling_backoff_and_a_reset_between_tries():
    clock = Clock()
    resets = []
    step, calls = flaky(6)
    got = retry_until("x", step, (Down,), budget=300, reset=lambda: resets.append(clock.now), first_delay=0.5,
                      max_delay=4.0, clock=clock, sleep=clock.sleep)
    assert got == "written" and calls["n"] == 7
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert len(resets) == 6  # a fresh client before every retry


def test_past_the_budget_the_last_error_is_raised():
    clock = Clock()
    step, calls = flaky(10**6)
    with pytest.raises(Down):
        retry_until("x", step, (Down,), budget=20, first_delay=1, max_delay=8, clock=clock, sleep=clock.sleep)
    assert clock.now - 100.0 == pytest.approx(20)  # the last sleep is cut to what is left of the budget
    assert sum(clock.sleeps) == pytest.approx(20)


def test_other_errors_are_not_retried():
    clock = Clock()

    def step():
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        retry_until("x", step, (Down,), budget=60, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []


def test_budget_zero_means_one_try():
    clock = Clock()
    step, calls = flaky(1)
    with pytest.raises(Down):
        retry_until("x", step, (Down,), budget=0, clock=clock, sleep=clock.sleep)
    assert calls["n"] == 1
