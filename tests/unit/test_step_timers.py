"""The tracker step's commit and gauge intervals (:mod:`kmq.core.step_timers`)."""

from __future__ import annotations

from kmq.core.step_timers import Due, StepTimers


def test_both_are_due_at_the_first_step_then_each_after_its_own_interval():
    t = StepTimers(commit_s=1.0, metrics_s=5.0)
    assert t.due(100.0) == Due(commit=True, metrics=True)
    assert t.due(100.5) == Due(commit=False, metrics=False)
    assert t.due(101.0) == Due(commit=True, metrics=False)
    assert t.due(104.9) == Due(commit=True, metrics=False)
    assert t.due(105.0) == Due(commit=False, metrics=True)


def test_a_catch_up_publishes_the_gauges_at_once_without_moving_the_commit():
    t = StepTimers(commit_s=1.0, metrics_s=1.0)
    t.due(10.0)
    t.caught_up()
    assert t.due(10.1) == Due(commit=False, metrics=True)
    assert t.due(10.2) == Due(commit=False, metrics=False)  # then its interval again
