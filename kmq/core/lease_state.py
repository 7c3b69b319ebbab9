"""Lease state of one markers partition: the tracker's decisions, pure.

No Kafka, no clock: every method that needs the time takes ``now_ms`` and
every marker is applied with its own marker offset and record timestamp, so
tests (and the Spark job, and ``kmq status``) drive it with controlled time.
The tracker also passes when it read the marker (and since when the marker
can have been written): a marker's time is then on the tracker's clock
(:func:`kmq.core.marker_clock.marker_time`), so a writer's clock ahead of or
behind the tracker's neither cuts a lease short nor holds it longer.

What it holds, per markers partition (= queue partition):

* **segments**: disjoint runs of open queue offsets that share one lease
  (owning START marker offset, owner, marker time, deadline, due time,
  reason, known delivery count). A START batch of 500 messages is one
  segment; an END in the middle of it splits it. Memory is proportional to
  the number of segments, never to the number of messages.
* a **due index**: a heap of (due time, segment) with lazy deletion; RENEW,
  NACK and backoff push a fresh entry and invalidate the old one by a token.
  The backoff delay queue is the same heap (a deferred segment is simply due
  later).
* **open START offsets** with their open-offset counts, for the commit:
  the committable marker offset is the smallest START that still has open
  offsets, else the position, so a restart replays only what is still open.
* the offsets the tracker itself closed (redelivered, dead-lettered, missing),
  so an END or RENEW for them is counted as a *late ack*.

The service asks :meth:`PartitionState.due`, reads the records, asks
:meth:`PartitionState.plan` per record (delivery count from its header) and
then reports back with :meth:`close`, :meth:`defer`, :meth:`retry` or
:meth:`hold_from` for every offset it was handed.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Iterator

from kmq.core.marker_clock import marker_time
from kmq.core.markers import Closed, End, Marker, Nack, Reject, Renew, Start
from kmq.core.ranges import CLOSED_MEMORY_RANGES, OffsetRange, RangeSet

__all__ = ["PartitionState", "DueItem", "Plan", "Reason", "Action", "dlq_reason", "MarkerEffect"]


class Reason(str, Enum):
    """Why an open segment became due."""

    TIMEOUT = "timeout"  # lease deadline passed
    NACK = "nack"  # consumer asked for redelivery
    RELEASE = "release"  # given back never delivered to user code (NACK "not a delivery"): the count stays
    REJECT = "rejected"  # consumer asked for the DLQ


class Action(str, Enum):
    REDELIVER = "redeliver"
    DEAD_LETTER = "dead_letter"
    WAIT = "wait"  # backoff for this delivery count not over yet


def dlq_reason(reason: Reason) -> str:
    """The ``kmq-dlq-reason`` header value for a segment's reason."""
    return {Reason.TIMEOUT: "timeout", Reason.NACK: "nack-limit", Reason.RELEASE: "nack-limit",
            Reason.REJECT: "rejected"}[reason]


@dataclass(frozen=True, slots=True)
class DueItem:
    """A run of offsets handed to the service for redelivery."""

    ranges: tuple[OffsetRange, ...]
    reason: Reason
    error: str  # REJECT reason text ("" otherwise)
    count: int  # delivery count known from an earlier read, 0 = unknown
    deadline_ms: int  # lease deadline (backoff is counted from it)
    due_ms: int  # when it became due (for the redelivery delay metric)
    start_offset: int  # marker offset of the owning START
    failures: int  # earlier failed attempts

    @property
    def offset_count(self) -> int:
        return sum(r.count for r in self.ranges)


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with one record of a due item."""

    action: Action
    dlq_reason: str | None = None
    until_ms: int | None = None  # for WAIT


@dataclass(frozen=True, slots=True)
class MarkerEffect:
    """What applying one marker did (for metrics)."""

    opened: int = 0
    closed: int = 0
    late: int = 0


_NO_EFFECT = MarkerEffect()


class _Seg:
    """Open offsets ``first .. end-1`` sharing one lease."""

    __slots__ = ("first", "end", "start_moff", "owner", "opened_ms", "deadline_ms", "due_ms",
                 "reason", "error", "count", "taken", "token", "failures")

    def __init__(self, first: int, end: int, start_moff: int, owner: str, opened_ms: int, deadline_ms: int,
                 due_ms: int) -> None:
        self.first = first
        self.end = end
        self.start_moff = start_moff
        self.owner = owner
        self.opened_ms = opened_ms
        self.deadline_ms = deadline_ms
        self.due_ms = due_ms
        self.reason = Reason.TIMEOUT
        self.error = ""
        self.count = 0
        self.taken = False
        self.token = 0  # -1 = removed; bumped whenever due_ms changes
        self.failures = 0

    def split(self, at: int) -> "_Seg":
        """Cut at ``at``: self keeps ``first..at-1``, the returned copy gets ``at..end-1``."""
        right = _Seg(at, self.end, self.start_moff, self.owner, self.opened_ms, self.deadline_ms, self.due_ms)
        right.reason, right.error, right.count = self.reason, self.error, self.count
        right.taken, right.failures = self.taken, self.failures
        self.end = at
        return right


class PartitionState:
    """Open leases of one markers partition. See the module docstring.

    ``backoff(count)`` returns the delay in seconds before redelivering a
    message whose delivery number ``count`` timed out (BackoffConfig.delay);
    ``max_deliveries`` is the delivery count at which a message goes to the
    DLQ instead.
    """

    def __init__(self, backoff: Callable[[int], float], max_deliveries: int, position: int | None = None,
                 max_hold_ms: int | None = None) -> None:
        self._backoff = backoff
        # Longest lease / NACK delay honoured (half the markers retention): a longer one written by a
        # client is cut, so the message is redelivered early instead of outliving its START marker.
        self.max_hold_ms = max_hold_ms
        self._backoff_cache: dict[int, int] = {}
        self.max_deliveries = max_deliveries
        self._firsts: list[int] = []
        self._segs: list[_Seg] = []
        self._heap: list[tuple[int, int, int, _Seg]] = []  # (due_ms, seq, token, seg)
        self._seq = 0
        self._open = 0
        self._start_counts: dict[int, int] = {}
        self._start_heap: list[int] = []
        self._closed = RangeSet()
        self.position = position  # next marker offset to read

    # ------------------------------------------------------------ questions
    @property
    def in_flight(self) -> int:
        """Open (started, not closed) offsets."""
        return self._open

    @property
    def failing(self) -> int:
        """Open offsets held back after failed redelivery attempts."""
        return sum(s.end - s.first for s in self._segs if s.failures)

    @property
    def segment_count(self) -> int:
        return len(self._segs)

    def scheduled(self, now_ms: int) -> int:
        """Open offsets given back without a delivery and due only after ``now_ms``: scheduled
        messages (``kmq-not-before``) waiting for their time (``kmq status``)."""
        return sum(s.end - s.first for s in self._segs if s.reason is Reason.RELEASE and s.due_ms > now_ms)

    def oldest_started_ms(self) -> int | None:
        """Marker time of the oldest open START, or None when nothing is open."""
        return min((s.opened_ms for s in self._segs), default=None)

    def oldest_age_s(self, now_ms: int) -> float:
        oldest = self.oldest_started_ms()
        return 0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000.0)

    def committable_offset(self) -> int | None:
        """Marker offset a restart must resume from: the smallest START with
        open offsets, else the position (None before anything was read)."""
        heap, counts = self._start_heap, self._start_counts
        while heap and heap[0] not in counts:
            heapq.heappop(heap)
        return heap[0] if heap else self.position

    def open_ranges(self) -> list[OffsetRange]:
        """All open offsets, coalesced."""
        out: list[OffsetRange] = []
        for s in self._segs:
            if out and out[-1].end == s.first:
                out[-1] = OffsetRange(out[-1].first, out[-1].count + s.end - s.first)
            else:
                out.append(OffsetRange(s.first, s.end - s.first))
        return out

    def open_within(self, ranges: Iterable[tuple[int, int]]) -> list[OffsetRange]:
        """The parts of ``ranges`` that are still open."""
        out: list[OffsetRange] = []
        for first, count in ranges:
            for s in self._overlapping(first, first + count):
                a, b = max(s.first, first), min(s.end, first + count)
                if out and out[-1].end == a:
                    out[-1] = OffsetRange(out[-1].first, out[-1].count + b - a)
                else:
                    out.append(OffsetRange(a, b - a))
        return out

    def is_open(self, offset: int) -> bool:
        i = bisect_right(self._firsts, offset) - 1
        return i >= 0 and offset < self._segs[i].end

    def next_due_ms(self) -> int | None:
        """When the next segment becomes due (None: nothing waiting)."""
        heap = self._heap
        while heap:
            due, _, token, seg = heap[0]
            if token == seg.token and not seg.taken:
                return due
            heapq.heappop(heap)
        return None

    def due_at_least(self, now_ms: int, count: int) -> bool:
        """Whether at least ``count`` offsets are due at ``now_ms`` and not handed out (without
        handing them out: only the heap's entries due by then are visited, up to ``count``)."""
        heap = self._heap
        size = len(heap)
        found = 0
        look = [0] if size else []
        while look:
            i = look.pop()
            due, _, token, seg = heap[i]
            if due > now_ms:
                continue  # nor anything below it
            if token == seg.token and not seg.taken:
                found += seg.end - seg.first
                if found >= count:
                    return True
            child = 2 * i + 1
            if child < size:
                look.append(child)
                if child + 1 < size:
                    look.append(child + 1)
        return False

    def due(self, now_ms: int, limit: int | None = None) -> list[DueItem]:
        """Hand out segments due at ``now_ms`` (at most about ``limit`` offsets).

        Handed-out segments stay open (they still pin the commit) but are not
        handed out again until the service calls :meth:`defer` or :meth:`retry`
        for them; :meth:`close` ends them.
        """
        out: list[DueItem] = []
        taken = 0
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            if limit is not None and taken >= limit:
                break
            _, _, token, seg = heapq.heappop(heap)
            if token != seg.token or seg.taken:
                continue
            if limit is not None and seg.end - seg.first > limit - taken:
                # The limit holds inside a segment too: a START of 4 billion offsets is handed
                # out a slice at a time; the rest stays due (split pushes it back on the heap).
                self._split_at(seg.first + (limit - taken))
            seg.taken = True
            taken += seg.end - seg.first
            out.append(DueItem((OffsetRange(seg.first, seg.end - seg.first),), seg.reason, seg.error, seg.count,
                               seg.deadline_ms, seg.due_ms, seg.start_moff, seg.failures))
        return out

    def plan(self, item: DueItem, count: int, now_ms: int) -> Plan:
        """Decide for one record of ``item`` whose delivery count is ``count``."""
        if item.reason is Reason.REJECT:
            return Plan(Action.DEAD_LETTER, dlq_reason(Reason.REJECT))
        if item.reason is Reason.RELEASE:
            return Plan(Action.REDELIVER)  # no delivery was made: the copy keeps the count, however high
        if count >= self.max_deliveries:
            return Plan(Action.DEAD_LETTER, dlq_reason(item.reason))
        if item.reason is Reason.TIMEOUT:
            until = item.deadline_ms + self._backoff_ms(count)
            if until > now_ms:
                return Plan(Action.WAIT, until_ms=until)
        return Plan(Action.REDELIVER)

    # ------------------------------------------------------------ markers
    def apply(self, marker: Marker, marker_offset: int, ts_ms: int, read_ms: int | None = None,
              floor_ms: int | None = None) -> MarkerEffect:
        """Apply one decoded marker read at ``marker_offset`` with record time ``ts_ms``. With
        ``read_ms`` (when it was read; ``floor_ms``: written after it, or None) its deadlines are
        counted on the reader's clock, from :func:`~kmq.core.marker_clock.marker_time`; without,
        from ``ts_ms`` (one clock for everything: replays of a log, tests)."""
        self.position = marker_offset + 1
        if read_ms is not None:
            ts_ms = marker_time(ts_ms, read_ms, floor_ms)
        if isinstance(marker, Start):
            return self._start(marker, marker_offset, ts_ms)
        if isinstance(marker, End):
            return self._on_end(marker)
        if isinstance(marker, Renew):
            return self._on_renew(marker, ts_ms)
        if isinstance(marker, Nack):
            return self._on_nack(marker, ts_ms)
        if isinstance(marker, Reject):
            return self._on_reject(marker, ts_ms)
        if isinstance(marker, Closed):
            return self._on_closed(marker)
        raise TypeError(f"not a marker: {marker!r}")  # pragma: no cover

    def _on_end(self, marker: End) -> MarkerEffect:
        """Close what is open; what was closed already is a late ack."""
        closed = late = 0
        for r in marker.ranges:
            n = self._remove(r.first, r.end)
            closed += n
            if n < r.count:
                late += self._closed_count(r)
        return MarkerEffect(closed=closed, late=late) if closed or late else _NO_EFFECT

    def _on_renew(self, marker: Renew, ts_ms: int) -> MarkerEffect:
        """Move the deadline of what is open and leased; a RENEW of closed offsets is late."""
        late = 0
        deadline = ts_ms + self._hold(marker.lease_ms)
        for r in marker.ranges:
            touched = 0
            for s in self._pieces(r.first, r.end):
                touched += s.end - s.first
                if s.reason is Reason.TIMEOUT:
                    s.deadline_ms = deadline
                    self._reschedule(s, deadline + self._backoff_ms(max(s.count, 1)))
            if touched < r.count:
                late += self._closed_count(r)
        return MarkerEffect(late=late) if late else _NO_EFFECT

    def _on_nack(self, marker: Nack, ts_ms: int) -> MarkerEffect:
        reason = Reason.NACK if marker.counted else Reason.RELEASE
        for r in marker.ranges:
            for s in self._pieces(r.first, r.end):
                s.reason = reason
                self._reschedule(s, ts_ms + self._hold(marker.delay_ms))
        return _NO_EFFECT

    def _on_reject(self, marker: Reject, ts_ms: int) -> MarkerEffect:
        for r in marker.ranges:
            for s in self._pieces(r.first, r.end):
                s.reason, s.error = Reason.REJECT, marker.reason
                self._reschedule(s, ts_ms)
        return _NO_EFFECT

    def _on_closed(self, marker: Closed) -> MarkerEffect:
        closed = 0
        for r in marker.ranges:
            closed += self._remove(r.first, r.end)
            self._remember_closed(r)
        return MarkerEffect(closed=closed) if closed else _NO_EFFECT

    def skip(self, marker_offset: int) -> None:
        """Advance past a record that is not a valid marker."""
        self.position = marker_offset + 1

    # ------------------------------------------------------------ service reports
    def close(self, ranges: Iterable[tuple[int, int]]) -> int:
        """The tracker redelivered, dead-lettered or found missing these offsets."""
        n = 0
        for first, count in ranges:
            n += self._remove(first, first + count)
            self._remember_closed(OffsetRange(first, count))
        return n

    def defer(self, ranges: Iterable[tuple[int, int]], until_ms: int, count: int) -> None:
        """Hold these offsets (delivery count now known) until ``until_ms`` (backoff)."""
        for first, n in ranges:
            for s in self._pieces(first, first + n):
                s.taken, s.count = False, count
                self._reschedule(s, until_ms)

    def retry(self, ranges: Iterable[tuple[int, int]], until_ms: int) -> None:
        """A redelivery attempt failed: hand these offsets out again at ``until_ms``."""
        for first, n in ranges:
            for s in self._pieces(first, first + n):
                s.taken = False
                s.failures += 1
                self._reschedule(s, until_ms)

    def hold_from(self, offset: int, now_ms: int, until_ms: int) -> list[OffsetRange]:
        """The queue log ended at ``offset`` when read: every open offset at or above it that is
        handed out or due by ``now_ms`` is handed out again at ``until_ms`` (counted as a failed
        attempt), in one go however many there are. Offsets not due yet (live leases) keep their
        due time. Returns the offsets held, coalesced."""
        self._split_at(offset)
        out: list[OffsetRange] = []
        for s in list(self._overlapping(offset, 1 << 64)):
            if not s.taken and s.due_ms > now_ms:
                continue
            s.taken = False
            s.failures += 1
            self._reschedule(s, until_ms)
            if out and out[-1].end == s.first:
                out[-1] = OffsetRange(out[-1].first, out[-1].count + s.end - s.first)
            else:
                out.append(OffsetRange(s.first, s.end - s.first))
        return out

    def open_from(self, offset: int) -> list[OffsetRange]:
        """Open offsets at or above ``offset`` (e.g. past the end of the queue log), coalesced."""
        out: list[OffsetRange] = []
        for s in self._overlapping(offset, 1 << 64):
            a = max(s.first, offset)
            if out and out[-1].end == a:
                out[-1] = OffsetRange(out[-1].first, out[-1].count + s.end - a)
            else:
                out.append(OffsetRange(a, s.end - a))
        return out

    def release(self) -> None:
        """Un-take every handed-out segment (e.g. after an interrupted attempt)."""
        for s in self._segs:
            if s.taken:
                s.taken = False
                self._reschedule(s, s.due_ms)

    # ------------------------------------------------------------ internals
    def _hold(self, ms: int) -> int:
        return ms if self.max_hold_ms is None else min(ms, self.max_hold_ms)

    def _backoff_ms(self, count: int) -> int:
        ms = self._backoff_cache.get(count)
        if ms is None:
            ms = self._backoff_cache[count] = int(round(self._backoff(count) * 1000))
        return ms

    def _push(self, seg: _Seg) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (seg.due_ms, self._seq, seg.token, seg))
        if len(self._heap) > 4 * len(self._segs) + 1024:
            self._compact_heap()

    def _compact_heap(self) -> None:
        self._heap = [e for e in self._heap if e[2] == e[3].token and not e[3].taken]
        heapq.heapify(self._heap)

    def _reschedule(self, seg: _Seg, due_ms: int) -> None:
        seg.due_ms = due_ms
        seg.token += 1
        if not seg.taken:
            self._push(seg)

    def _start(self, m: Start, moff: int, ts: int) -> MarkerEffect:
        deadline = ts + self._hold(m.lease_ms)
        due = deadline + self._backoff_ms(1)
        opened = 0
        for r in m.ranges:
            # A repeated START for open offsets (re-polled after a worker crash) takes the newer lease.
            self._remove(r.first, r.end)
            if self._closed:
                self._closed.remove(r.first, r.count)
            seg = _Seg(r.first, r.end, moff, m.owner, ts, deadline, due)
            i = bisect_right(self._firsts, r.first)
            self._firsts.insert(i, r.first)
            self._segs.insert(i, seg)
            self._push(seg)
            opened += r.count
        if opened:
            if moff not in self._start_counts:
                heapq.heappush(self._start_heap, moff)
            self._start_counts[moff] = self._start_counts.get(moff, 0) + opened
            self._open += opened
        return MarkerEffect(opened=opened)

    def _overlapping(self, a: int, b: int) -> Iterator[_Seg]:
        segs = self._segs
        i = bisect_right(self._firsts, a) - 1
        if i < 0 or segs[i].end <= a:
            i += 1
        while i < len(segs) and segs[i].first < b:
            yield segs[i]
            i += 1

    def _split_at(self, at: int) -> None:
        i = bisect_right(self._firsts, at) - 1
        if i < 0:
            return
        s = self._segs[i]
        if s.first < at < s.end:
            right = s.split(at)
            self._firsts.insert(i + 1, at)
            self._segs.insert(i + 1, right)
            if not right.taken:
                self._push(right)

    def _pieces(self, a: int, b: int) -> list[_Seg]:
        """Segments exactly covering the open parts of ``a..b-1`` (splitting at the edges)."""
        self._split_at(a)
        self._split_at(b)
        return list(self._overlapping(a, b))

    def _remove(self, a: int, b: int) -> int:
        """Close open offsets in ``a..b-1``; return how many were open.

        Written out rather than built on _split_at so that the common END
        fragmentation case (a cut inside one segment) creates one new segment.
        """
        segs, firsts = self._segs, self._firsts
        removed = 0
        i = bisect_right(firsts, a) - 1
        if i < 0:
            i = 0
        elif segs[i].first < a:
            s = segs[i]
            if a < s.end:
                if b < s.end:  # a hole in the middle: s keeps the left part, a new segment the right
                    right = s.split(b)
                    s.end = a
                    firsts.insert(i + 1, b)
                    segs.insert(i + 1, right)
                    if not right.taken:
                        self._push(right)
                    self._dec(s.start_moff, b - a)
                    self._open -= b - a
                    return b - a
                removed += s.end - a
                self._dec(s.start_moff, s.end - a)
                s.end = a
            i += 1
        j = i
        while j < len(segs) and segs[j].first < b:
            s = segs[j]
            if s.end > b:  # trim the front of the last one; it stays in place
                removed += b - s.first
                self._dec(s.start_moff, b - s.first)
                s.first = b
                firsts[j] = b
                break
            removed += s.end - s.first
            self._dec(s.start_moff, s.end - s.first)
            s.token = -1
            j += 1
        if j > i:
            # the trimmed one (if any) sits at j and is kept
            end = j
            del segs[i:end]
            del firsts[i:end]
        self._open -= removed
        return removed

    def _dec(self, start_moff: int, n: int) -> None:
        counts = self._start_counts
        left = counts[start_moff] - n
        if left:
            counts[start_moff] = left
        else:
            del counts[start_moff]

    def _remember_closed(self, r: OffsetRange) -> None:
        # Late acks of ranges beyond the memory are no longer counted.
        self._closed.add_bounded(r.first, r.count, CLOSED_MEMORY_RANGES)

    def _closed_count(self, r: OffsetRange) -> int:
        if not self._closed:
            return 0
        return sum(x.count for x in self._closed.intersection(r.first, r.count))
