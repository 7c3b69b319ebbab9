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

    ``track(key, now)`` (or ``track_many(keys, now)`` for a batch) when a message's
    START was written, ``renewed(key, now, lease)`` after an explicit renew,
    ``forget(key)`` when it is settled.

    Keys that share a deadline share one heap entry (a batch handed over together,
    the messages renewed together), so tracking and settling a message is a dict
    operation, not a heap push: automatic renewal costs the hot path nothing
    measurable. A group whose keys were all settled is dropped when it comes up.
    """

    def __init__(self, lease: float, max_lease: float, margin: float) -> None:
        if lease <= 0:
            raise ValueError("lease must be > 0")
        self.lease = lease
        self.max_lease = max_lease
        self.margin = min(margin, lease / 2.0)
        self._entries: dict[Hashable, list[float]] = {}  # key -> [started, deadline]
        # (renew_at, seq, keys): keys whose deadline was that when pushed; settled or moved ones are skipped.
        self._heap: list[tuple[float, int, list[Hashable]]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def deadline(self, key: Hashable) -> float | None:
        e = self._entries.get(key)
        return e[1] if e else None

    def _push(self, keys: list[Hashable], deadline: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (deadline - self.margin, self._seq, keys))

    def track(self, key: Hashable, now: float, lease: float | None = None) -> None:
        self.track_many([key], now, lease)

    def track_many(self, keys: list[Hashable], now: float, lease: float | None = None) -> None:
        """Track ``keys`` (one batch), all started at ``now``: one heap entry for all of them."""
        if not keys:
            return
        deadline = now + (lease or self.lease)
        entries = self._entries
        for key in keys:
            entries[key] = [now, deadline]
        self._push(list(keys), deadline)

    def renewed(self, key: Hashable, now: float, lease: float | None = None) -> None:
        e = self._entries.get(key)
        if e is None:
            return
        e[1] = now + (lease or self.lease)
        self._push([key], e[1])

    def forget(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def due(self, now: float) -> Due:
        """Renewals due at ``now``. Each returned key is treated as renewed at ``now``."""
        out = Due()
        heap, entries = self._heap, self._entries
        later: dict[float, list[Hashable]] = {}  # new deadline -> keys, pushed after the loop (looked at once)
        while heap and heap[0][0] <= now:
            renew_at, _, keys = heapq.heappop(heap)
            for key in keys:
                e = entries.get(key)
                if e is None or abs((e[1] - self.margin) - renew_at) > 1e-9:
                    continue  # settled, or superseded by a later deadline
                started, deadline = e
                budget_end = started + self.max_lease
                # 1 ms tolerance: leases are whole milliseconds on the wire.
                if deadline >= budget_end - 1e-3 or now >= budget_end:
                    del entries[key]
                    out.exhausted.append(key)
                    continue
                lease = min(self.lease, budget_end - now)
                # Round to ms like the wire format does, so equal leases coalesce.
                lease = max(0.001, round(lease, 3))
                e[1] = now + lease
                out.renew.setdefault(lease, []).append(key)
                later.setdefault(e[1], []).append(key)
        for deadline, keys in later.items():
            self._push(keys, deadline)
        while heap and not any(k in entries for k in heap[0][2]):  # every key settled: drop the group
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
