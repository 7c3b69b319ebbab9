"""kmq.client.kafka_python.watchdog.StallDetector: a Kafka poll that stops returning (pure, time passed in)."""

from __future__ import annotations

from kmq.client.kafka_python.watchdog import FAIL, RECOVER, StallDetector


def test_a_poll_that_returns_in_time_is_never_stalled():
    d = StallDetector(10.0)
    for i in range(100):
        d.poll_started(i * 0.2)
        assert d.check(i * 0.2 + 0.1) is None
        d.poll_returned(i * 0.2 + 0.15)
    assert d.check(1000.0) is None  # not inside a poll


def test_first_stall_is_recovered_a_second_without_progress_is_fatal():
    d = StallDetector(10.0)
    d.poll_started(0.0)
    assert d.check(9.9) is None
    assert d.check(10.0) == RECOVER
    d.poll_returned(10.1, normally=False)  # unblocked with an error, not a normal return
    d.poll_started(10.2)
    assert d.check(15.0) is None
    assert d.check(20.2) == FAIL


def test_a_normal_return_after_a_recovery_rearms_it():
    d = StallDetector(5.0)
    d.poll_started(0.0)
    assert d.check(5.0) == RECOVER
    d.poll_returned(5.1, normally=False)
    d.poll_started(5.2)
    d.poll_returned(5.3)  # polls work again
    d.poll_started(6.0)
    assert d.check(11.0) == RECOVER
    assert d.recoveries == 2
