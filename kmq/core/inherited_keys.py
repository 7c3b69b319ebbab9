"""What a new owner of a queue partition inherits with ``consumer.ordering: key``: the keys whose
earlier messages are still unsettled below the offset it starts at, and when each is released.

Pure: no Kafka import, no clock. The consumer's edge (:mod:`kmq.consumer.key_recovery`) reads,
for queue partition p, the markers of markers partition p from the tracker group's committed
offset (the oldest START that still had open offsets when the tracker committed: every offset
unsettled now was STARTed at or after it) and feeds them to a :class:`MarkerFold`; then it reads
the queue records from :meth:`MarkerFold.lowest_unsettled` (or the start offset) on, into the
backlog, and asks :func:`inherit` which keys wait for which origins. The contract is in docs/protocol.md
("Per-key ordering", "Across a change of owner").

A delivery ``d`` below the start offset (the original or an earlier copy of origin ``o``, its
first delivery) leaves origin ``o`` *pending* when ``d`` is the latest delivery of ``o`` below
the start offset and ``d`` is

* open (STARTed, neither ENDed nor CLOSED, not REJECTed): its owner still has it, or it died and
  the tracker will copy it; or
* CLOSED as redelivered: its copy was appended at or after the start offset, so the new owner
  fetches it itself (after, maybe, later messages of its key).

A copy found in the backlog (at or after the start offset) of an origin below it leaves that
origin pending too, even when its markers are older than the window read.

A pending origin holds its key until a copy of it is handed out by the new owner, until the
markers show its delivery settled for good (END, REJECT, CLOSED other than redelivered:
:meth:`MarkerFold.settled`), or until the bounded wait ends.

Offsets at or above the start offset are the new owner's own: it fetches them in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from kmq.core.lease_state import PartitionState
from kmq.core.markers import Closed, Marker, Outcome, Reject, Start
from kmq.core.ranges import RangeSet

__all__ = ["MarkerFold", "QueueRecord", "Inheritance", "inherit", "RecoveryBudget", "DEFAULT_BUDGET"]


@dataclass(frozen=True, slots=True)
class RecoveryBudget:
    """What one recovery of a partition may cost before it is given up (the partition's keys then
    go on without what the earlier owner left unsettled: logged and counted)."""

    markers: int = 200_000  # markers records read from the tracker's committed offset
    #: queue records read from the lowest unsettled offset below the start: all of those below it
    #: (else given up), then the backlog after it as far as the budget goes (copies further on are
    #: not looked for)
    queue: int = 100_000
    seconds: float = 30.0  # wall time, reads included


DEFAULT_BUDGET = RecoveryBudget()


class MarkerFold:
    """The markers of one partition, folded: open offsets (the tracker's own
    :class:`~kmq.core.lease_state.PartitionState`), offsets closed as redelivered, offsets
    rejected. Memory: one segment per open run, one range per run of the two sets."""

    def __init__(self, position: int | None = None) -> None:
        # Backoff and delivery limit do not matter here: only which offsets are open is asked.
        self._open = PartitionState(lambda count: 0.0, 1, position)
        self._copied = RangeSet()
        self._rejected = RangeSet()
        self.records = 0  # marker records applied or skipped
        self.bad = 0  # records that were not markers of this partition

    @property
    def position(self) -> int | None:
        """The next marker offset to read (None: the log start)."""
        return self._open.position

    def apply(self, marker: Marker, marker_offset: int, ts_ms: int) -> None:
        """Apply one decoded marker (in marker-offset order)."""
        self.records += 1
        if isinstance(marker, Start):
            for r in marker.ranges:  # a new delivery of these offsets: what was said of them is past
                self._copied.remove(r.first, r.count)
                self._rejected.remove(r.first, r.count)
        elif isinstance(marker, Reject):
            for r in self._open.open_within((r.first, r.count) for r in marker.ranges):
                self._rejected.add(r.first, r.count)
        elif isinstance(marker, Closed):
            for r in marker.ranges:
                self._rejected.remove(r.first, r.count)
                if marker.outcome is Outcome.REDELIVERED:
                    self._copied.add(r.first, r.count)
        self._open.apply(marker, marker_offset, ts_ms)

    def skip(self, marker_offset: int) -> None:
        """A record that is not a marker of this partition (counted, passed)."""
        self.records += 1
        self.bad += 1
        self._open.skip(marker_offset)

    def pending(self, offset: int) -> bool:
        """Whether the delivery at ``offset`` is unsettled: open and not rejected, or copied."""
        return (self._open.is_open(offset) and offset not in self._rejected) or offset in self._copied

    def settled(self, offset: int) -> bool:
        """Whether the delivery at ``offset`` is settled for good (the opposite of :meth:`pending`)."""
        return not self.pending(offset)

    def lowest_unsettled(self, start: int) -> int | None:
        """The lowest open or copied offset below ``start`` (None: nothing below it is unsettled):
        where the read of the queue records starts."""
        lows = [r.first for r in self._open.open_ranges()[:1]] + [x for x in (self._copied.min(),) if x is not None]
        first = min(lows, default=None)
        return None if first is None or first >= start else first


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """What :func:`inherit` needs of a queue record below the start offset: its key and the offset
    of its first delivery in this partition (``origin``; its own offset unless it is a copy)."""

    offset: int
    key: bytes | None
    origin: int


@dataclass(frozen=True)
class Inheritance:
    """Per key, the origins it waits for (ascending); per watched delivery offset, its
    ``(key, origin)`` (the markers that settle it release that origin)."""

    keys: dict[bytes, list[int]] = field(default_factory=dict)
    watch: dict[int, tuple[bytes, int]] = field(default_factory=dict)

    @property
    def origins(self) -> int:
        return sum(len(o) for o in self.keys.values())


def inherit(fold: MarkerFold, records: Iterable[QueueRecord], start: int) -> Inheritance:
    """The keys the owner starting at ``start`` inherits blocked, from the folded markers and the
    queue records read from :meth:`MarkerFold.lowest_unsettled` (or ``start``) on, in any order.
    A record missing below ``start`` is skipped (deleted: the tracker closes it as missing). A copy
    at or after ``start`` of a message below it (its origin) blocks that origin too, whatever the
    markers say: it was appended after the earlier owner's last offset and nobody has handled it
    yet (its CLOSED marker may be older than the tracker's committed offset)."""
    latest: dict[int, QueueRecord] = {}  # origin -> its latest delivery below start
    backlog: list[QueueRecord] = []  # copies at or after start of origins below it
    for rec in records:
        if rec.key is None:  # a null key holds nothing back
            continue
        if rec.offset >= start:
            if rec.origin < start:
                backlog.append(rec)
            continue
        seen = latest.get(rec.origin)
        if seen is None or seen.offset < rec.offset:
            latest[rec.origin] = rec
    pending: dict[bytes, set[int]] = {}
    watch: dict[int, tuple[bytes, int]] = {}
    for origin, rec in latest.items():
        if fold.pending(rec.offset):
            assert rec.key is not None  # null keys were skipped above
            pending.setdefault(rec.key, set()).add(origin)
            watch[rec.offset] = (rec.key, origin)
    for rec in backlog:
        pending.setdefault(rec.key, set()).add(rec.origin)  # type: ignore[arg-type]
    return Inheritance({key: sorted(origins) for key, origins in pending.items()}, watch)
