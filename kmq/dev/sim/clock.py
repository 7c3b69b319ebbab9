"""The simulation's virtual clock and its event queue.

Nothing in the simulator reads ``time.time``: the clock stands still until
the simulation advances it, and it advances only by running the events due
up to a point in time (a delayed produce acknowledgement, a broker pause
ending, a retention run). A blocking client call (a fetch with a timeout, a
``flush``, a ``get``) is simulated by advancing the clock until what it
waits for happened or its timeout passed.

Time is kept in integer microseconds, so the same sequence of calls gives
the same times whatever the float rounding of the inputs; events due at the
same microsecond run in the order they were scheduled. Determinism follows:
no threads, no wall clock, ties broken by a counter.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable

__all__ = ["VirtualClock", "EPOCH_S", "to_us"]

#: Where a simulation's clock starts (2023-11-14T22:13:20Z): record timestamps look like real ones.
EPOCH_S = 1_700_000_000.0


def to_us(seconds: float) -> int:
    """``seconds`` as whole microseconds (rounded to nearest)."""
    return int(round(seconds * 1_000_000))


class VirtualClock:
    """A clock the simulation moves forward, with events scheduled on it.

    ``now()`` is seconds since the epoch (like ``time.time()``), ``now_ms()`` milliseconds
    (Kafka's timestamps), ``monotonic()`` seconds since the simulation started."""

    def __init__(self, start_s: float = EPOCH_S) -> None:
        self._start_us = to_us(start_s)
        self._now_us = self._start_us
        self._events: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._running = False

    # ------------------------------------------------------------ reading
    def now(self) -> float:
        return self._now_us / 1_000_000

    def now_ms(self) -> int:
        return self._now_us // 1000

    def now_us(self) -> int:
        return self._now_us

    def monotonic(self) -> float:
        """Seconds since the simulation started."""
        return (self._now_us - self._start_us) / 1_000_000

    def next_event_us(self) -> int | None:
        """When the next scheduled event is due (None: nothing scheduled)."""
        return self._events[0][0] if self._events else None

    # ------------------------------------------------------------ scheduling
    def call_at(self, when_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the clock reaches ``when_s`` (now, if that has passed)."""
        self.call_at_us(to_us(when_s), fn)

    def call_at_us(self, when_us: int, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (max(when_us, self._now_us), next(self._seq), fn))

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.call_at_us(self._now_us + to_us(max(0.0, delay_s)), fn)

    # ------------------------------------------------------------ advancing
    def advance(self, seconds: float) -> None:
        """Run every event due within ``seconds`` from now, then stand at that time."""
        self.run_until_us(self._now_us + to_us(max(0.0, seconds)))

    def run_until(self, deadline_s: float, ready: Callable[[], bool] | None = None) -> bool:
        return self.run_until_us(to_us(deadline_s), ready)

    def run_until_us(self, deadline_us: int, ready: Callable[[], bool] | None = None) -> bool:
        """Run the events due up to ``deadline_us`` in order, stopping early (at the time of the
        event that did it) once ``ready()`` is true; returns whether it is.

        Not re-entrant: called from inside an event (a delivery callback that flushes, say), it
        runs nothing and answers ``ready()`` at once, as a client's own I/O thread never waits on
        itself. The clock never moves backwards."""
        if ready is not None and ready():
            return True
        if self._running:
            return bool(ready is not None and ready())
        self._running = True
        try:
            while self._events and self._events[0][0] <= deadline_us:
                when, _seq, fn = heapq.heappop(self._events)
                self._now_us = max(self._now_us, when)
                fn()
                if ready is not None and ready():
                    return True
            self._now_us = max(self._now_us, deadline_us)
            return bool(ready is not None and ready())
        finally:
            self._running = False

    def run_all(self, limit_s: float = 3600.0) -> None:
        """Run every scheduled event due within ``limit_s`` (a bound, so a self-rescheduling
        event cannot loop for ever); the clock ends at the last event run."""
        deadline = self._now_us + to_us(limit_s)
        while self._events and self._events[0][0] <= deadline:
            self.run_until_us(self._events[0][0])

    def __repr__(self) -> str:
        return f"VirtualClock(t={self.monotonic():.6f}s, {len(self._events)} event(s) pending)"
