"""Per-partition lag state of the Spark lag job (pure: no Spark, no Kafka).

One :class:`PartitionLagState` follows the markers of one queue partition in
marker-offset order and cuts them into tumbling event-time windows (marker
record timestamp). When a window closes it yields a :class:`WindowStats`:
marker counts by type, in-flight offsets and oldest in-flight age at the
window end, ack latency percentiles, redeliveries, dead letters, late acks.

Memory is bounded by offset *ranges*, not messages: open offsets are kept as
coalesced segments (first, end, start time) and closed offsets as a
:class:`~kmq.core.ranges.RangeSet` of at most
:data:`~kmq.core.ranges.CLOSED_MEMORY_RANGES` ranges (as the tracker's).

Semantics (docs/spark.md):

* START opens offsets at the marker time (a re-START of an open offset keeps
  the earlier start time; a re-START of a closed offset reopens it).
* END closes open offsets (ack; latency = END time - START time per offset);
  END for offsets already closed counts as a late ack.
* REJECT closes (the consumer gave the message up; the tracker will write a
  CLOSED with outcome DEAD_LETTERED later, which counts the dead letter).
* CLOSED closes; its :class:`~kmq.core.markers.Outcome` REDELIVERED counts
  redeliveries, DEAD_LETTERED dead letters, MISSING missing offsets.
* RENEW and NACK are counted only.

Window rule: a marker belongs to window ``ts // window_ms`` unless that window
is already closed, then to the current open window. A window closes when a
marker of a later window arrives, or through :meth:`expire` (idle timeout).
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator, Sequence

from kmq.core.markers import BAD_RECORD, MarkerType, Outcome
from kmq.core.ranges import CLOSED_MEMORY_RANGES, RangeSet

__all__ = [
    "LATENCY_BUCKETS_MS",
    "MARKER_TYPES",
    "WindowStats",
    "OpenSegments",
    "PartitionLagState",
    "percentile_from_buckets",
]

# Upper bounds (ms) of the ack-latency histogram; percentiles are reported as
# the upper bound of the bucket that holds them (the last bucket is open).
LATENCY_BUCKETS_MS: tuple[int, ...] = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 30000,
    60000, 120000, 300000, 600000, 1800000, 3600000, 21600000, 86400000,
)
MARKER_TYPES = tuple(t.name for t in MarkerType)  # START, END, RENEW, NACK, REJECT, CLOSED
BAD = "BAD"
# Type names by type code.
_TYPE_NAMES = {BAD_RECORD: BAD, **{int(t): t.name for t in MarkerType}}
# Plain ints for the hot loop of apply_decoded (comparing ints to enum members costs an attribute
# look-up each time).
_START, _END, _REJECT, _CLOSED = (int(t) for t in (MarkerType.START, MarkerType.END, MarkerType.REJECT,
                                                   MarkerType.CLOSED))


def _count_closed(w: "WindowStats", outcome: int | None, count: int) -> None:
    """Count ``count`` offsets the tracker closed with ``outcome`` (a CLOSED marker) in window ``w``."""
    if outcome == Outcome.REDELIVERED:
        w.redeliveries += count
    elif outcome == Outcome.DEAD_LETTERED:
        w.dead_letters += count
    elif outcome == Outcome.MISSING:
        w.missing += count


def _bucket(latency_ms: int) -> int:
    return bisect_left(LATENCY_BUCKETS_MS, latency_ms)


def percentile_from_buckets(counts: Sequence[int], q: float) -> int | None:
    """Upper bound (ms) of the bucket holding quantile ``q``; None when empty.

    The overflow bucket reports the largest finite bound.
    """
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    run = 0
    for i, c in enumerate(counts):
        run += c
        if c and run >= rank:
            return LATENCY_BUCKETS_MS[min(i, len(LATENCY_BUCKETS_MS) - 1)]
    return LATENCY_BUCKETS_MS[-1]


class OpenSegments:
    """Open offsets as sorted, disjoint segments ``[first, end)`` with a start time each."""

    __slots__ = ("starts", "ends", "times", "size")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.times: list[int] = []
        self.size = 0

    def add(self, first: int, count: int, ts: int) -> None:
        """Open ``first..first+count-1`` at ``ts``; offsets already open keep their time."""
        start, end = first, first + count
        lo = bisect_right(self.ends, start)
        hi = bisect_left(self.starts, end)
        pieces: list[tuple[int, int, int]] = []
        cur = start
        for s, e in zip(self.starts[lo:hi], self.ends[lo:hi]):
            if s > cur:
                pieces.append((cur, s, ts))
            cur = max(cur, e)
        if cur < end:
            pieces.append((cur, end, ts))
        for s, e, t in pieces:
            i = bisect_left(self.starts, s)
            # Merge with a neighbour that touches and has the same start time.
            if i > 0 and self.ends[i - 1] == s and self.times[i - 1] == t:
                self.ends[i - 1] = e
                if i < len(self.starts) and self.starts[i] == e and self.times[i] == t:
                    self.ends[i - 1] = self.ends[i]
                    del self.starts[i], self.ends[i], self.times[i]
            elif i < len(self.starts) and self.starts[i] == e and self.times[i] == t:
                self.starts[i] = s
            else:
                self.starts.insert(i, s)
                self.ends.insert(i, e)
                self.times.insert(i, t)
            self.size += e - s

    def remove(self, first: int, count: int) -> list[tuple[int, int]]:
        """Close offsets; return ``(count, start_time)`` of the parts that were open."""
        start, end = first, first + count
        lo = bisect_right(self.ends, start)
        hi = bisect_left(self.starts, end)
        if lo >= hi:
            return []
        out: list[tuple[int, int]] = []
        ks: list[int] = []
        ke: list[int] = []
        kt: list[int] = []
        for s, e, t in zip(self.starts[lo:hi], self.ends[lo:hi], self.times[lo:hi]):
            cs, ce = max(s, start), min(e, end)
            out.append((ce - cs, t))
            self.size -= ce - cs
            if s < cs:
                ks.append(s), ke.append(cs), kt.append(t)  # type: ignore[func-returns-value]  # one line, three lists
            if ce < e:
                ks.append(ce), ke.append(e), kt.append(t)  # type: ignore[func-returns-value]
        self.starts[lo:hi] = ks
        self.ends[lo:hi] = ke
        self.times[lo:hi] = kt
        return out

    def oldest(self) -> int | None:
        return min(self.times) if self.times else None

    def segments(self) -> Iterator[tuple[int, int, int]]:
        return zip(self.starts, self.ends, self.times)


@dataclass
class WindowStats:
    """What the job outputs for one queue partition and one window."""

    partition: int
    window_start_ms: int
    window_end_ms: int
    markers: dict[str, int] = field(default_factory=lambda: {t: 0 for t in MARKER_TYPES})
    bad_markers: int = 0
    acked: int = 0
    ack_latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    # Exact total of the acked offsets' latencies: the _sum of the Prometheus histogram.
    ack_latency_sum_ms: int = 0
    redeliveries: int = 0
    dead_letters: int = 0
    missing: int = 0
    late_acks: int = 0
    # Filled when the window closes.
    in_flight: int = 0
    oldest_in_flight_ms: int | None = None
    markers_high_water: int = 0

    def percentile(self, q: float) -> int | None:
        return percentile_from_buckets(self.ack_latency_buckets, q)

    def as_row(self) -> dict:
        """Flat mapping (the job's output columns, without queue and marker lag)."""
        row = {
            "partition": self.partition,
            "window_start_ms": self.window_start_ms,
            "window_end_ms": self.window_end_ms,
            "bad_markers": self.bad_markers,
            "acked": self.acked,
            "in_flight": self.in_flight,
            "oldest_in_flight_ms": self.oldest_in_flight_ms,
            "ack_p50_ms": self.percentile(0.50),
            "ack_p95_ms": self.percentile(0.95),
            "ack_p99_ms": self.percentile(0.99),
            "redeliveries": self.redeliveries,
            "dead_letters": self.dead_letters,
            "missing": self.missing,
            "late_acks": self.late_acks,
            "markers_high_water": self.markers_high_water,
            "ack_latency_sum_ms": self.ack_latency_sum_ms,
            "ack_latency_buckets": list(self.ack_latency_buckets),
        }
        for t in MARKER_TYPES:
            row[f"markers_{t.lower()}"] = self.markers[t]
        return row


class PartitionLagState:
    """Open ranges plus the current window of one queue partition."""

    def __init__(self, partition: int, window_ms: int) -> None:
        if window_ms <= 0:
            raise ValueError("window_ms must be positive")
        self.partition = partition
        self.window_ms = window_ms
        self.open = OpenSegments()
        self.closed = RangeSet()
        self.current: WindowStats | None = None
        self.last_closed_index: int | None = None
        self.high_water = 0  # one past the largest marker offset seen

    # ------------------------------------------------------------ windows
    def _window_for(self, ts: int) -> tuple[WindowStats | None, list[WindowStats]]:
        idx = ts // self.window_ms
        emitted: list[WindowStats] = []
        cur = self.current
        if cur is not None:
            cur_idx = cur.window_start_ms // self.window_ms
            if idx <= cur_idx:
                return cur, emitted
            emitted.append(self._close_current())
        if self.last_closed_index is not None and idx <= self.last_closed_index:
            idx = self.last_closed_index + 1
        self.current = WindowStats(self.partition, idx * self.window_ms, (idx + 1) * self.window_ms)
        return self.current, emitted

    def _close_current(self) -> WindowStats:
        w = self.current
        assert w is not None
        w.in_flight = self.open.size
        oldest = self.open.oldest()
        w.oldest_in_flight_ms = None if oldest is None else max(0, w.window_end_ms - oldest)
        w.markers_high_water = self.high_water
        self.last_closed_index = w.window_start_ms // self.window_ms
        self.current = None
        return w

    def expire(self, now_ms: int, grace_ms: int) -> list[WindowStats]:
        """Close the open window if ``now_ms`` is at least its end plus ``grace_ms``."""
        if self.current is not None and now_ms >= self.current.window_end_ms + grace_ms:
            return [self._close_current()]
        return []

    # ------------------------------------------------------------ markers
    def apply(
        self,
        marker_offset: int,
        ts_ms: int,
        mtype: str,
        ranges: Iterable[tuple[int, int]] = (),
        outcome: int | None = None,
    ) -> list[WindowStats]:
        """Apply one marker record (``mtype`` a :class:`~kmq.core.markers.MarkerType` name, or BAD
        for an undecodable record; ``outcome`` the CLOSED outcome); return closed windows.

        The reference for :meth:`apply_decoded`, which must give the same result."""
        w, emitted = self._window_for(ts_ms)
        assert w is not None
        self.high_water = max(self.high_water, marker_offset + 1)
        if mtype == BAD:
            w.bad_markers += 1
            return emitted
        w.markers[mtype] += 1
        t = MarkerType[mtype]
        if t is MarkerType.START:
            for first, count in ranges:
                self.closed.remove(first, count)
                self.open.add(first, count, ts_ms)
        elif t is MarkerType.END:
            for first, count in ranges:
                was_closed = sum(r.count for r in self.closed.intersection(first, count))
                for n, started in self.open.remove(first, count):
                    w.acked += n
                    w.ack_latency_buckets[_bucket(max(0, ts_ms - started))] += n
                    w.ack_latency_sum_ms += n * max(0, ts_ms - started)
                w.late_acks += was_closed
                self.closed.add_bounded(first, count, CLOSED_MEMORY_RANGES)
        elif t in (MarkerType.REJECT, MarkerType.CLOSED):
            for first, count in ranges:
                self.open.remove(first, count)
                self.closed.add_bounded(first, count, CLOSED_MEMORY_RANGES)
                if t is MarkerType.CLOSED:
                    _count_closed(w, outcome, count)
        return emitted

    def apply_decoded(self, marker_offsets: Sequence[int], ts_ms: Sequence[int], decoded) -> list[WindowStats]:
        """Apply a batch of records in marker-offset order, decoded by
        :func:`kmq.core.markers_bulk.decode_records`; the same result as :meth:`apply` record by record.

        Records below the high-water mark were applied already (a source replaying offsets)
        and are skipped. This is the lag job's hot path: the common cases (a START past every
        open and closed offset, an END of what is open) skip the general range arithmetic.
        """
        emitted: list[WindowStats] = []
        names = _TYPE_NAMES
        mtypes = decoded.mtype.tolist()
        outcomes = decoded.outcome.tolist()
        rstart = decoded.range_start.tolist()
        firsts = decoded.firsts.tolist()
        counts = decoded.counts.tolist()
        wms = self.window_ms
        w = self.current
        w_idx = -1 if w is None else w.window_start_ms // wms  # -1: unread while w is None
        hw = self.high_water
        for i, (off, ts, t) in enumerate(zip(marker_offsets, ts_ms, mtypes)):
            if off < hw:
                continue
            if w is None or ts // wms > w_idx:
                self.high_water = hw
                w, em = self._window_for(ts)
                assert w is not None
                emitted.extend(em)
                w_idx = w.window_start_ms // wms
            hw = off + 1
            if t == BAD_RECORD:
                w.bad_markers += 1
                continue
            w.markers[names[t]] += 1
            a, b = rstart[i], rstart[i + 1]
            if t == _START:
                self._open_ranges(firsts, counts, a, b, ts)
            elif t == _END:
                self._ack_ranges(w, firsts, counts, a, b, ts)
            elif t == _REJECT or t == _CLOSED:
                self._close_ranges(w, firsts, counts, a, b, t == _CLOSED, outcomes[i])
        self.high_water = hw
        return emitted

    def _open_ranges(self, firsts: list[int], counts: list[int], a: int, b: int, ts: int) -> None:
        """A decoded START of the ranges ``firsts[a:b]``/``counts[a:b]``: reopen what was closed, open at
        ``ts`` (appended when past every open offset)."""
        opn, closed = self.open, self.closed
        o_starts, o_ends, o_times = opn.starts, opn.ends, opn.times
        for j in range(a, b):
            first, count = firsts[j], counts[j]
            if first < closed.max_end():
                closed.remove(first, count)
            if not o_ends or o_ends[-1] < first:  # past every open offset: append
                o_starts.append(first), o_ends.append(first + count), o_times.append(ts)  # type: ignore[func-returns-value]
                opn.size += count
            elif o_ends[-1] == first and o_times[-1] == ts:
                o_ends[-1] = first + count
                opn.size += count
            else:
                opn.add(first, count, ts)

    def _ack_ranges(self, w: WindowStats, firsts: list[int], counts: list[int], a: int, b: int,
                    ts: int) -> None:
        """A decoded END: close what is open (counting its latency in ``w``), count late acks."""
        opn, closed = self.open, self.closed
        o_starts, o_ends, o_times = opn.starts, opn.ends, opn.times
        buckets = w.ack_latency_buckets
        for j in range(a, b):
            first, count = firsts[j], counts[j]
            if first < closed.max_end() and closed.min() < first + count:  # type: ignore[operator]
                w.late_acks += sum(r.count for r in closed.intersection(first, count))
            k = bisect_left(o_starts, first)
            if k < len(o_starts) and o_starts[k] == first and o_ends[k] == first + count:
                # The whole of one START's range acked (the common case): drop its segment.
                parts = [(count, o_times[k])]
                del o_starts[k], o_ends[k], o_times[k]
                opn.size -= count
            else:
                parts = opn.remove(first, count)
            for n, started in parts:
                lat = ts - started if ts > started else 0
                w.acked += n
                buckets[bisect_left(LATENCY_BUCKETS_MS, lat)] += n
                w.ack_latency_sum_ms += n * lat
            closed.add_bounded(first, count, CLOSED_MEMORY_RANGES)

    def _close_ranges(self, w: WindowStats, firsts: list[int], counts: list[int], a: int, b: int,
                      tracker_closed: bool, outcome: int) -> None:
        """A decoded REJECT, or a CLOSED (``tracker_closed``) whose ``outcome`` is counted in ``w``."""
        for j in range(a, b):
            first, count = firsts[j], counts[j]
            self.open.remove(first, count)
            self.closed.add_bounded(first, count, CLOSED_MEMORY_RANGES)
            if tracker_closed:
                _count_closed(w, outcome, count)

    # ------------------------------------------------------------ persistence
    def to_json(self) -> str:
        """Compact, versioned serialisation (the Spark state row)."""
        return json.dumps({
            "v": 1,
            "p": self.partition,
            "w": self.window_ms,
            "o": [self.open.starts, self.open.ends, self.open.times],
            "c": [[r.first, r.count] for r in self.closed],
            "cur": None if self.current is None else asdict(self.current),
            "lc": self.last_closed_index,
            "hw": self.high_water,
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "PartitionLagState":
        d = json.loads(text)
        st = cls(d["p"], d["w"])
        st.open.starts, st.open.ends, st.open.times = (list(x) for x in d["o"])
        st.open.size = sum(e - s for s, e in zip(st.open.starts, st.open.ends))
        st.closed = RangeSet((f, c) for f, c in d["c"])
        st.current = None if d["cur"] is None else WindowStats(**d["cur"])
        st.last_closed_index = d["lc"]
        st.high_water = d["hw"]
        return st
