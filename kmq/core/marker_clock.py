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

:func:`marker_time` is the record timestamp held between the two. With
clocks that agree every lease is as written (a timestamp a little before the
floor is the producer's: it stamps a record before the broker appends it;
the lease then starts at the floor, a few milliseconds later). A writer's
clock ahead of the tracker's holds no lease past the read time; one behind
cuts no lease short by more than the time between two fetches, within which
a record timestamp cannot be told from the truth (a tick and the fetch wait;
a step slowed by a stuck read, up to the read timeout).

A replayed marker has no floor and may be old: it counts from its record
timestamp plus :data:`SKEW_ALLOWANCE_MS`, at most its read time. A writer up
to that far behind does not cut a lease short on a restart either, and a
restart lengthens a replayed lease by at most the allowance (by the catch-up
time when that is shorter), however often the tracker restarts: the bound is
counted from the record, not from the read.

:class:`SkewWindow` keeps, per owner, the least ``read time - record
timestamp`` of the STARTs read at the log end: how far the owner's clock is
behind the tracker's (negative: ahead), plus the least read latency.
"""

from __future__ import annotations

__all__ = ["marker_time", "SKEW_ALLOWANCE_MS", "SkewWindow"]

#: How far a replayed marker's lease may start after its record timestamp (ms): the writer-behind
#: skew a restart tolerates, and the most a restart lengthens a lease by.
SKEW_ALLOWANCE_MS = 60_000


def marker_time(ts_ms: int, read_ms: int, floor_ms: int | None) -> int:
    """When a marker with record timestamp ``ts_ms``, read at ``read_ms``, counts as written, on
    the reader's clock (see the module docstring); ``floor_ms``: written after it, or None."""
    if floor_ms is not None:
        return min(max(ts_ms, floor_ms), read_ms)
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
