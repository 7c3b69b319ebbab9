"""One markers partition the tracker owns, and its per-partition gauges.

:class:`OwnedPartition` is what the service (:mod:`tracker.service`) keeps per
assigned partition beside its pure :class:`~kmq.core.lease_state.PartitionState`:
where catch-up stands, the last commit, when it was last served. Its gauges'
label children are made once and kept, so publishing a partition costs a few
``set`` calls, not a label look-up each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable

from kmq.client import Partition
from kmq.config import QueueConfig
from kmq.core.lease_state import PartitionState
from kmq.core.redelivery_plan import retry_delay_s
from kmq.core.retention import retention_used
from kmq.telemetry.metrics import TrackerMetrics

__all__ = ["OwnedPartition", "partition_names", "publish_gauges"]

log = logging.getLogger(__name__)

# Share of the markers retention an open START may use before the tracker warns.
_RETENTION_WARN = 0.5


@dataclass
class OwnedPartition:
    """One assigned markers partition."""

    queue: QueueConfig
    tp: Partition  # (markers topic, partition)
    state: PartitionState
    target: int | None = None  # high-water mark seen at assignment
    target_ms: int = 0  # wall-clock time just before ``target`` was asked for
    # Every marker appended before this wall-clock time (ms) has been applied: a lease is judged
    # over only up to it, never on an END or RENEW still unread (0: nothing known yet).
    read_through_ms: int = 0
    # (asked at ms, log end then): once the position reaches that end, read_through_ms = asked at.
    mark: tuple[int, int] | None = None
    recheck_ms: int = 0  # a look-up failed: ask again no sooner than this (ms)
    lookup_failures: int = 0  # look-ups of its end in a row that got no answer (its own backoff)
    # After the broker was unreachable from held_from_ms on: leases due since then are judged only on
    # a read-through time of hold_until_ms or later (the markers their consumers retry once the broker
    # is back are read first). 0, 0: no hold.
    held_from_ms: int = 0
    hold_until_ms: int = 0
    caught_up: bool = False
    # At its log end after the last fetch that returned markers of it (and nothing read since says
    # otherwise): markers read next were written after that fetch was sent (the service's floor, see
    # kmq.core.marker_clock). False while it replays or is behind.
    at_end: bool = False
    # Re-read after a membership doubt (tracker.membership): redelivery waits until the group accepts
    # a commit for it, which proves this member still owns it (see CatchUp.update).
    doubted: bool = False
    committed: int | None = None
    bad_logged: bool = False
    # (offset, wire version) of a marker of a newer version it cannot read: nothing after it is
    # applied until a tracker that reads it takes over (tracker.upgrades).
    held: tuple[int, int] | None = None
    newer_seen: set[int] = field(default_factory=set)  # newer wire versions read by their v1 fields (logged)
    positioned: bool = False  # sought to the committed offset after assignment
    resume_from: int | None = None  # committed offset sought to; checked against the first record read
    retention_warned: bool = False
    served: float = 0.0  # monotonic time its due messages were last handed to the redeliverer
    gauges: tuple | None = None  # its label children of the per-partition gauges (made at the first publish)

    @property
    def topic(self) -> str:
        return self.tp[0]

    # ---------------------------------------------------------- read-through (see Tracker._read_through)
    def wants_end(self, now_ms: int, step_offsets: int) -> bool:
        """Whether to look up the log end: something is due, the read-through time is behind now
        (once the position passed the last mark), no look-up failed a moment ago, and fewer than
        ``step_offsets`` (what one step hands out) are due by the read-through time known. With a
        step's worth due before it (a backlog), a look-up would change nothing the step hands out
        (earliest due first) and only hold it up by a broker round trip."""
        if self.mark is not None and self.state.position is not None and self.state.position >= self.mark[1]:
            self.read_through_ms, self.mark = max(self.read_through_ms, self.mark[0]), None
        nd = self.state.next_due_ms()
        return (self.caught_up and nd is not None and nd <= now_ms and self.read_through_ms < now_ms
                and self.mark is None and self.recheck_ms <= now_ms
                and not self.state.due_at_least(self.horizon(now_ms), step_offsets))

    def lookup_failed(self, now_ms: int) -> float:
        """A look-up of its end (catch-up target or read-through mark) got no answer: ask again after
        its own backoff, 0.5 s doubling to 30 s (:func:`~kmq.core.redelivery_plan.retry_delay_s`), so
        a partition whose leader does not answer costs the other partitions' look-ups nothing.
        Returns the delay in seconds."""
        delay = retry_delay_s(self.lookup_failures)
        self.lookup_failures += 1
        self.recheck_ms = now_ms + int(delay * 1000)
        return delay

    def hold(self, held_from_ms: int, hold_until_ms: int) -> None:
        """The broker was unreachable from ``held_from_ms`` on and is back: leases due since then
        wait for a read-through time of ``hold_until_ms`` (see :meth:`horizon`)."""
        self.held_from_ms, self.hold_until_ms = held_from_ms, hold_until_ms

    def clock_moved(self, by_ms: int) -> None:
        """The tracker's clock jumped by ``by_ms`` (negative: back) and the partition is re-read: its
        read-through time no longer vouches for anything (it must be looked up again on the new
        clock), and a retry backoff or an outage hold keeps its length on the new clock."""
        self.read_through_ms, self.mark = 0, None
        if self.recheck_ms:
            self.recheck_ms += by_ms
        if self.hold_until_ms:
            self.held_from_ms, self.hold_until_ms = self.held_from_ms + by_ms, self.hold_until_ms + by_ms

    def end_read(self, asked_ms: int, end: int) -> None:
        """The log end was ``end`` when looked up at ``asked_ms``."""
        pos = self.state.position
        if pos is not None and pos >= end:
            self.read_through_ms = asked_ms
        else:
            self.mark = (asked_ms, end)

    def horizon(self, now_ms: int) -> int:
        """The latest due time whose messages may be judged now."""
        if self.read_through_ms < self.hold_until_ms:  # held: only what was due before the broker went away
            return min(now_ms, self.read_through_ms, self.held_from_ms)
        return min(now_ms, self.read_through_ms)

    def next_visit_ms(self, now_ms: int, tick_ms: int) -> int | None:
        """When the service looks at this partition again: its next due time, or a tick later
        while it is behind its markers (markers applied touch it sooner anyway), or the end of a
        hold for what is due within it."""
        nd = self.state.next_due_ms()
        if nd is not None and self.read_through_ms < self.hold_until_ms and nd > self.held_from_ms:
            return max(nd, self.hold_until_ms, now_ms + tick_ms)
        if nd is not None and nd > self.read_through_ms and (self.mark is not None or self.recheck_ms > nd):
            return max(nd, self.recheck_ms, now_ms + tick_ms)
        return nd

    @property
    def partition(self) -> int:
        return self.tp[1]


def publish_gauges(owned: OwnedPartition, metrics: TrackerMetrics, highwater: Callable[[str, int], int | None],
                   now_ms: int) -> bool:
    """Set ``owned``'s gauges from its state (``highwater``: the markers consumer's mark of a
    partition); warn once when an open START nears the markers retention. Returns whether it has
    messages in flight (then its age and retention use keep changing)."""
    m = metrics
    if owned.gauges is None:
        labels = (owned.queue.label, str(owned.partition))
        owned.gauges = tuple(g.labels(*labels) for g in (m.in_flight, m.oldest_in_flight_seconds, m.failing_offsets,
                                                         m.retention_used_ratio, m.marker_lag))
    in_flight, oldest, failing, retention, lag = owned.gauges
    state = owned.state
    in_flight.set(state.in_flight)
    oldest.set(state.oldest_age_s(now_ms))
    failing.set(state.failing)
    used = retention_used(state.oldest_started_ms(), now_ms, int(owned.queue.markers_retention * 1000))
    retention.set(used)
    if used >= _RETENTION_WARN and not owned.retention_warned:
        owned.retention_warned = True
        log.warning("%s[%d]: an open START has used %.0f%% of the markers retention (START marker offset %s); "
                    "if it is not closed before the retention (%gh: queues[].markers_retention, default "
                    "topics.markers_retention) deletes it, its messages are lost. See docs/operations.md "
                    "(KmqOpenStartNearRetention)", owned.topic, owned.partition, used * 100,
                    state.committable_offset(), owned.queue.markers_retention / 3600)
    elif used < _RETENTION_WARN:
        owned.retention_warned = False
    hw = highwater(owned.topic, owned.partition)
    pos = state.position
    if hw is not None and pos is not None:
        lag.set(max(0, hw - pos))
    return state.in_flight > 0


def partition_names(tps: Iterable[Partition], most: int = 10) -> str:
    """``topic[partition]`` of each, in order; past ``most`` the rest are counted, not named (a
    tracker given 10,000 partitions would write them all into one line)."""
    tps = sorted(tps)
    named = ", ".join(f"{t}[{p}]" for t, p in tps[:most])
    return named + (f" and {len(tps) - most} more" if len(tps) > most else "")
