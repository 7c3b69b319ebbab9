"""kmq.consumer.flow: outstanding-message bounds fitted to the lease (pure, time passed in)."""

from __future__ import annotations

import pytest

from kmq.consumer.flow import FlowControl, FlowLimits


def drain(fc: FlowControl, rate: float, seconds: float, t: float, step: float = 0.05) -> float:
    """Settle at ``rate`` msg/s for ``seconds`` while refilling to the bound; returns the end time."""
    end = t + seconds
    carry = 0.0
    while t < end:
        room = fc.room(t)
        if room.messages:
            fc.taken(room.messages, room.messages * 100, t)
            fc.handed(room.messages, t)
        t += step
        carry += rate * step
        n = min(int(carry), fc.outstanding)
        carry -= n
        if n:
            fc.settled(n, n * 100, t)
    return t


def test_before_any_measurement_the_floor_bounds_what_is_taken():
    fc = FlowControl(FlowLimits(lease=5.0, min_messages=200), now=0.0)
    assert fc.rate is None and fc.limit(0.0) == 200
    fc.taken(200, 20_000, 0.0)
    assert not fc.room(0.1)  # nothing settled yet: no more than the floor


def test_bound_fits_half_a_lease_at_the_measured_rate():
    # 200 msg/s of handler capacity and a 5 s lease: at most ~500 outstanding (2.5 s of work).
    fc = FlowControl(FlowLimits(lease=5.0, min_messages=50), now=0.0)
    t = drain(fc, 200.0, 20.0, 0.0)
    assert fc.rate == pytest.approx(200, rel=0.1)
    assert fc.limit(t) == pytest.approx(500, rel=0.1)
    assert fc.wait_bound() <= 0.5 * 5.0 * 1.1  # the newest message starts within about half a lease


def test_fast_handlers_open_the_bound_up_to_max_messages():
    fc = FlowControl(FlowLimits(lease=30.0, max_messages=10_000, min_messages=500), now=0.0)
    t = drain(fc, 50_000.0, 3.0, 0.0)
    assert fc.limit(t) == 10_000


def test_rate_follows_a_handler_that_slows_down():
    fc = FlowControl(FlowLimits(lease=10.0, min_messages=10, window=2.0), now=0.0)
    t = drain(fc, 1000.0, 5.0, 0.0)
    fast = fc.limit(t)
    t = drain(fc, 100.0, 10.0, t)
    assert fc.limit(t) < fast / 5
    assert fc.limit(t) == pytest.approx(100 * 10 * 0.5, rel=0.2)


def test_idle_time_does_not_read_as_a_slow_handler():
    fc = FlowControl(FlowLimits(lease=10.0, min_messages=10), now=0.0)
    t = drain(fc, 500.0, 5.0, 0.0)
    fc.settled(fc.outstanding, 0, t)  # drained: nothing outstanding
    before = fc.rate
    assert fc.limit(t + 600.0) == fc.limit(t)  # ten idle minutes later
    assert fc.rate == before


def test_bytes_bound_and_a_single_oversized_message():
    fc = FlowControl(FlowLimits(lease=5.0, max_bytes=1000, min_messages=100), now=0.0)
    fc.taken(3, 900, 0.0)
    assert fc.room(0.0).bytes == 100
    fc.taken(1, 5000, 0.0)
    assert not fc.room(0.0)
    fc.settled(4, 5900, 1.0)
    room = fc.room(1.0)  # nothing outstanding: always room for one, however large
    assert room and room.bytes >= 1


def test_given_back_messages_leave_the_bound_but_not_the_rate():
    fc = FlowControl(FlowLimits(lease=5.0, min_messages=100), now=0.0)
    fc.taken(100, 0, 0.0)
    fc.returned(100, 0, 1.0)
    assert fc.outstanding == 0 and fc.rate is None


def test_time_before_the_hand_over_does_not_read_as_slow_handlers():
    # A START held up by a broker outage: messages outstanding, none handed, nothing settled.
    fc = FlowControl(FlowLimits(lease=10.0, min_messages=10), now=0.0)
    t = drain(fc, 1000.0, 5.0, 0.0)
    fc.settled(fc.outstanding, 0, t)  # handlers caught up
    before = fc.limit(t)
    fc.taken(500, 0, t)
    assert fc.limit(t + 30.0) == before  # 30 s of waiting for Kafka
    fc.handed(500, t + 30.0)
    fc.settled(500, 0, t + 30.5)
    assert fc.limit(t + 30.5) >= before * 0.5


@pytest.mark.parametrize("kw", [{"lease": 0}, {"lease": 1, "max_messages": 0}, {"lease": 1, "lease_fraction": 0},
                                {"lease": 1, "lease_fraction": 1.5}, {"lease": 1, "window": 0}])
def test_bad_limits_are_refused(kw):
    with pytest.raises(ValueError):
        FlowLimits(**kw)


def test_expired_messages_leave_the_bound_and_stop_counting_as_busy_without_being_settlements():
    fc = FlowControl(FlowLimits(lease=5.0, min_messages=100), now=0.0)
    fc.taken(100, 1000, 0.0)
    fc.handed(100, 0.0)
    fc.settled(60, 600, 1.0)
    fc.expired(40, 400, 5.0)  # never settled: their leases ended in user code
    assert fc.outstanding == 0 and fc.outstanding_bytes == 0 and fc.available == 0
    assert fc.rate == pytest.approx(60 / 5.0)  # 60 settlements in 5 busy seconds: expiries are not processed
    assert fc.room(5.0).messages == 100


def test_fetchable_asks_for_the_room_left_in_steps_of_a_quarter_of_the_bound():
    fc = FlowControl(FlowLimits(lease=5.0, max_messages=1000, min_messages=400), now=0.0)
    assert fc.fetchable(0.0, partition_room=10_000, fetch_size=2000, partition_cap=10_000) == 400
    fc.taken(350, 0, 0.0)
    assert fc.fetchable(0.0, 10_000, 2000, 10_000) == 0  # 50 left: below a step of 100, wait for more
    fc.settled(60, 0, 0.1)
    assert fc.fetchable(0.1, 10_000, 2000, 10_000) == 110
    assert fc.fetchable(0.1, partition_room=30, fetch_size=2000, partition_cap=10_000) == 0  # the fullest partition
    fc.settled(290, 0, 0.2)
    assert fc.fetchable(0.2, partition_room=30, fetch_size=2000, partition_cap=10_000) == 30  # nothing outstanding


def test_a_reading_older_than_the_last_one_does_not_count_as_busy_time():
    # Threads read the clock at different moments: a fold with an older reading than the hand-over
    # once moved the clock back, so the next tick counted that span again as busy time, the rate
    # came out far too low and the bound stayed at its floor (one batch at a time).
    fc = FlowControl(FlowLimits(lease=30.0, max_messages=10_000, min_messages=500), now=0.0)
    fc.taken(500, 50_000, 1.0)
    fc.handed(500, 1.0)
    assert fc.limit(0.5) == 500  # an older reading: no time passed
    fc.settled(500, 50_000, 1.004)  # the handlers took 4 ms
    fc.limit(1.004)
    assert fc.rate == pytest.approx(500 / 0.004)
    assert fc.limit(1.004) == 10_000


def test_a_sample_ends_with_the_settlements_of_its_last_moment():
    # A handler that takes 0.3 s: the sample closed by its settlement counts that settlement
    # (it once read 0 settlements in 0.3 s: a rate of 0).
    fc = FlowControl(FlowLimits(lease=10.0, min_messages=10), now=0.0)
    fc.taken(1, 100, 0.0)
    fc.handed(1, 0.0)
    fc.settled(1, 100, 0.3)
    assert fc.rate == pytest.approx(1 / 0.3)
