"""Catch-up of newly owned markers partitions, decided without I/O: seeks, reads and commits in order.

A partition assigned to the tracker resumes from its committed marker offset and
is *catching up* until its position reaches a log end read after the assignment;
only then are its due messages redelivered. A partition re-read after a
membership doubt also waits until the group accepts a commit for it.
:class:`CatchUpPlan` decides every step of that; its I/O shell
(``tracker/catch_up.py``) drives one of its three generators per call, carries
out each action it yields and answers it with an event::

    generator                 action                    answered by
    position(owned)           ReadCommitted(tps)        {tp: committed offset or None}
                              Seek(tp, offset)          OK (offset None: to the log start)
    read_targets(owned, now)  ReadEnds(from_offsets)    Ends(ends, failed)
                              Clock()                   the time now (ms)
    reach(owned)              ReadPosition(tp)          the client's position, or None
                              Seek(tp, None)            OK
                              Clock()                   the time now (ms)
                              Commit(offsets)           OK, or Refused(error, rebalanced)
    any of them               CommittedUnread, TargetsUnread, PositionsUnread,
                              ResumedElsewhere, ConfirmRefused, Confirmed, CaughtUp: notices,
                              answered OK (the shell counts and logs)

A read, a seek or a look-up may instead be answered by :class:`Failed`. Each
generator returns what the call's caller needs: the partitions positioned, the
partitions caught up just now.

* Positioned: at most ``per_step`` pending partitions not positioned yet, in
  partition order, each sought to its committed offset (the log start if none);
  committed offsets not read are asked again next call, and nothing is sought.
* Target: the log end of a positioned partition without one, looked up at most
  ``per_step`` at a time: those whose last look-up was answered in one call,
  those whose last one was not (``failing``) in another once their own backoff
  (0.5 s doubling to 30 s) is over. A target is never an end read before the
  seek: positioning clears it.
* Reached: the position is at or past the target. Before anything was read
  since resuming, the client's position is checked against the committed offset
  (a gap: markers lost to retention or a log recreated,
  :func:`~kmq.core.retention.resume_gap`); a committed offset past the target is
  sought to the log start. A position the client cannot tell yet is asked again
  next call, never compared.
* Confirmed: partitions re-read after a membership doubt are caught up only once
  a commit of their committable offsets went through; after one that failed, the
  next waits :data:`CONFIRM_RETRY_MS`, and only the first failure of a series is
  to be logged.
* Caught up: the partition leaves :attr:`CatchUpPlan.pending`, and its
  read-through time is the time its target was asked for.

The partitions are the service's :class:`~tracker.partition.OwnedPartition` (any
object with the fields of :class:`Partition`); the generators change them
themselves, each change at its place in that order. Times are milliseconds on the
tracker's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Hashable, Mapping, Protocol, Sequence

from kmq.core.retention import ResumeGap, resume_gap

__all__ = [
    "CatchUpPlan", "Partition", "ReadCommitted", "Seek", "ReadEnds", "ReadPosition", "Clock", "CLOCK", "Commit",
    "CommittedUnread", "TargetsUnread", "PositionsUnread", "ResumedElsewhere", "ConfirmRefused", "Confirmed", "CaughtUp",
    "Ends", "Refused", "Failed", "OK", "CONFIRM_RETRY_MS", "resumed",
]

#: After a confirming commit failed (refused, or the coordinator unreachable): wait this long (ms)
#: before the next one, instead of a blocking commit every step.
CONFIRM_RETRY_MS = 1000


class Partition(Protocol):
    """What catch-up reads and changes of a partition (:class:`tracker.partition.OwnedPartition`)."""

    tp: Any
    state: Any  # its kmq.core.lease_state.PartitionState: position, committable_offset()
    positioned: bool
    target: int | None
    target_ms: int
    committed: int | None
    resume_from: int | None
    lookup_failures: int
    recheck_ms: int
    doubted: bool
    caught_up: bool
    read_through_ms: int

    def lookup_failed(self, now_ms: int) -> float: ...


# ------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class ReadCommitted:
    """Read the group's committed offsets of ``tps`` (answer: ``{tp: offset or None}``)."""

    tps: list[Any]


@dataclass(frozen=True, slots=True)
class Seek:
    """Move the group consumer's position of ``tp`` to ``offset`` (None: the log start; answer: OK)."""

    tp: Any
    offset: int | None


@dataclass(frozen=True, slots=True)
class ReadEnds:
    """Look up the log ends of the partitions of ``from_offsets`` (each read from the offset it
    maps to, its committed one) with the log reader, not the group consumer's cached mark
    (answer: :class:`Ends`)."""

    from_offsets: dict[Any, int | None]


@dataclass(frozen=True, slots=True)
class ReadPosition:
    """Ask the group consumer for its position of ``tp`` (answer: the offset, or None: not known yet)."""

    tp: Any


@dataclass(frozen=True, slots=True)
class Clock:
    """Answer with the time now (ms)."""


CLOCK = Clock()


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit ``offsets`` with the generation the client holds (answer: OK, or :class:`Refused`)."""

    offsets: dict[Any, int]


@dataclass(frozen=True, slots=True)
class CommittedUnread:
    """Notice: the committed offsets of ``tps`` were not read (``error``); asked again next call."""

    tps: list[Any]
    error: BaseException


@dataclass(frozen=True, slots=True)
class TargetsUnread:
    """Notice: the log ends of ``partitions`` got no answer (``cause``: the first one's); each backs
    off on its own, the longest for ``delay_s``."""

    partitions: list[Any]
    cause: str
    delay_s: float


@dataclass(frozen=True, slots=True)
class PositionsUnread:
    """Notice: the positions of ``tps`` were not read (``error``: the last one's); asked again next call."""

    tps: list[Any]
    error: BaseException


@dataclass(frozen=True, slots=True)
class ResumedElsewhere:
    """Notice: reading of ``partition`` resumed elsewhere than at its committed offset (``gap``)."""

    partition: Any
    gap: ResumeGap


@dataclass(frozen=True, slots=True)
class ConfirmRefused:
    """Notice: the confirming commit of ``tps`` failed (``rebalanced``: refused as fenced); the next
    one waits :data:`CONFIRM_RETRY_MS`. ``first``: the first failure since the last that passed."""

    tps: list[Any]
    error: BaseException
    rebalanced: bool
    first: bool


@dataclass(frozen=True, slots=True)
class Confirmed:
    """Notice: the group accepted the confirming commit of ``tps``: they are still this member's."""

    tps: list[Any]


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """Notice: ``partitions`` caught up just now; ``pending``: how many still catch up."""

    partitions: list[Any]
    pending: int


# ------------------------------------------------------------ events
@dataclass(frozen=True, slots=True)
class Ends:
    """A look-up's answer: ``ends`` by partition; a partition left out got no answer (``failed``:
    why, by partition, where the reader said)."""

    ends: Mapping[Any, int]
    failed: Mapping[Any, str]


@dataclass(frozen=True, slots=True)
class Refused:
    """The commit failed with ``error``; ``rebalanced``: the group refused it as fenced."""

    error: BaseException
    rebalanced: bool


@dataclass(frozen=True, slots=True)
class Failed:
    """The action failed with ``error`` (a read of committed offsets, of a position, a seek, a look-up)."""

    error: BaseException


OK = None  # the answer to an action that returns nothing

Action = Any  # one of the action classes above
Event = Any  # one of the event classes above, an offset, a mapping, a time or OK
Steps = Generator[Action, Event, Any]


class _Unread(Exception):
    """A position or seek of one partition failed: it is asked again next call."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def resumed(owned: Partition, resumed_at: int) -> ResumeGap | None:
    """The first offset read (or the position) after resuming is ``resumed_at``: the gap from the
    committed offset it resumed from, if any (:func:`~kmq.core.retention.resume_gap`); the
    partition no longer waits for that check."""
    gap = resume_gap(owned.resume_from, resumed_at)
    owned.resume_from = None
    return gap


def _answer(event: Event) -> Event:
    """An event that is no failure; a failure is raised again (not the plan's to handle)."""
    if isinstance(event, Failed):
        raise event.error
    return event


def _position(event: Event) -> Event:
    """A reach check's answer; a failure leaves the partition's position unread this call."""
    if isinstance(event, Failed):
        raise _Unread(event.error)
    return event


class CatchUpPlan:
    """The partitions not caught up yet (:attr:`pending`) and what brings them there (module docstring).

    ``touched(o)``: ``o``'s state changed (the service's schedule, commits and gauges visit it)."""

    def __init__(self, per_step: int, touched: Callable[[Any], None]) -> None:
        self.per_step = per_step
        self._touched = touched
        #: Owned partitions not positioned or not caught up yet.
        self.pending: set[Hashable] = set()
        #: When a catch-up target was last read (ms; 0: never): the broker answered then.
        self.looked_up_ms = 0
        self.confirm_after_ms = 0  # no confirming commit before this (ms), after one that failed
        self.confirm_warned = False  # a failed confirmation was noticed since the last one that passed

    def clock_moved(self, by_ms: int) -> None:
        """The tracker's clock jumped by ``by_ms`` (negative: back): the times kept here move with it."""
        if self.looked_up_ms:
            self.looked_up_ms += by_ms
        if self.confirm_after_ms:
            self.confirm_after_ms += by_ms

    def _pending(self, owned: Mapping[Any, Partition]) -> list[Partition]:
        return [o for o in map(owned.get, self.pending) if o is not None]

    # ------------------------------------------------------------ positioned
    def position(self, owned: Mapping[Any, Partition]) -> Steps:
        """Seek pending partitions not positioned yet (at most :attr:`per_step`) to their committed
        offsets; returns the ``tp`` s positioned. Their targets are cleared: a target read before
        the seek may be older than the partition's state (read again)."""
        new = sorted((o for o in self._pending(owned) if not o.positioned), key=lambda o: o.tp)[:self.per_step]
        if not new:
            return set()
        tps = [o.tp for o in new]
        committed = yield ReadCommitted(tps)
        if isinstance(committed, Failed):
            yield CommittedUnread(tps, committed.error)
            return set()
        for o in new:
            off = committed.get(o.tp)
            _answer((yield Seek(o.tp, off)))
            o.positioned = True
            o.target = None
            o.state.position = off
            o.committed = off
            o.resume_from = off
            self._touched(o)
        return set(tps)

    # ------------------------------------------------------------ targets
    def read_targets(self, owned: Mapping[Any, Partition], now_ms: int, failing: bool = False) -> Steps:
        """Look up the targets still missing, at most :attr:`per_step`: of the positioned partitions
        whose last look-up was answered, or (``failing``) of those whose last one was not and whose
        own backoff is over (``now_ms``: the time of the look-up)."""
        fresh = dict(sorted((o.tp, o.committed) for o in self._pending(owned)
                            if o.positioned and o.target is None and bool(o.lookup_failures) == failing
                            and o.recheck_ms <= now_ms)[:self.per_step])
        if not fresh:
            return None
        got = yield ReadEnds(fresh)
        ends, failed = ({}, {tp: str(got.error) for tp in fresh}) if isinstance(got, Failed) else (got.ends, got.failed)
        for tp, end in ends.items():
            o = owned[tp]
            o.target, o.target_ms, o.lookup_failures = end, now_ms, 0
        if ends:
            self.looked_up_ms = now_ms
        unanswered = [owned[tp] for tp in fresh if tp not in ends]
        if unanswered:
            answered_ms = yield CLOCK  # the backoff counts from the answer: the look-up may have waited long
            delay = max(o.lookup_failed(answered_ms) for o in unanswered)
            yield TargetsUnread(unanswered, next(iter(failed.values()), "no answer"), delay)
        return None

    # ------------------------------------------------------------ reached, confirmed, caught up
    def reach(self, owned: Mapping[Any, Partition]) -> Steps:
        """Compare the positions of the positioned partitions with a target to their targets,
        confirm the doubted ones that reached it, and let those caught up go; returns them."""
        unread: list[Any] = []
        reached: list[Partition] = []
        cause: BaseException | None = None
        for o in self._pending(owned):
            if not o.positioned or o.target is None:
                continue
            try:
                if (yield from self._reached(o)):
                    reached.append(o)
            except _Unread as exc:  # the position was not read: next call, like a target
                unread.append(o.tp)
                cause = exc.error
        confirmed = yield from self._confirm([o for o in reached if o.doubted])
        caught = [o for o in reached if not o.doubted] + confirmed
        for o in caught:
            o.caught_up = True
            o.read_through_ms = o.target_ms
            self.pending.discard(o.tp)
            self._touched(o)
        if caught:
            yield CaughtUp(caught, len(self.pending))
        if unread:
            yield PositionsUnread(unread, cause)  # type: ignore[arg-type]  # set with unread
        return caught

    def _reached(self, o: Partition) -> Steps:
        """Whether the position reached the target (raises :class:`_Unread`: not known this call)."""
        if o.resume_from is not None and o.state.position == o.resume_from:
            yield from self._check_resume_position(o)
        assert o.target is not None  # reach() asks for a partition with a target only
        pos = o.state.position
        if pos is None and o.target == 0:
            # An empty log (its end is 0, so its start too): nothing to replay, no position to ask for.
            pos = o.state.position = 0
        if pos is None:
            pos = o.state.position = _position((yield ReadPosition(o.tp)))
        return pos is not None and pos >= o.target

    def _check_resume_position(self, o: Partition) -> Steps:
        """Nothing read yet since resuming: check where the consumer actually is."""
        cur = _position((yield ReadPosition(o.tp)))
        if cur is not None and cur != o.resume_from:
            # The consumer's offset reset moved the position before anything was read.
            yield from self._resumed(o, cur)
            o.state.position = cur
        elif o.resume_from > o.target:  # type: ignore[operator]  # both set: see _reached
            # Committed offset past the log end (topic recreated or truncated). Kafka's fetch would
            # reset to the log start on its own; do it explicitly rather than rely on the broker.
            _position((yield Seek(o.tp, None)))
            start = _position((yield ReadPosition(o.tp)))
            if start is None:
                # The client cannot tell the log start yet: asked again on the next look, and the
                # first record read after the seek tells the gap (resumed() on its offset).
                o.state.position = None
                return None
            yield from self._resumed(o, start)
            o.state.position = start
        return None

    @staticmethod
    def _resumed(o: Partition, at: int) -> Steps:
        gap = resumed(o, at)
        if gap is not None:
            yield ResumedElsewhere(o, gap)

    def _confirm(self, doubted: Sequence[Partition]) -> Steps:
        """Commit the ``doubted`` partitions (re-read after a membership doubt, caught up to their
        targets) at their committable offsets; returns them if the group accepted, else none.

        The commit carries the generation the client holds: accepted, this member still owns them
        (the group moves a partition later only through a rebalance the listener sees, or after
        another pause, which is doubted again). Refused as fenced, another member owns them; the
        client rejoins the group at its next poll and the listener revokes them. Nothing is
        redelivered from them meanwhile: copies the new owner makes too would be duplicates."""
        if not doubted:
            return []
        now = yield CLOCK
        if now < self.confirm_after_ms:
            return []
        offsets = {o.tp: o.state.committable_offset() for o in doubted}
        got = yield Commit({tp: c for tp, c in offsets.items() if c is not None})
        if isinstance(got, Refused):
            self.confirm_after_ms = now + CONFIRM_RETRY_MS  # the rejoin revokes them meanwhile, if refused
            first, self.confirm_warned = not self.confirm_warned, True
            yield ConfirmRefused(list(offsets), got.error, got.rebalanced, first)
            return []
        _answer(got)
        for o in doubted:
            o.doubted = False
            if offsets[o.tp] is not None:
                o.committed = offsets[o.tp]
        self.confirm_warned = False
        yield Confirmed(list(offsets))
        return list(doubted)
