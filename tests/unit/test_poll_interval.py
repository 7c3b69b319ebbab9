"""kmq.core.poll_interval: when a consumer gives its partitions up because the application
stopped taking messages, and when it joins again (pure, time passed in)."""

from __future__ import annotations

import pytest

from kmq.core.poll_interval import LEAVE, REJOIN, PollInterval


def test_messages_ready_and_none_taken_for_the_interval_leaves_once():
    w = PollInterval(3.0, now=0.0)
    assert w.look(0.0, takes=1, ready=True) is None
    assert w.look(2.9, takes=1, ready=True) is None
    assert w.look(3.0, takes=1, ready=True) == LEAVE
    assert w.left
    assert w.look(10.0, takes=1, ready=True) is None  # said once


def test_each_take_restarts_the_clock():
    w = PollInterval(3.0, now=0.0)
    w.look(0.0, 1, True)
    for t, takes in ((2.0, 2), (4.0, 3), (6.0, 4), (8.0, 5)):
        assert w.look(t, takes, True) is None
    assert w.look(10.9, 5, True) is None
    assert w.look(11.0, 5, True) == LEAVE


def test_an_application_idle_on_an_empty_queue_is_not_stalled():
    # Its clock runs only while messages wait for it: a poll that waits an hour for a message that
    # arrives only then (one take, at its start) returns it at once.
    w = PollInterval(3.0, now=0.0)
    w.look(0.0, 1, False)
    assert w.look(3600.0, 1, False) is None
    assert w.look(3600.1, 1, True) is None  # ready since the last look (the fetcher looks often)
    assert w.look(3602.9, 1, True) is None
    assert w.look(3603.0, 1, True) == LEAVE


@pytest.mark.parametrize("ready", [True, False])
def test_the_first_take_after_leaving_rejoins(ready):
    w = PollInterval(1.0, now=0.0)
    w.look(0.0, 7, True)
    assert w.look(1.0, 7, True) == LEAVE
    assert w.look(50.0, 7, ready) is None  # still nothing taken: stays out
    assert w.look(51.0, 8, ready) == REJOIN
    assert not w.left
    assert w.look(51.5, 9, True) is None
    assert w.look(52.5, 9, True) == LEAVE  # and may stall again


def test_the_first_look_only_learns_the_count():
    w = PollInterval(1.0, now=0.0)
    assert w.look(5.0, 3, True) is None  # counts from now, not from the start
    assert w.look(5.9, 3, True) is None
    assert w.stalled_for(5.9) == pytest.approx(0.9)


@pytest.mark.parametrize("interval", [0, -1.0])
def test_an_interval_must_be_positive(interval):
    with pytest.raises(ValueError, match="interval"):
        PollInterval(interval, now=0.0)
