"""When a marker counts as written, on the tracker's own clock; clock skew per owner.

A marker's record timestamp is the clock of the host that wrote it (CreateTime:
a worker; LogAppendTime: the broker), while the tracker judges every lease
against its own clock. A lease counted from the record timestamp would be cut
short by a writer whose clock is behind the tracker's (copies, and dead
letters as ``timeout``, of messages whose handlers acked in time) and held
longer by one ahead (a year ahead: a year). So leases are judged on one
clock, the tracker's, and a record timestamp counts only where the tracker
can check it:

* ``read_ms``: when the tracker read the marker. It was written before then.
* ``floor_ms``: when the tracker sent the fetch before the one that returned
  the marker, if it had read the partition to its log end with that fetch:
  the marker was written after it. ``None`` when unknown: the marker is
  replayed (catch-up after an assignment or a restart) or the tracker was
  behind the partition.

:func:`marker_time` of a marker read at the log end is its record timestamp
when that lies between the floor and the read time, else the read time. With
clocks that agree every lease is as written. A writer's clock ahead of the
tracker's holds no lease past read time + lease. One behind (or the tracker's
own jumped ahead: every writer then reads behind) cuts a lease short by no
more than its own lag, and only while that lag is shorter than the time
between two fetches: a record timestamp below the floor counts from the read,
since any earlier time could end the lease before it ended on the writer, by
as much as that gap, which a step held up by a stuck look-up stretches to the
read timeout, past any lease. A timestamp a little before the floor (the
producer stamps a record before the broker appends it) counts from the read
as well: that lease lasts up to one fetch gap longer than written.

A replayed marker has no floor and may be old: it counts from its record
timestamp plus :data:`SKEW_ALLOWANCE_MS`, at most its read time. A writer up
to that far behind does not cut a lease short on a restart either, and a
restart lengthens a replayed lease by at most the allowance (by the catch-up
time when that is shorter), however often the tracker restarts: the bound is
counted from the record, not from the read.

:class:`SkewWindow` keeps, per owner, the least ``read time - record
timestamp`` of the STARTs read at the log end: how far the owner's clock is
behind the tracker's (negative: ahead), plus the least read latency.

:class:`ClockWatch` notices the tracker's own clock jumping: between two looks
it moved more or less than the monotonic clock did, by more than
:data:`CLOCK_JUMP_MS`. Every time the tracker keeps is on that clock (deadlines,
the time up to which it has read its markers, holds after an outage). Set back,
they all lie ahead of the new now: "read through up to T" then vouches for
markers written after T on the new clock that were never read, so a lease
could be judged over without the END or RENEW written for it. The service
answers a jump back as it answers a restart: every partition re-read from its
committed offset, caught up to a fresh log end, before any lease is judged.
"""

from __future__ import annotations

__all__ = ["marker_time", "SKEW_ALLOWANCE_MS", "SkewWindow", "ClockWatch", "CLOCK_JUMP_MS"]

#: How far a replayed marker's lease may start after its record timestamp (ms): the writer-behind
#: skew a restart tolerates, and the most a restart lengthens a lease by.
SKEW_ALLOWANCE_MS = 60_000
#: How much more or less than the monotonic clock the tracker's clock may move between two looks
#: (a step apart) before it counts as a jump (ms): far more than NTP slews it meanwhile (at most
#: 0.5 ms a second); a jump back within it errs as much as a fetch that took a second.
CLOCK_JUMP_MS = 1_000


def marker_time(ts_ms: int, read_ms: int, floor_ms: int | None) -> int:
    """When a marker with record timestamp ``ts_ms``, read at ``read_ms``, counts as written, on
    the reader's clock (see the module docstring); ``floor_ms``: written after it, or None."""
    if floor_ms is not None:
        # A record time below the floor is a writer's clock behind (or the tracker's jumped ahead):
        # counted from the floor, its lease lost up to the fetch gap, which a stuck step stretches.
        return ts_ms if floor_ms <= ts_ms <= read_ms else read_ms
    return min(ts_ms + SKEW_ALLOWANCE_MS, read_ms)


class SkewWindow:
    """The least ``read_ms - ts_ms`` per key (queue, owner) since the last :meth:`take`."""

    __slots__ = ("_least",)

    def __init__(self) -> None:
        self._least: dict[tuple[str, str], int] = {}

    def observe(self, key: tuple[str, str], read_ms: int, ts_ms: int) -> None:
        skew = read_ms - ts_ms
        least = self._least.get(key)
        if least is None or skew < least:
            self._least[key] = skew

    def take(self) -> dict[tuple[str, str], int]:
        """What was observed since the last call (ms per key); starts a new window."""
        out, self._least = self._least, {}
        return out


class ClockWatch:
    """Jumps of a wall clock, told by a monotonic clock read at the same moments (see the module
    docstring). Pure: the caller reads both clocks."""

    __slots__ = ("bound_ms", "_last")

    def __init__(self, bound_ms: int = CLOCK_JUMP_MS) -> None:
        self.bound_ms = bound_ms
        self._last: tuple[int, int] | None = None

    def observe(self, wall_ms: int, mono_ms: int) -> int:
        """How far the wall clock jumped since the last look (ms; negative: back), 0 within the bound."""
        last, self._last = self._last, (wall_ms, mono_ms)
        if last is None:
            return 0
        moved = (wall_ms - last[0]) - (mono_ms - last[1])
        return moved if abs(moved) > self.bound_ms else 0
