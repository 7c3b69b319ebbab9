"""Settlement markers Kafka did not acknowledge, resent within a retry budget.

Pure: no Kafka, no threads, time passed in (the writer guards it with a lock).

An END that is not written is not lost data, but it is lost work: the tracker
redelivers the message when its lease ends and it is processed again. The
producer gives up on a record after its delivery timeout (seconds), far
shorter than a broker restart or a leader move can take. So the writer hands
every END/RENEW/NACK/REJECT whose write failed to a :class:`MarkerRetry`,
which keeps it for ``consumer.marker_retry_budget`` seconds counted from the
first failure and gives it back for resending at most once per ``interval``
(no busy loop while the broker is away).

Memory stays bounded while an outage lasts: what accumulates is merged per
(partition, type, argument) into offset ranges (:class:`~kmq.core.ranges.RangeSet`),
so a thousand failed ENDs of consecutive offsets are one range; beyond
``max_ranges`` ranges in all, the oldest entries are given up first.
START markers never come here: their failure is reported to the caller,
who must not process the batch (docs/protocol.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kmq.core.markers import End, Marker, MarkerType, Nack, Reject, Renew
from kmq.core.ranges import RangeSet

__all__ = ["MarkerRetry", "Pending", "describe"]

#: (queue partition, marker, time of its first failed write)
Pending = tuple[int, Marker, float]

_WIRE_MAX_RANGES = 0xFFFF  # u16 range count of one marker
# RENEW first, as AckBuffer.drain orders them: an END after a RENEW of the same offset leaves it acked.
_ORDER = {MarkerType.RENEW: 0, MarkerType.END: 1, MarkerType.NACK: 2, MarkerType.REJECT: 3}


def _arg(marker: Marker) -> Any:
    if isinstance(marker, Renew):
        return marker.lease_ms
    if isinstance(marker, Nack):
        return (marker.delay_ms, marker.counted)
    if isinstance(marker, Reject):
        return marker.reason
    if isinstance(marker, End):
        return None
    raise TypeError(f"{type(marker).__name__} markers are not retried here")


def _build(kind: MarkerType, arg: Any, ranges: tuple) -> Marker:
    if kind is MarkerType.END:
        return End(ranges)
    if kind is MarkerType.RENEW:
        return Renew(ranges, arg)
    if kind is MarkerType.NACK:
        return Nack(ranges, *arg)
    return Reject(ranges, arg)


def describe(pending: list[Pending]) -> str:
    """``"END 12 msgs [0] 5..16; NACK 1 msg [2] 7..7"`` for log lines (first few only)."""
    parts = []
    for p, m, _ in pending[:5]:
        n = m.offset_count()
        parts.append(f"{m.TYPE.name} {n} msg{'s' if n != 1 else ''} [{p}] {m.ranges[0].first}..{m.ranges[-1].last}")
    if len(pending) > 5:
        parts.append(f"and {len(pending) - 5} more marker(s)")
    return "; ".join(parts)


@dataclass
class _Entry:
    ranges: RangeSet
    since: float


class MarkerRetry:
    """Failed settlement markers waiting to be resent.

    :param budget: seconds a marker is retried, counted from its first failed write.
    :param interval: least seconds between two rounds of resending.
    :param max_ranges: offset ranges kept in all before the oldest entries are given up.
    """

    def __init__(self, budget: float, interval: float = 1.0, max_ranges: int = 100_000) -> None:
        if budget < 0 or interval < 0 or max_ranges < 1:
            raise ValueError("budget and interval must be >= 0 and max_ranges >= 1")
        self.budget = budget
        self.interval = interval
        self.max_ranges = max_ranges
        self._entries: dict[tuple[int, MarkerType, Any], _Entry] = {}  # (partition, type, its argument)
        self._next_at = 0.0

    def __len__(self) -> int:
        """Messages (offsets) waiting to be resent."""
        return sum(len(e.ranges) for e in self._entries.values())

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def range_count(self) -> int:
        return sum(e.ranges.range_count for e in self._entries.values())

    def oldest(self) -> float | None:
        """First-failure time of the oldest waiting marker (None when empty)."""
        return min((e.since for e in self._entries.values()), default=None)

    def add(self, partition: int, marker: Marker, since: float) -> list[Pending]:
        """Keep ``marker`` (first failed at ``since``) for resending. Returns what had to
        be given up to stay within ``max_ranges`` (oldest first; usually nothing)."""
        key = (partition, marker.TYPE, _arg(marker))
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(RangeSet(), since)
        entry.since = min(entry.since, since)
        for r in marker.ranges:
            entry.ranges.add(r.first, r.count)
        given_up: list[Pending] = []
        total = self.range_count
        while total > self.max_ranges and self._entries:
            oldest_key = min(self._entries, key=lambda k: self._entries[k].since)
            old = self._entries.pop(oldest_key)
            total -= old.ranges.range_count
            given_up.extend(self._markers(oldest_key, old))
        return given_up

    def take(self, now: float, force: bool = False) -> tuple[list[Pending], list[Pending]]:
        """``(resend, given_up)``: everything within the budget to send again now (and
        forgotten here: a write that fails again is added back with its first-failure
        time), and everything past the budget. Empty until ``interval`` has passed
        since the last round, unless ``force``."""
        if not self._entries or (not force and now < self._next_at):
            return [], []
        self._next_at = now + self.interval
        resend: list[Pending] = []
        given_up: list[Pending] = []
        for key in sorted(self._entries, key=lambda k: (k[0], _ORDER[k[1]])):
            entry = self._entries[key]
            (given_up if now - entry.since >= self.budget else resend).extend(self._markers(key, entry))
        self._entries.clear()
        return resend, given_up

    def pending(self) -> list[Pending]:
        """Everything waiting, as markers (the store keeps them)."""
        return [m for key, e in self._entries.items() for m in self._markers(key, e)]

    def drain(self) -> list[Pending]:
        """Everything waiting, and forget it (on close)."""
        out = [m for key, e in self._entries.items() for m in self._markers(key, e)]
        self._entries.clear()
        return out

    @staticmethod
    def _markers(key: tuple[int, MarkerType, Any], entry: _Entry) -> list[Pending]:
        partition, kind, arg = key
        ranges = entry.ranges.ranges()
        return [
            (partition, _build(kind, arg, tuple(ranges[i : i + _WIRE_MAX_RANGES])), entry.since)
            for i in range(0, len(ranges), _WIRE_MAX_RANGES)
        ]
