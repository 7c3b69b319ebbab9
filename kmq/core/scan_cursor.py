"""Where a partition scan reads next, and when it is over: the walk every log reader shares, pure.

A scan reads offsets of one partition: ranges of wanted offsets (the tracker reads the
originals a START names), everything from an offset to the end of the log (``kmq status``,
``kmq dlq``, ``kmq trace``, the audit), or a planned offset range (a Spark task). The
log reader of each Kafka client (:mod:`kmq.client`) does the I/O and reports what each
poll brought, with the time; the cursor answers what to do next:

================================  ===========================================================
event                             the reader reports
================================  ===========================================================
:meth:`ScanCursor.polled`         a poll: the offset after its last record (None: no record)
                                  and the high-water mark of a fetch response of the current
                                  assignment (None: no such response yet)
:meth:`ScanCursor.out_of_range`   the fetch position is out of range; the log start looked up
================================  ===========================================================

and the answer is an action: :class:`Seek` (assign the partition anew at an offset, or at
the log start), :data:`POLL`, :class:`Done` (with the log end when the scan ran into it) or
:class:`Stalled` (no answer from the broker for too long: nothing is concluded).

The rules, and why:

* **The log end comes only from this scan.** It is the high-water mark of a fetch response
  of an assignment the scan made, or an out-of-range answer at or above the log start.
  Never a mark a client cached before: librdkafka keeps the mark of an earlier read of the
  same partition across assignments, and taken for the end while a slow first fetch was
  on its way (a broker pause, a leader move), it had offsets that exist closed as missing.
  Readers report a mark only when it is from this assignment; the cursor never guesses one.
* **The end is the first such mark.** A scan reads what the log held when it started and
  does not chase a log that keeps growing; offsets a scan wants were written before it
  started (a START names offsets a consumer had already fetched).
* **No answer and no mark: probe.** Some brokers answer a fetch beyond the end with
  neither records, an end-of-partition event nor an out-of-range error. After
  ``idle_polls`` empty polls without a mark the cursor asks for one read at the log start
  (:class:`Seek` with ``probe``), whose fetch answers with records or with the end of an
  empty log, and so with a mark of this assignment; its records are not the scan's.
  A paused broker answers neither, and after ``stall_s`` without progress the scan stops
  with :class:`Stalled`: a slow broker delays a scan, it never shortens it.
* **Below the log start means deleted** (retention): the scan goes on at the log start and
  lists the deleted offsets in :attr:`ScanCursor.deleted`.
* **Seeks** go never backwards and never across a gap of more than ``SEEK_GAP`` offsets
  (reading through a small gap is cheaper than a new assignment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, Union

from kmq.core.ranges import OffsetRange, RangeSet

__all__ = ["ScanCursor", "Seek", "Poll", "POLL", "Done", "Stalled", "ScanAction", "SEEK_GAP", "needs_seek",
           "next_target"]

#: Re-seek instead of reading through a gap wider than this many offsets.
SEEK_GAP = 1000
#: The largest Kafka offset: a scan "to the end" wants every offset up to it.
_MAX_OFFSET = (1 << 63) - 1
#: Empty polls without a high-water mark before the cursor probes at the log start.
IDLE_POLLS = 3


@dataclass(frozen=True, slots=True)
class Seek:
    """Assign the partition anew at ``offset`` (None: the log start). A mark cached before
    this seek is not one of this assignment. ``probe``: read only for a high-water mark;
    the records of this assignment are not the scan's."""

    offset: int | None
    probe: bool = False


@dataclass(frozen=True, slots=True)
class Poll:
    """Poll again."""


POLL = Poll()


@dataclass(frozen=True, slots=True)
class Done:
    """The scan is over. ``log_end``: the high-water mark when the scan ran into the end of
    the log (no offset at or above it exists); None when everything wanted was read first."""

    log_end: int | None


@dataclass(frozen=True, slots=True)
class Stalled:
    """The broker gave no answer for ``stall_s``; ``reason`` says where. Nothing is concluded."""

    reason: str


ScanAction = Union[Seek, Poll, Done, Stalled]


def needs_seek(pos: int | None, target: int) -> bool:
    """Whether a reader at ``pos`` (None: not placed yet) seeks to ``target`` rather than
    reads on: never backwards, never through a gap wider than :data:`SEEK_GAP` offsets."""
    return pos is None or target < pos or target - pos > SEEK_GAP


def next_target(todo: Sequence[OffsetRange], i: int, known: int) -> tuple[int, int | None]:
    """The next offset to read: from range ``todo[i]`` on, the first range with an offset at or
    above ``known`` (every wanted offset below it is decided), and that offset; None when all are decided."""
    while i < len(todo) and todo[i].end <= known:
        i += 1
    return i, (max(todo[i].first, known) if i < len(todo) else None)


class ScanCursor:
    """The decisions of one partition scan (see the module docstring). Build one with
    :meth:`ranges`, :meth:`to_end` or :meth:`for_mark`; call :meth:`start` first."""

    __slots__ = ("_todo", "_i", "_known", "_pos", "_placed", "_end", "_first", "_probing", "_idle",
                 "_idle_polls", "_stall_s", "_progress_at", "deleted", "what")

    def __init__(self, wanted: Sequence[OffsetRange], now: float, stall_s: float, *, first: int | None = -1,
                 probing: bool = False, idle_polls: int = IDLE_POLLS, what: str = "the partition") -> None:
        self._todo = list(wanted)
        self._i = 0
        self._known = -1  # every wanted offset below this is decided (read, deleted or past the end)
        self._placed = False  # the current assignment reads for the scan (not a probe's, not none yet)
        self._pos: int | None = None  # where it reads next; None while at a log start not read yet
        self._end: int | None = None  # the log end: the first mark of this scan
        self._first = first  # the first seek: an offset, None for the log start, -1 for the first wanted offset
        self._probing = probing
        self._idle = 0
        self._idle_polls = idle_polls
        self._stall_s = stall_s
        self._progress_at = now
        #: Offsets found deleted (below the log start when the scan reached them), in order.
        self.deleted: list[OffsetRange] = []
        self.what = what

    # ------------------------------------------------------------ kinds of scan
    @classmethod
    def ranges(cls, wanted: Iterable[tuple[int, int]] | RangeSet, now: float, stall_s: float,
               what: str = "the partition") -> "ScanCursor":
        """Exactly these offsets (each is read, or decided absent: deleted or past the end)."""
        rs = wanted if isinstance(wanted, RangeSet) else RangeSet(wanted)
        return cls(rs.ranges(), now, stall_s, what=what)

    @classmethod
    def to_end(cls, start: int | None, now: float, stall_s: float, stop: int | None = None,
               what: str = "the partition") -> "ScanCursor":
        """From ``start`` (None: the log start) to the end of the log, or to ``stop`` (exclusive)
        when that comes first (a planned range)."""
        first = 0 if start is None else start
        last = _MAX_OFFSET if stop is None else stop
        todo = [OffsetRange(first, last - first)] if last > first else []
        return cls(todo, now, stall_s, first=start if todo else -1, what=what)

    @classmethod
    def for_mark(cls, at: int | None, now: float, stall_s: float, what: str = "the partition") -> "ScanCursor":
        """Only the log end: one read at ``at`` (None: the log start) for a high-water mark."""
        return cls([], now, stall_s, first=at, probing=True, what=what)

    # ------------------------------------------------------------ what the reader asks
    @property
    def probing(self) -> bool:
        """True while the current assignment is read only for its mark (its records are not the scan's)."""
        return self._probing

    @property
    def log_end(self) -> int | None:
        """The first high-water mark of this scan (None: none yet)."""
        return self._end

    @property
    def limit(self) -> int:
        """Records at or above this offset are not the scan's (past the end it started with, or
        past the last wanted offset): readers cut their batches here."""
        last = self._todo[-1].end if self._todo else 0
        return last if self._end is None else min(last, self._end)

    # ------------------------------------------------------------ events
    def start(self) -> ScanAction:
        """The first action: where to assign the partition."""
        if self._first == -1:
            return self._next()
        return self._seek(self._first, self._probing)

    def polled(self, next_offset: int | None, mark: int | None, now: float) -> ScanAction:
        """One poll of the current assignment: ``next_offset`` is the offset after its last record
        (or the position an end-of-partition event or a fetch response reported), ``mark`` the
        high-water mark of a fetch response of this assignment. Both None: an empty poll."""
        first_mark = mark is not None and self._end is None
        if first_mark:
            self._end = mark
            self._progress(now)
            if self._probing:
                self._probing = False
                self._placed = False  # the probe moved the reader: the next read seeks
                return self._next()
        if (next_offset is not None and self._placed and not self._probing
                and (self._pos is None or next_offset > self._pos)):
            self._pos = next_offset
            self._known = max(self._known, next_offset)
            self._progress(now)
            return self._next()
        if first_mark:
            return self._next()
        return self._empty(now)  # a mark seen before is no news

    def out_of_range(self, log_start: int, now: float) -> ScanAction:
        """The fetch at the current position is out of range; ``log_start`` is the log's first offset now."""
        self._progress(now)
        if self._probing or not self._placed or self._pos is None:
            return self._seek(None, self._probing)  # the log start moved under the read: start there again
        pos = self._pos
        if pos < log_start:
            # Deleted by retention before the scan reached them.
            self.deleted.append(OffsetRange(pos, log_start - pos))
            self._known = max(self._known, log_start)
            self._placed = False
            return self._next()
        # At or above the log start and still out of range: beyond the end; nothing at or above ``pos`` exists.
        self._end = pos if self._end is None else min(self._end, pos)
        return self._next()

    # ------------------------------------------------------------ decisions
    def _progress(self, now: float) -> None:
        self._progress_at = now
        self._idle = 0

    def _seek(self, offset: int | None, probe: bool) -> Seek:
        self._placed = not probe
        self._pos = offset
        self._idle = 0
        return Seek(offset, probe)

    def _next(self) -> ScanAction:
        if self._probing:
            return POLL
        self._i, target = next_target(self._todo, self._i, self._known)
        if target is None:
            return Done(None if self._todo else self._end)
        if self._end is not None and target >= self._end:
            return Done(self._end)
        if self._placed and self._pos is None:
            return POLL  # reading from the log start; its first offset is not known yet
        if needs_seek(self._pos if self._placed else None, target):
            return self._seek(target, False)
        return POLL

    def _empty(self, now: float) -> ScanAction:
        if now - self._progress_at > self._stall_s:
            where = "the log start" if self._pos is None else f"offset {self._pos}"
            return Stalled(f"no answer from the broker for {self._stall_s:g}s reading {self.what} at {where}")
        self._idle += 1
        at_start = self._probing and self._pos is None
        if self._end is None and not at_start and self._idle >= self._idle_polls:
            # Neither records, nor a mark, nor an out-of-range answer: some brokers answer a fetch beyond
            # the end that way. One read at the log start brings a mark of this assignment.
            self._probing = True
            return self._seek(None, True)
        return POLL
