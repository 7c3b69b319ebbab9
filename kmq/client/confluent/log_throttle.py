"""Collapse repeats of the same log line: the first is logged, then at most one line per interval.

A client library that logs every failed reconnect (librdkafka: one line per
handle, per broker, per attempt, tens a second) drowns the log and fires
log-based alerts hundreds of times during one outage. :class:`RepeatThrottle`
decides, per key (what makes two lines "the same"), which lines to let
through: the first occurrence at once, repeats within ``interval`` seconds
only counted, and then one line per interval that carries the count. The
caller formats and writes the lines; nothing here logs, sleeps or reads a
clock (``now`` is passed in, monotonic seconds), so tests control time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Hashable, TypeVar

__all__ = ["RepeatThrottle", "Suppressed"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Suppressed(Generic[K]):
    """``count`` lines of ``key`` that were not let through in the ``seconds`` before now."""

    key: K
    count: int
    seconds: float


@dataclass
class _Window:
    started: float  # when the last line of this key was let through
    suppressed: int = 0


class RepeatThrottle(Generic[K]):
    """Per key: let the first line through, count repeats for ``interval`` seconds,
    then let one line through with the count (see :meth:`admit` and :meth:`due`).

    At most one line per key per interval reaches the log, plus one for a key seen
    for the first time; state is kept only for keys seen in the last interval.
    """

    def __init__(self, interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.interval = interval
        self._windows: dict[K, _Window] = {}

    def admit(self, key: K, now: float) -> Suppressed[K] | None:
        """A line of ``key`` at ``now``: None to drop it (it is counted), else let it through
        and report the repeats dropped since the previous line of ``key`` (count 0: none)."""
        window = self._windows.get(key)
        if window is None:
            self._windows[key] = _Window(now)
            return Suppressed(key, 0, 0.0)
        if now - window.started < self.interval:
            window.suppressed += 1
            return None
        dropped = Suppressed(key, window.suppressed, now - window.started)
        self._windows[key] = _Window(now)
        return dropped

    def due(self, now: float) -> list[Suppressed[K]]:
        """Keys whose interval has passed with repeats dropped: one summary each (their
        windows restart at ``now``). Keys quiet for a whole interval are forgotten, so
        their next line counts as a first occurrence again."""
        out = []
        for key, window in list(self._windows.items()):
            if now - window.started < self.interval:
                continue
            if window.suppressed:
                out.append(Suppressed(key, window.suppressed, now - window.started))
                self._windows[key] = _Window(now)
            else:
                del self._windows[key]
        return out

    def drain(self, now: float) -> list[Suppressed[K]]:
        """Every key with dropped repeats, interval passed or not (the source is closing);
        all state is cleared."""
        out = [Suppressed(key, w.suppressed, now - w.started) for key, w in self._windows.items() if w.suppressed]
        self._windows.clear()
        return out
