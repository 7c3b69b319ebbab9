"""When the group may have moved the tracker's partitions without the rebalance listener being told.

Both Kafka clients send the group's heartbeats from a background thread
(kafka-python 3's heartbeat thread, librdkafka's own threads), so a main loop
that is merely slow (a read waiting on an unreachable leader, a send waiting
on a slow broker) keeps its membership: the group moves a partition only
after the listener revoked it, and the tracker drops that partition's view
then. Heartbeats are missed when every thread of the process stands still
(SIGSTOP, a frozen VM, a stop-the-world pause): after a pause longer than
the session timeout less one heartbeat interval, the group may have given
every partition to another member, and the client learns of it only at its
next heartbeat, after the main loop has resumed.

:class:`PauseWatch` is a thread that ticks a few times a second; a tick that
comes late by more than its interval means the process stood still in
between. :class:`PauseLog` (pure) keeps those gaps and answers how long the
process stood still since a given time. :class:`MembershipCheck` applies the
rule: the membership is in doubt after such a pause, or when no poll came
for longer than ``max.poll.interval`` (the client then leaves the group).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Protocol

__all__ = ["PauseLog", "Pauses", "PauseWatch", "MembershipCheck"]

# Gaps shorter than this are scheduling noise, not pauses worth remembering.
_NOTABLE_S = 0.5
_REMEMBERED = 64


class PauseLog:
    """Pauses seen by a ticker with period ``interval`` seconds (pure: times are passed in)."""

    def __init__(self, interval: float, now: float) -> None:
        self.interval = interval
        self._last = now
        self._pauses: deque[tuple[float, float]] = deque(maxlen=_REMEMBERED)  # (ended at, length)

    def tick(self, now: float) -> None:
        """The ticker ran at ``now``; a gap past its interval is a pause that ended now."""
        stood = now - self._last - self.interval
        if stood >= _NOTABLE_S:
            self._pauses.append((now, stood))
        self._last = now

    def longest_since(self, since: float, now: float) -> float:
        """Seconds of the longest pause that ended after ``since``, including one still going on
        (the ticker has not run for longer than its interval: the main thread may resume first)."""
        ongoing = now - self._last - self.interval
        longest = ongoing if ongoing >= _NOTABLE_S else 0.0
        for ended, length in self._pauses:
            if ended > since:
                longest = max(longest, length)
        return longest


class Pauses(Protocol):
    """What tells the tracker how long the whole process stood still: :class:`PauseWatch` in the
    service; the simulator answers from its fault plan, tests from the pauses they declare."""

    def start(self) -> None:
        """Begin watching (the tracker's ``open``)."""

    def stop(self) -> None:
        """Stop watching (the tracker's ``close``)."""

    def longest_since(self, since: float) -> float:
        """Seconds of the longest pause that ended after ``since`` or is going on (the clock's seconds)."""


class PauseWatch:
    """Runs a :class:`PauseLog` on a daemon thread. Before :meth:`start` (and after :meth:`stop`)
    it reports no pause: without the ticker there is nothing to compare with."""

    def __init__(self, interval: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._interval = interval
        self._log: PauseLog | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._log = PauseLog(self._interval, self._clock())
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kmq-tracker-pause-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
            self._thread = None
        self._log = None

    def longest_since(self, since: float) -> float:
        """Seconds of the longest whole-process pause since ``since`` (this clock's seconds)."""
        log = self._log
        return 0.0 if log is None else log.longest_since(since, self._clock())

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            log = self._log
            if log is not None:
                log.tick(self._clock())


class MembershipCheck:
    """Whether the group may have moved partitions behind the listener's back since the last check.

    ``session_timeout``, ``heartbeat_interval`` and ``max_poll_interval`` are the group consumer's
    (seconds); ``pauses`` answers ``longest_since(t)``; ``clock`` is the pauses' clock."""

    def __init__(self, session_timeout: float, heartbeat_interval: float, max_poll_interval: float,
                 pauses: Pauses, clock: Callable[[], float]) -> None:
        self.pauses = pauses
        self._clock = clock
        self._pause_limit = session_timeout - heartbeat_interval
        self._session_timeout = session_timeout
        self._max_poll_interval = max_poll_interval
        self._seen = self._polled = clock()

    def polled(self) -> None:
        """The group consumer was polled (and rejoined, if it had learnt it must)."""
        self._polled = self._clock()

    def doubt(self) -> str | None:
        """Why the membership is in doubt since the last doubt reported; None when it is not.

        A pause longer than the session timeout less one heartbeat interval may have let the
        session expire (the last heartbeat before it may be up to an interval old)."""
        now = self._clock()
        paused = self.pauses.longest_since(self._seen)
        if paused > self._pause_limit:
            why = (f"the process stood still for {paused:.1f}s (kafka.session_timeout {self._session_timeout:g}s: "
                   f"the group may have moved every partition)")
        elif now - self._polled > self._max_poll_interval:
            why = f"no poll for {now - self._polled:.0f}s (past max.poll.interval: the client left the group)"
        else:
            return None
        self._seen = now
        return why
