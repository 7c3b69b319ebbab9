"""One tracker step's round over its due markers partitions, decided without I/O.

The service pops the partitions due now (:class:`~kmq.core.due_schedule.DueSchedule`)
and drives :func:`serve_due` over them: it carries out each action the round
yields and answers it::

    action                       answered by
    LookUpEnds(parts, failing)   the partitions asked (kmq.core.end_lookups decides whom)
    Stopping()                   whether the service is stopping
    Mono()                       the monotonic time (s)
    Clock()                      the time now (ms)
    Redeliver(part, items)       the records produced (tracker.redeliver)
    Doubted(part, copies)        whether the membership is in doubt now (the view is dropped then)
    RetryTargets()               OK, once the catch-up targets that got no answer were asked again

* The partitions' read-through times are moved on first, so no lease is
  judged on markers not read yet.
* Served least recently served first, until the step's ``budget_s`` is spent or
  the service stops: a slow partition delays the others by one step at most;
  those not served are touched (still due: served first next step).
* A partition is handed its due items only once caught up, at most ``limit``
  of them, up to its horizon now; one that got items counts as served now.
* After a partition's redelivery the membership is checked: in doubt, the round
  ends there (the copies made are counted by the service as possible duplicates).
* Last, unless stopping: the look-ups that got no answer last time are asked
  again, each after its own backoff, apart from the others (each may wait out the
  reader's timeout), and so are the catch-up targets.

``touched(o)``: ``o``'s visits may have changed (the service's schedule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Protocol, Sequence

__all__ = ["Doubted", "LookUpEnds", "Mono", "MONO", "Clock", "CLOCK", "Partition", "Redeliver", "RetryTargets",
           "RETRY_TARGETS", "Stopping", "STOPPING", "serve_due"]


class Partition(Protocol):
    """What the round reads and changes of a partition (:class:`tracker.partition.OwnedPartition`)."""

    state: Any  # its kmq.core.lease_state.PartitionState: due(horizon, limit=)
    caught_up: bool
    served: float  # monotonic time its due items were last handed out

    def horizon(self, now_ms: int) -> int: ...


@dataclass(frozen=True, slots=True)
class LookUpEnds:
    """Move the read-through times of ``partitions`` on (``failing``: of those whose last look-up
    got no answer; answer: the partitions asked)."""

    partitions: list[Any]
    failing: bool


@dataclass(frozen=True, slots=True)
class Stopping:
    """Answer whether the service is stopping."""


@dataclass(frozen=True, slots=True)
class Mono:
    """Answer with the monotonic time (s)."""


@dataclass(frozen=True, slots=True)
class Clock:
    """Answer with the time now (ms)."""


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Hand ``items`` of ``partition`` to the redeliverer (answer: the records produced)."""

    partition: Any
    items: list[Any]


@dataclass(frozen=True, slots=True)
class Doubted:
    """Answer whether the membership is in doubt after ``partition``'s redelivery made ``copies``."""

    partition: Any
    copies: int


@dataclass(frozen=True, slots=True)
class RetryTargets:
    """Ask again for the catch-up targets whose last look-up got no answer (answer: OK)."""


STOPPING, MONO, CLOCK, RETRY_TARGETS = Stopping(), Mono(), Clock(), RetryTargets()


def serve_due(due: Sequence[Partition], began_s: float, budget_s: float, limit: int,
              touched: Callable[[Any], None]) -> Generator[Any, Any, None]:
    """The round over the ``due`` partitions of a step begun at ``began_s`` (monotonic; module docstring)."""
    order = sorted(due, key=lambda o: o.served)
    yield LookUpEnds(order, failing=False)
    for i, o in enumerate(order):
        if (yield STOPPING) or (yield MONO) - began_s >= budget_s:
            for later in order[i:]:
                touched(later)  # still due: served first next step
            break
        items = o.state.due(o.horizon((yield CLOCK)), limit=limit) if o.caught_up else []
        copies = (yield Redeliver(o, items)) if items else 0
        if items:
            o.served = yield MONO
        touched(o)
        if items and (yield Doubted(o, copies)):
            return
    if not (yield STOPPING):
        for o in (yield LookUpEnds(order, failing=True)):
            touched(o)
        yield RETRY_TARGETS
