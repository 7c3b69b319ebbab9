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
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping

__all__ = ["LeaseSchedule", "Due", "LeaseKeeper", "default_margin", "SETTLED_WITHIN"]

#: Seconds after which what a consumer handed over or user code took is first looked at, to keep
#: only the messages still unsettled: a busy consumer settles most of them by then, and each
#: settled message held longer stays alive for the cyclic collector to visit (held 0.1-0.5 s,
#: 40,000-156,000 of them at 300,000 msg/s took a third of KmqConsumer's CPU; kmq bench consumer).
SETTLED_WITHIN = 0.01

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


class _Group:
    """Keys handed over or renewed together: one heap entry, one START time, one deadline.

    ``live`` counts the keys still in the group (not settled, not renewed into another); at 0
    the group lets go of its keys at once. The consumer's keys are its messages: a group holding
    them until its renewal time came up kept every message of the last half second alive, and
    the cyclic garbage collector then traversed them again and again (a third of
    ``KmqConsumer``'s CPU on confluent-kafka, kmq bench consumer)."""

    __slots__ = ("started", "deadline", "keys", "live")

    def __init__(self, started: float, deadline: float, keys: list[Hashable]) -> None:
        self.started = started
        self.deadline = deadline
        self.keys = keys
        self.live = len(keys)

    def left(self) -> None:
        """One key left the group (settled, renewed into another group, or exhausted)."""
        self.live -= 1
        if not self.live:
            self.keys = []


class LeaseSchedule:
    """Deadlines of unsettled messages; pure (``now`` is always passed in).

    ``track(key, now)`` (or ``track_many(keys, now)`` for a batch) when a message's
    START was written, ``renewed(key, now, lease)`` after an explicit renew,
    ``forget(key)`` when it is settled. A key is any hashable; the consumer uses its
    messages themselves (no key object is built per message).

    Keys that share a START time and a deadline share one group (a batch handed over
    together, the messages renewed together) and one heap entry: tracking a batch is one
    dict update at C speed and settling a message one dict removal, so automatic renewal
    costs the hot path next to nothing. A group whose keys were all settled is dropped
    when it comes up.

    With ``unsettled`` (a function returning the keys of a batch not settled yet), a batch can
    be tracked *soon* (:meth:`track_soon`): it is looked at ``grace`` seconds later
    (:meth:`look`), or before anything else reads the schedule, and only its keys unsettled
    then are tracked. A busy consumer settles most messages within that time, so they never
    cost an entry or a removal. A key tracked soon and settled meanwhile needs no
    :meth:`forget`; one that stops being renewed unsettled needs :meth:`untrack`. A batch tracked
    soon ``until_taken`` waits for its grace until :meth:`taken` names it (user code took it: a
    batch waiting to be taken settles nothing meanwhile). :meth:`due` looks at every batch
    tracked soon, whether its grace is over or not: a renewal is never missed for a look not made.
    """

    def __init__(self, lease: float, max_lease: float, margin: float,
                 unsettled: Callable[[list], list] | None = None, grace: float = SETTLED_WITHIN) -> None:
        if lease <= 0:
            raise ValueError("lease must be > 0")
        self.lease = lease
        self.max_lease = max_lease
        self.margin = min(margin, lease / 2.0)
        self.grace = grace
        self._unsettled = unsettled
        self._entries: dict[Hashable, _Group] = {}  # key -> the group it is in now
        #: The tracked keys (read-only; a caller may skip :meth:`forget` while it is empty). Keys
        #: of :meth:`track_soon` batches not looked at yet are not in it: settled before their
        #: look, they are never tracked.
        self.tracked: Mapping[Hashable, Any] = self._entries
        # (renew_at, seq, group); a key whose entry points to another group (renewed since) or to
        # none (settled) is skipped when its old group comes up.
        self._heap: list[tuple[float, int, _Group]] = []
        self._seq = 0
        #: Batches tracked soon, not looked at yet: (look at, started, deadline, keys), in look order.
        self._soon: deque[tuple[float, float, float, list]] = deque()
        #: Batches tracked soon until taken, not taken yet: id(keys) -> (started, deadline, keys).
        self._untaken: dict[int, tuple[float, float, list]] = {}

    def __len__(self) -> int:
        self._look_all()
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        self._look_all()
        return key in self._entries

    def deadline(self, key: Hashable) -> float | None:
        self._look_all()
        g = self._entries.get(key)
        return g.deadline if g is not None else None

    def _push(self, started: float, deadline: float, keys: list[Hashable]) -> _Group:
        self._seq += 1
        group = _Group(started, deadline, keys)
        heapq.heappush(self._heap, (deadline - self.margin, self._seq, group))
        return group

    def track(self, key: Hashable, now: float, lease: float | None = None) -> None:
        self.track_many([key], now, lease)

    def track_many(self, keys: list[Hashable], now: float, lease: float | None = None) -> None:
        """Track ``keys`` (one batch), all started at ``now``: one group for all of them."""
        if keys:
            self._track(keys, now, now + (lease or self.lease))

    def _track(self, keys: list[Hashable], started: float, deadline: float) -> None:
        fresh = dict.fromkeys(keys)  # each key once: ``live`` counts distinct keys
        entries = self._entries
        if not entries.keys().isdisjoint(fresh):  # tracked again: it leaves its old group
            for key in fresh:
                old = entries.get(key)
                if old is not None:
                    old.left()
        group = self._push(started, deadline, list(fresh))
        entries.update(dict.fromkeys(group.keys, group))

    def track_soon(self, keys: list[Hashable], started: float, now: float, lease: float | None = None,
                   until_taken: bool = False) -> None:
        """Track the keys of ``keys`` (one batch, started at ``started``) still unsettled at the
        look ``grace`` seconds after ``now`` (``until_taken``: after :meth:`taken` names this
        list). The list is kept as it is, not copied. Without ``unsettled`` this is :meth:`track_many`."""
        if not keys:
            return
        deadline = started + (lease or self.lease)
        if self._unsettled is None:
            self._track(keys, started, deadline)
        elif until_taken:
            before = self._untaken.get(id(keys))
            if before is not None:  # the same list again: the earlier one is looked at now
                self._look_at((now, *before))
            self._untaken[id(keys)] = (started, deadline, keys)
        else:
            self._soon.append((now + self.grace, started, deadline, keys))

    def taken(self, batches: list[list], now: float) -> None:
        """User code took (some of) these lists at ``now``: a batch of them tracked soon
        ``until_taken`` is looked at ``grace`` seconds on. Other lists are ignored."""
        untaken = self._untaken
        if not untaken:
            return
        for keys in batches:
            entry = untaken.pop(id(keys), None)
            if entry is not None:
                self._soon.append((now + self.grace, *entry))

    def look(self, now: float) -> None:
        """Track what :meth:`track_soon` got at least ``grace`` seconds before ``now``."""
        soon = self._soon
        while soon and soon[0][0] <= now:
            self._look_at(soon.popleft())

    def _look_all(self) -> None:
        soon = self._soon
        while soon:
            self._look_at(soon.popleft())
        if self._untaken:
            untaken, self._untaken = self._untaken, {}
            for started, deadline, keys in untaken.values():
                self._look_at((0.0, started, deadline, keys))

    def _look_at(self, entry: tuple[float, float, float, list]) -> None:
        _at, started, deadline, keys = entry
        live = self._unsettled(keys)  # type: ignore[misc]
        if live:
            self._track(live, started, deadline)

    def untrack(self, key: Hashable) -> None:
        """Stop renewing ``key`` though it is not settled (its lease ended in user code)."""
        self._look_all()
        self.forget(key)

    def renewed(self, key: Hashable, now: float, lease: float | None = None) -> None:
        self._look_all()
        g = self._entries.get(key)
        if g is None:
            return
        g.left()
        self._entries[key] = self._push(g.started, now + (lease or self.lease), [key])

    def forget(self, key: Hashable) -> None:
        g = self._entries.pop(key, None)
        if g is not None:  # g.left() inlined: once per settled message
            g.live -= 1
            if not g.live:
                g.keys = []

    def due(self, now: float) -> Due:
        """Renewals due at ``now``. Each returned key is treated as renewed at ``now``."""
        self._look_all()
        out = Due()
        heap, entries = self._heap, self._entries
        # (started, new deadline) -> keys, grouped after the loop (each group looked at once)
        later: dict[tuple[float, float], list[Hashable]] = {}
        while heap and heap[0][0] <= now:
            group = heapq.heappop(heap)[2]
            if not group.live:
                continue  # every key settled or moved
            budget_end = group.started + self.max_lease
            # 1 ms tolerance: leases are whole milliseconds on the wire.
            exhausted = group.deadline >= budget_end - 1e-3 or now >= budget_end
            lease = max(0.001, round(min(self.lease, budget_end - now), 3))  # ms, like the wire: leases coalesce
            for key in group.keys:
                if entries.get(key) is not group:
                    continue  # settled, or renewed since (in a later group)
                if exhausted:
                    del entries[key]
                    out.exhausted.append(key)
                    continue
                out.renew.setdefault(lease, []).append(key)
                later.setdefault((group.started, now + lease), []).append(key)
        for (started, deadline), keys in later.items():
            group = self._push(started, deadline, keys)
            entries.update(dict.fromkeys(keys, group))
        while heap and not heap[0][2].live:
            heapq.heappop(heap)  # every key settled or moved: drop the group
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
