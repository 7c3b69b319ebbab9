"""The tracker's look-ups of its markers partitions' log ends, decided without I/O.

A lease is judged over only up to a partition's read-through time: every marker
written before it was applied (:meth:`tracker.partition.OwnedPartition.horizon`).
The service moves that time on by looking up log ends. Per step it asks
:meth:`EndLookups.choose` whom to ask, looks the ends up (one batched call,
answered partition by partition), and tells :meth:`EndLookups.answered` what
came back::

    choose(due, now, failing)                -> Lookup | None   the partitions to ask
    answered(lookup, ends, now, after, ...)  -> Answer          what the answers mean

* Asked: the due partitions that want their end (something due past what is
  known, :meth:`~tracker.partition.OwnedPartition.wants_end`), at most
  ``most`` a step; those whose last look-up was answered in one call, those
  whose last one was not (``failing``) in another, after their own backoff,
  so a partition whose leader does not answer costs the others nothing.
* Probed: when nothing is asked while leases are due and no look-up was
  answered for ``probe_interval_ms``, one partition's end, to tell whether
  the broker is there at all (a read that stopped is no error of its own).
* An answer moves the partition's read-through time on (not a probe's).
* A look-up answered for none of the partitions asked, of which some were
  answered last time, is taken for the broker being away from the last good
  look-up on (the *outage*) when it asked two partitions or more, or was a
  probe: one partition's silence is its own (its leader may be away, not the
  broker), and it backs off alone. At the next answer every partition holds the
  leases due since then until the markers written in the next ``grace_ms``
  were read (their consumers retry their ENDs and RENEWs now), and those whose
  look-ups failed are asked again at once, in their own look-up: a partition
  still silent then costs the others nothing.
* A partition answered again after its own look-ups were not is held the
  same way, alone.
* A partition not answered backs off on its own, 0.5 s doubling to 30 s.

The partitions are the service's :class:`~tracker.partition.OwnedPartition`
(any object with its look-up fields and methods, :class:`Partition`); times
are milliseconds on the tracker's clock, passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Hashable, Iterable, Mapping, Protocol, Sequence, TypeVar

__all__ = ["Answer", "EndLookups", "Lookup", "Partition", "offsets_to_commit"]


class Partition(Protocol):
    """What the look-ups read and change of a partition (:class:`tracker.partition.OwnedPartition`)."""

    tp: Any
    state: Any  # its kmq.core.lease_state.PartitionState
    caught_up: bool
    committed: int | None
    lookup_failures: int
    recheck_ms: int
    read_through_ms: int
    hold_until_ms: int

    def wants_end(self, now_ms: int, step_offsets: int) -> bool: ...

    def lookup_failed(self, now_ms: int) -> float: ...

    def end_read(self, asked_ms: int, end: int) -> None: ...

    def hold(self, held_from_ms: int, hold_until_ms: int) -> None: ...


P = TypeVar("P", bound=Partition)
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Lookup(Generic[P]):
    """The partitions whose ends to look up now; ``probe``: only to tell whether the broker answers."""

    asked: Sequence[P]
    probe: bool


@dataclass
class Answer(Generic[P]):
    """What a look-up's answer meant, for the service to count and log (the partitions are changed already)."""

    broker_back: tuple[int, int] | None = None  # (unreadable from ms, held until ms): every partition held
    unanswered: list[P] = field(default_factory=list)  # backing off, each on its own
    delay_s: float = 0.0  # the longest of their backoffs
    back: list[P] = field(default_factory=list)  # answered again after their own look-ups were not: held


class EndLookups:
    """The look-ups' own memory: when one was last answered, and since when the broker is away."""

    def __init__(self, step_offsets: int, most: int, probe_interval_ms: int) -> None:
        self.step_offsets = step_offsets  # offsets one step hands out per partition (wants_end)
        self.most = most  # partitions asked in one look-up
        self.probe_interval_ms = probe_interval_ms
        self.looked_up_ms = 0  # when a look-up of a markers partition's end was last answered
        #: (last good look-up, first failed one) while look-ups fail: see :meth:`answered`.
        self.outage: tuple[int, int] | None = None

    def choose(self, due: Sequence[P], now_ms: int, failing: bool = False) -> Lookup[P] | None:
        """The ``due`` partitions to ask (``failing``: those whose last look-up got no answer, once
        their backoff is over), or one to probe; None: no look-up this time."""
        ask = [o for o in due if bool(o.lookup_failures) == failing and o.wants_end(now_ms, self.step_offsets)]
        ask = ask[:self.most]  # the others: next step
        if ask:
            return Lookup(ask, probe=False)
        if failing or now_ms - self.looked_up_ms < self.probe_interval_ms:
            return None
        probe = [o for o in due if o.caught_up and o.state.position is not None and not o.lookup_failures][:1]
        return Lookup(probe, probe=True) if probe else None

    def answered(self, lookup: Lookup[P], ends: Mapping[Any, int | None], now_ms: int, after_ms: int,
                 grace_ms: int, everyone: Iterable[P], touched: Callable[[P], None]) -> Answer[P]:
        """The look-up asked at ``now_ms`` answered ``ends`` (by ``tp``; a partition left out got no
        answer) at ``after_ms``: change the partitions (``everyone``: all the service owns) and say
        what it meant. ``touched(o)``: ``o``'s visits may have changed (the service's schedule)."""
        out: Answer[P] = Answer()
        if ends:
            self.looked_up_ms = now_ms
            if self.outage is not None:
                held_from, failed_ms = self.outage
                until = now_ms + grace_ms
                for o in everyone:
                    o.hold(held_from, until)
                    # Asked again now, still as failing: one whose leader is still away must not slow
                    # the look-ups of the others (the broker's return says nothing of its partition).
                    o.recheck_ms = 0
                    touched(o)
                out.broker_back = (failed_ms, until)
                self.outage = None
        unanswered = [o for o in lookup.asked if ends.get(o.tp) is None]
        if unanswered:  # their backoff counts from the answer: the look-up may have waited long
            if (not ends and self.outage is None and (lookup.probe or len(unanswered) > 1)
                    and any(not o.lookup_failures for o in unanswered)):
                self.outage = (self.looked_up_ms, after_ms)  # leases due since the last good look-up wait
            out.unanswered = unanswered
            out.delay_s = max(o.lookup_failed(after_ms) for o in unanswered)
        for o in lookup.asked:
            end = ends.get(o.tp)
            if end is None:
                continue
            if o.lookup_failures:
                o.lookup_failures = 0
                if o.read_through_ms >= o.hold_until_ms:  # not held already (the broker was back just now)
                    o.hold(o.read_through_ms, now_ms + grace_ms)
                    out.back.append(o)
            if not lookup.probe:
                o.end_read(now_ms, end)
        return out

    def heard(self, at_ms: int) -> None:
        """The broker answered a read of a markers partition's end elsewhere at ``at_ms`` (a
        catch-up target's): a look-up too, so no probe is due before ``probe_interval_ms`` from then."""
        self.looked_up_ms = max(self.looked_up_ms, at_ms)

    def clock_moved(self, by_ms: int) -> None:
        """The tracker's clock jumped by ``by_ms`` (negative: back): the times kept here move with it."""
        if self.looked_up_ms:
            self.looked_up_ms += by_ms
        if self.outage is not None:
            self.outage = (self.outage[0] + by_ms, self.outage[1] + by_ms)


def offsets_to_commit(owned: Mapping[K, Partition], tps: Iterable[K], force: bool = False) -> dict[K, int]:
    """The markers offsets to commit of ``tps`` (of ``owned``): each one's committable offset (below
    its oldest open START, :meth:`~kmq.core.lease_state.PartitionState.committable_offset`) where it
    moved since its last commit (``force``: also where it did not)."""
    out: dict[K, int] = {}
    for tp in tps:
        o = owned.get(tp)
        if o is None:
            continue
        c = o.state.committable_offset()
        if c is not None and (force or c != o.committed):
            out[tp] = c
    return out
