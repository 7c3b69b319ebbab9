"""When the tracker's group membership is in doubt: whole-process pauses and polls (controlled time)."""

from __future__ import annotations

import time

from tracker.membership import MembershipCheck, PauseLog, PauseWatch


def ticked(times: list[float], interval: float = 0.1) -> PauseLog:
    log = PauseLog(interval, times[0])
    for t in times[1:]:
        log.tick(t)
    return log


def test_ticks_on_time_or_a_little_late_are_no_pause():
    log = ticked([0.0, 0.1, 0.2, 0.45, 0.55])  # 0.15 s late: scheduling noise
    assert log.longest_since(0.0, 0.6) == 0.0


def test_a_late_tick_is_a_pause_counted_while_it_ended_after_the_given_time():
    log = ticked([0.0, 0.1, 7.2, 7.3])  # the process stood still 7 s before the tick at 7.2
    assert abs(log.longest_since(0.0, 7.35) - 7.0) < 1e-9
    assert abs(log.longest_since(7.1, 7.35) - 7.0) < 1e-9  # ended at 7.2: after 7.1
    assert log.longest_since(7.2, 7.35) == 0.0  # handled up to its end


def test_a_pause_still_going_on_counts_before_the_ticker_has_run_again():
    log = ticked([0.0, 0.1])
    assert log.longest_since(0.05, 9.1) == 9.1 - 0.1 - 0.1


def test_the_watch_reports_nothing_unless_it_runs():
    clock = {"now": 100.0}
    watch = PauseWatch(interval=0.01, clock=lambda: clock["now"])
    clock["now"] = 200.0
    assert watch.longest_since(0.0) == 0.0
    watch.start()
    try:
        clock["now"] = 300.0  # the ticker thread sees its clock jump: a 100 s pause
        deadline = time.monotonic() + 10
        while watch._log._last != 300.0:
            assert time.monotonic() < deadline, "the pause watch never ticked"
            time.sleep(0.01)
        assert watch.longest_since(250.0) > 99.0 and watch.longest_since(300.0) == 0.0
    finally:
        watch.stop()
    assert watch.longest_since(0.0) == 0.0


class Declared:
    def __init__(self) -> None:
        self.pauses: list[tuple[float, float]] = []  # (ended at, length)

    def longest_since(self, since: float) -> float:
        return max((length for ended, length in self.pauses if ended > since), default=0.0)


def test_membership_is_in_doubt_after_a_pause_past_the_session_less_a_heartbeat_once_per_pause():
    clock = {"now": 0.0}
    pauses = Declared()
    check = MembershipCheck(6.0, 1.0, 300.0, pauses, lambda: clock["now"])
    clock["now"] = 10.0
    pauses.pauses.append((10.0, 5.0))  # heartbeats resumed within the session
    assert check.doubt() is None
    clock["now"] = 20.0
    pauses.pauses.append((20.0, 5.5))
    assert "stood still for 5.5s" in check.doubt()
    assert check.doubt() is None  # reported once


def test_membership_is_in_doubt_past_max_poll_interval_without_a_poll():
    clock = {"now": 0.0}
    check = MembershipCheck(6.0, 1.0, 300.0, Declared(), lambda: clock["now"])
    clock["now"] = 299.0
    assert check.doubt() is None
    clock["now"] = 301.0
    assert "no poll for 301s" in check.doubt()
    check.polled()
    clock["now"] = 400.0
    assert check.doubt() is None
