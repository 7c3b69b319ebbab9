"""Clock skew between a worker host and the tracker host, on the tracker's main loop.

The tracker's clock is the harness's controlled time; a worker's markers carry
that time plus the worker's skew as their record timestamps (CreateTime). A
lease is judged on the tracker's clock alone (kmq.core.marker_clock): a
handler that acks within its lease costs no copy and no dead letter whatever
the skew, and a worker whose clock is ahead does not hold its leases longer.
"""

from __future__ import annotations

import pytest

from kmq.core.marker_clock import SKEW_ALLOWANCE_MS
from kmq.core.markers import End, Start
from tests.helpers.tracker_step import PARTITIONS, Harness

LEASE_MS = 2_000
MESSAGES = 20
TICK_S = 0.05


class Worker:
    """Writes a worker's markers to partition 0 with its own clock: the tracker's plus ``skew_s``."""

    def __init__(self, h: Harness, skew_s: float, owner: str = "w") -> None:
        self.h, self.skew_ms, self.owner = h, int(skew_s * 1000), owner

    def now_ms(self) -> int:
        return int(self.h.time.wall * 1000) + self.skew_ms

    def start(self, offset: int) -> None:
        self.h.kafka.append(self.h.q.name, 0, b"k%d" % offset, b"v%d" % offset)
        self.h.kafka.marker(self.h.q.markers_topic, 0, Start([(offset, 1)], lease_ms=LEASE_MS, owner=self.owner),
                            ts_ms=self.now_ms())

    def end(self, offset: int) -> None:
        self.h.kafka.marker(self.h.q.markers_topic, 0, End([(offset, 1)]), ts_ms=self.now_ms())


def run_for(h: Harness, seconds: float) -> None:
    h.steps(round(seconds / TICK_S))


def copies(h: Harness, originals: int) -> int:
    """Records in queue partition 0 past the ``originals`` the workers' producer wrote."""
    return len(h.kafka.records(h.q.name, 0)) - originals


def dead_letters(h: Harness) -> int:
    return sum(len(h.kafka.records(h.q.dlq_topic, p)) for p in range(PARTITIONS))


def acked_within_the_lease(h: Harness, worker: Worker) -> None:
    """MESSAGES messages one after another, each acked 0.3 s after its START; then 10 s more."""
    for o in range(MESSAGES):
        worker.start(o)
        run_for(h, 0.3)
        worker.end(o)
    run_for(h, 10)


@pytest.mark.parametrize("skew_s", [-10.0, 10.0, -3600.0, 3600.0])
def test_a_handler_that_acks_within_its_lease_costs_no_copy_and_no_dead_letter_whatever_the_skew(skew_s):
    h = Harness()
    run_for(h, 0.2)  # positioned and caught up on the empty partitions: markers are read as they come
    acked_within_the_lease(h, Worker(h, skew_s))
    assert copies(h, MESSAGES) == 0 and dead_letters(h) == 0
    assert h.closed(0) == []
    state = h.tracker.partitions[(h.q.markers_topic, 0)].state
    assert state.in_flight == 0 and h.metric("late_acks", h.q.name) == 0


@pytest.mark.parametrize("skew_s", [-10.0, 10.0])
def test_a_tracker_restart_in_the_middle_of_a_lease_costs_no_copy_under_skew(skew_s):
    """The START is replayed (the tracker was just assigned the partition): it has no read-at-the-
    log-end floor, and counts from its record time plus the skew allowance, at most its read time."""
    h = Harness()
    worker = Worker(h, skew_s)
    worker.start(0)
    run_for(h, 0.3)  # positions, catches up (the START replayed), serves
    worker.end(0)
    run_for(h, 10)
    assert h.copies()[0] == 0 and dead_letters(h) == 0


@pytest.mark.parametrize("skew_s", [10.0, 365 * 86400.0])
def test_a_worker_clock_ahead_does_not_hold_its_leases_longer(skew_s):
    h = Harness()
    run_for(h, 0.2)
    Worker(h, skew_s).start(0)  # and the worker dies: no END
    started = h.time.wall
    while h.copies()[0] == 0 and h.time.wall - started < 30:
        run_for(h, TICK_S)
    # The lease (2 s) and the first backoff (0.1 s), on the tracker's clock, and a tick or two.
    assert h.time.wall - started == pytest.approx(2.1, abs=0.2)


def test_a_replayed_start_gets_at_most_the_skew_allowance_however_often_it_is_replayed():
    """A restart does not give the re-read STARTs fresh leases: an open START older than the
    allowance plus its lease is due as soon as the partition has caught up."""
    h = Harness()
    h.kafka.append(h.q.name, 0, b"k", b"v")
    h.kafka.marker(h.q.markers_topic, 0, Start([(0, 1)], lease_ms=LEASE_MS, owner="w"),
                   ts_ms=int(h.time.wall * 1000) - SKEW_ALLOWANCE_MS - LEASE_MS - 1_000)
    run_for(h, 0.5)
    assert h.copies()[0] == 1


def test_the_skew_of_each_owner_is_measured_on_the_starts_read_at_the_log_end():
    h = Harness()
    run_for(h, 0.2)
    behind, ahead = Worker(h, -10.0, owner="behind"), Worker(h, 4.0, owner="ahead")
    behind.start(0)
    ahead.start(1)
    run_for(h, 1.5)  # a metrics interval
    gauge = h.tracker.metrics.clock_skew_seconds
    # Read time minus record time: the worker's skew plus at most a tick of read latency.
    assert gauge.labels(h.q.name, "behind")._value.get() == pytest.approx(10.0, abs=TICK_S + 0.01)
    assert gauge.labels(h.q.name, "ahead")._value.get() == pytest.approx(-4.0, abs=TICK_S + 0.01)


def stuck_fetch(h: Harness) -> dict:
    """From now on while ``stuck["on"]``, the tracker's markers fetch brings nothing (a stuck fetch)."""
    stuck, real = {"on": True}, h.consumer.fetch
    h.consumer.fetch = lambda *args, **kw: [] if stuck["on"] else real(*args, **kw)
    return stuck


def jump(h: Harness, seconds: float) -> None:
    """The tracker's wall clock is set by ``seconds`` (negative: back); its monotonic clock runs on."""
    h.time.wall += seconds


def test_after_its_clock_went_back_the_tracker_judges_no_lease_on_a_read_through_time_of_the_old_clock(caplog):
    """Caught up at wall time T, the tracker keeps "every marker written before T was read". Its
    clock set back 30 s, that would vouch for 30 s of markers on the new clock it never read: an END
    its fetch has not brought yet would be taken for a lapsed lease. So it re-reads first."""
    h = Harness()
    run_for(h, 0.2)  # caught up on the empty partitions
    jump(h, -30.0)
    worker = Worker(h, 30.0)  # the worker's clock did not move
    run_for(h, 0.2)  # the jump is seen, every partition re-read and caught up again
    assert h.tracker.ready()[0]
    worker.start(0)
    run_for(h, 0.3)  # the START is read
    stuck = stuck_fetch(h)
    worker.end(0)  # acked within the lease; the END is in the log, not read
    run_for(h, 4)  # the lease (2 s) ended on the tracker's clock
    assert copies(h, 1) == 0, "copied a message whose END was in the markers log"
    stuck["on"] = False
    run_for(h, 0.5)
    assert h.tracker.partitions[(h.q.markers_topic, 0)].state.in_flight == 0 and copies(h, 1) == 0
    assert h.metric("clock_jumps", "back") == 1 and h.metric("clock_jump_seconds", "back") == pytest.approx(30, abs=0.1)
    assert "clock jumped 30.0s back" in caplog.text and h.metric("stale_views") == 0


def test_after_its_clock_went_back_an_abandoned_lease_is_still_redelivered_once():
    h = Harness()
    run_for(h, 0.2)
    worker = Worker(h, 0.0)
    worker.start(0)  # and the worker dies: no END
    run_for(h, 0.5)
    jump(h, -30.0)  # its lease, counted on the old clock, would end 30 s late
    began = h.time.mono
    while h.copies()[0] == 0 and h.time.mono - began < 60:
        run_for(h, TICK_S)
    # Replayed after the jump, the START counts from its read time: the lease (2 s), the backoff.
    assert h.time.mono - began == pytest.approx(2.1, abs=0.3)
    run_for(h, 5)
    assert h.copies()[0] == 1


def test_after_its_clock_jumped_forward_a_handler_within_its_lease_costs_no_copy():
    """Set forward 30 s, the tracker's deadlines of the old clock would end every open lease at once."""
    h = Harness()
    run_for(h, 0.2)
    worker = Worker(h, 0.0)
    worker.start(0)
    run_for(h, 0.3)
    jump(h, 30.0)
    worker.skew_ms = -30_000  # the worker's clock did not move
    run_for(h, 0.5)
    worker.end(0)
    run_for(h, 5)
    assert copies(h, 1) == 0 and h.metric("clock_jumps", "forward") == 1
