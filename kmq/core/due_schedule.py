"""When each of many keys is next due, and which are due now: the tracker's wake-up schedule.

The tracker owns up to thousands of markers partitions, each with its own
next due time (:meth:`kmq.core.lease_state.PartitionState.next_due_ms`).
Visiting every partition every tick to ask makes an idle tracker's cost grow
with its partitions; this schedule answers "what is due at ``now``" and "when
is the next one" from a heap, so a tick costs nothing for a partition that is
not due.

The caller sets a key's time whenever the key's own next due time may have
changed (:meth:`DueSchedule.set`; ``None`` removes it). A key is held at one
time at most: setting it again replaces the earlier time (the heap keeps the
old entry until it surfaces, then drops it, and is rebuilt when stale entries
outnumber live ones). :meth:`DueSchedule.pop_due` removes the keys it returns:
the caller sets each again after serving it.

Pure: no clock, times are passed in (milliseconds, any epoch).
"""

from __future__ import annotations

import heapq
from typing import Generic, Hashable, TypeVar

__all__ = ["DueSchedule"]

K = TypeVar("K", bound=Hashable)

# Rebuild the heap when it holds this many more entries than there are keys (stale ones).
_SLACK = 64


class DueSchedule(Generic[K]):
    """Keys with their next due time (milliseconds); see the module docstring.

    Keys must be orderable among themselves (ties in time are broken by key)."""

    __slots__ = ("_at", "_heap")

    def __init__(self) -> None:
        self._at: dict[K, int] = {}
        self._heap: list[tuple[int, K]] = []

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def get(self, key: K) -> int | None:
        """The time ``key`` is due at (None: not scheduled)."""
        return self._at.get(key)

    def set(self, key: K, at_ms: int | None) -> None:
        """Schedule ``key`` at ``at_ms``, replacing its earlier time; None unschedules it."""
        if at_ms is None:
            self._at.pop(key, None)
            return
        if self._at.get(key) == at_ms:
            return
        self._at[key] = at_ms
        heapq.heappush(self._heap, (at_ms, key))
        if len(self._heap) > 2 * len(self._at) + _SLACK:
            self._heap = [(at, k) for k, at in self._at.items()]
            heapq.heapify(self._heap)

    def discard(self, key: K) -> None:
        """Unschedule ``key`` (nothing happens when it is not scheduled)."""
        self._at.pop(key, None)

    def clear(self) -> None:
        self._at.clear()
        self._heap.clear()

    def next_ms(self) -> int | None:
        """The earliest time any key is due at (None: nothing scheduled)."""
        heap, at = self._heap, self._at
        while heap:
            t, key = heap[0]
            if at.get(key) == t:
                return t
            heapq.heappop(heap)  # replaced or removed since it was pushed
        return None

    def pop_due(self, now_ms: int) -> list[K]:
        """Remove and return the keys due at ``now_ms`` (time at or before it), earliest first."""
        heap, at = self._heap, self._at
        out: list[K] = []
        while heap and heap[0][0] <= now_ms:
            t, key = heapq.heappop(heap)
            if at.get(key) == t:
                del at[key]
                out.append(key)
        return out
