"""The lag job's stop: a signal sets a flag, the sinks refuse the next batch, the query ends at a
batch boundary, and only a batch that never ends is cancelled."""

from __future__ import annotations

import os
import signal

import pytest

from kmq.spark.stopping import StopRequest, await_query, stop_query


class FakeQuery:
    """A query that terminates after ``ends_after`` waits (None: never), raising ``error`` if given."""

    def __init__(self, ends_after: int | None, error: Exception | None = None) -> None:
        self.ends_after, self.error, self.waits, self.stopped = ends_after, error, 0, False

    def awaitTermination(self, timeout: float) -> bool:
        self.waits += 1
        if self.stopped or (self.ends_after is not None and self.waits >= self.ends_after):
            if self.error is not None:
                raise self.error
            return True
        return False

    def stop(self) -> None:
        self.stopped = True


class FakeSinks:
    def __init__(self) -> None:
        self.refusing = False

    def refuse_batches(self) -> None:
        self.refusing = True


class FakeSpark:
    class sparkContext:  # noqa: N801 - mimics the attribute
        levels: list[str] = []

        @classmethod
        def setLogLevel(cls, level: str) -> None:
            cls.levels.append(level)


def test_a_query_that_ends_on_its_own_is_not_a_stop():
    assert await_query(FakeQuery(ends_after=3), StopRequest(signals=()), poll_s=0) is False


def test_a_query_failure_propagates_when_no_stop_was_asked():
    with pytest.raises(RuntimeError):
        await_query(FakeQuery(ends_after=2, error=RuntimeError("boom")), StopRequest(signals=()), poll_s=0)


def test_sigterm_sets_the_flag_and_the_wait_returns():
    with StopRequest(signals=(signal.SIGTERM,)) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert await_query(FakeQuery(ends_after=None), stop, poll_s=0) is True
    assert stop.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_the_stop_lets_the_running_batch_end_and_refuses_the_next():
    query, sinks = FakeQuery(ends_after=4, error=RuntimeError("BatchRefused ...")), FakeSinks()
    stop_query(FakeSpark(), query, sinks, drain_s=60, poll_s=0)
    assert sinks.refusing and not query.stopped  # ended by the refused batch, not cancelled
    assert FakeSpark.sparkContext.levels[-1] == "OFF"


def test_a_batch_that_never_ends_is_cancelled_after_the_drain_time():
    query, sinks = FakeQuery(ends_after=None), FakeSinks()
    stop_query(FakeSpark(), query, sinks, drain_s=0, poll_s=0)
    assert sinks.refusing and query.stopped
