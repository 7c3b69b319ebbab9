"""Automatic lease keeping (``consumer.auto_renew: true``).

:class:`LeaseSchedule` is pure: it takes ``now`` and answers which
unsettled messages need a RENEW (and for how long) and when to look again.
Each message is renewed ``margin`` seconds before its lease ends, but never
beyond ``max_lease`` after its START: once that budget is used up the
schedule stops renewing it, reports it once (the caller logs it), and the
tracker redelivers it when the last lease ends.

:class:`LeaseKeeper` is the thread that runs a schedule and hands the due
renewals to a callback (which buffers them, so renews are written as
coalesced ranges like acks).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable

__all__ = ["LeaseSchedule", "Due", "LeaseKeeper", "default_margin"]

log = logging.getLogger(__name__)


def default_margin(lease: float, flush_interval: float) -> float:
    """Renew this long before a lease ends: a quarter of the lease, at least two
    flush intervals plus 0.2 s for the write, at most half the lease."""
    return min(lease / 2.0, max(lease / 4.0, 2.0 * flush_interval + 0.2))


@dataclass
class Due:
    """Result of :meth:`LeaseSchedule.due`."""

    renew: dict[float, list[Hashable]] = field(default_factory=dict)  # lease seconds -> keys
    exhausted: list[Hashable] = field(default_factory=list)  # reached max_lease: no more renewals
    next_in: float | None = None  # seconds until the next check is needed (None: nothing tracked)


class LeaseSchedule:
    """Deadlines of unsettled messages; pure (``now`` is always passed in).

    ``track(key, now)`` when a message's START was written, ``renewed(key, now,
    lease)`` after an explicit renew, ``forget(key)`` when it is settled.
    """

    def __init__(self, lease: float, max_lease: float, margin: float) -> None:
        if lease <= 0:
            raise ValueError("lease must be > 0")
        self.lease = lease
        self.max_lease = max_lease
        self.margin = min(margin, lease / 2.0)
        self._entries: dict[Hashable, list[float]] = {}  # key -> [started, deadline]
        self._heap: list[tuple[float, int, Hashable]] = []  # (renew_at, seq, key); stale entries skipped
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def deadline(self, key: Hashable) -> float | None:
        e = self._entries.get(key)
        return e[1] if e else None

    def _push(self, key: Hashable, deadline: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (deadline - self.margin, self._seq, key))

    def track(self, key: Hashable, now: float, lease: float | None = None) -> None:
        deadline = now + (lease or self.lease)
        self._entries[key] = [now, deadline]
        self._push(key, deadline)

    def renewed(self, key: Hashable, now: float, lease: float | None = None) -> None:
        e = self._entries.get(key)
        if e is None:
            return
        e[1] = now + (lease or self.lease)
        self._push(key, e[1])

    def forget(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def due(self, now: float) -> Due:
        """Renewals due at ``now``. Each returned key is treated as renewed at ``now``."""
        out = Due()
        heap = self._heap
        later: list[tuple[Hashable, float]] = []  # pushed after the loop: each entry is looked at once per call
        while heap and heap[0][0] <= now:
            renew_at, _, key = heapq.heappop(heap)
            e = self._entries.get(key)
            if e is None or abs((e[1] - self.margin) - renew_at) > 1e-9:
                continue  # settled, or superseded by a later deadline
            started, deadline = e
            budget_end = started + self.max_lease
            # 1 ms tolerance: leases are whole milliseconds on the wire.
            if deadline >= budget_end - 1e-3 or now >= budget_end:
                del self._entries[key]
                out.exhausted.append(key)
                continue
            lease = min(self.lease, budget_end - now)
            # Round to ms like the wire format does, so equal leases coalesce.
            lease = max(0.001, round(lease, 3))
            e[1] = now + lease
            out.renew.setdefault(lease, []).append(key)
            later.append((key, e[1]))
        for key, deadline in later:
            self._push(key, deadline)
        while heap and heap[0][2] not in self._entries:
            heapq.heappop(heap)
        if heap:
            out.next_in = max(0.0, heap[0][0] - now)
        return out


class LeaseKeeper:
    """Background thread running a :class:`LeaseSchedule` under ``lock``.

    ``on_renew(lease_seconds, keys)`` and ``on_exhausted(keys)`` are called
    with ``lock`` held and must not block.
    """

    def __init__(
        self,
        schedule: LeaseSchedule,
        lock: threading.Lock,
        on_renew: Callable[[float, list[Hashable]], None],
        on_exhausted: Callable[[list[Hashable]], None],
        max_sleep: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.schedule = schedule
        self._lock = lock
        self._on_renew = on_renew
        self._on_exhausted = on_exhausted
        self._max_sleep = max_sleep
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kmq-lease-keeper", daemon=True)

    def start(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                due = self.schedule.due(self._clock())
                for lease, keys in due.renew.items():
                    self._on_renew(lease, keys)
                if due.exhausted:
                    self._on_exhausted(due.exhausted)
            wait = self._max_sleep if due.next_in is None else min(self._max_sleep, due.next_in)
            self._wake.wait(wait)
            self._wake.clear()
