"""Scheduled delivery: a message that must not reach user code before a time, pure.

A producer in any language schedules a message with one header,
``kmq-not-before: <epoch ms>`` (ascii decimal; :func:`schedule` builds it).
A worker that fetches it before its time does not hand it over: it STARTs it
like any record and gives it straight back with a NACK *not a delivery* whose
delay runs to that time (docs/protocol.md, "Scheduled delivery"), so the
tracker copies it when it is due, with the delivery count it had. The markers
make the wait durable: tracker and worker restarts keep it.

The longest wait is the tracker's longest hold, half the queue's markers
retention (:func:`longest_delay_ms`): the tracker needs the message's START in
the markers topic when it makes the copy. Per record, :func:`decide` answers:

=====================================  ===========================================================
the header                             what the worker does
=====================================  ===========================================================
absent, or its time has come           hands the message over (``DELIVER``)
malformed (not ascii digits, too long) hands it over now, with a warning, counted (``MALFORMED``)
up to the longest delay ahead          gives it back until then, no delivery counted (``HOLD``)
beyond the longest delay               rejects it to the DLQ with a reason naming the header (``REJECT``)
=====================================  ===========================================================

Pure: no Kafka, no clock of its own (``now_ms`` is passed in; only the
producer helper :func:`schedule` reads the wall clock when not given one).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Sequence

from kmq.core.errors import KmqError
from kmq.core.markers import MAX_U32

__all__ = [
    "HEADER_NOT_BEFORE",
    "DEFAULT_LONGEST_DELAY_S",
    "ScheduleError",
    "Verdict",
    "Decision",
    "decide",
    "longest_delay_ms",
    "schedule",
]

#: The header of a scheduled message: epoch milliseconds, ascii decimal.
HEADER_NOT_BEFORE = "kmq-not-before"
#: The longest delay with the default markers retention (7 days): half of it.
DEFAULT_LONGEST_DELAY_S = 7 * 86400 / 2
# More digits than any epoch ms this side of the year 33658: not a time.
_MAX_DIGITS = 15


class ScheduleError(KmqError, ValueError):
    """A schedule the queue cannot keep (beyond its longest delay, not a finite time). Also a
    :class:`ValueError`."""


class Verdict(str, Enum):
    DELIVER = "deliver"
    MALFORMED = "malformed"
    HOLD = "hold"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Decision:
    """What a worker does with one fetched record (see the module docstring)."""

    verdict: Verdict
    delay_ms: int = 0  # HOLD: give back for this long
    reason: str = ""  # MALFORMED: the warning; REJECT: the dead letter's reason


_DELIVER = Decision(Verdict.DELIVER)


def longest_delay_ms(markers_retention_s: float) -> int:
    """The longest a queue whose markers are kept ``markers_retention_s`` seconds can hold a
    scheduled message: half that retention (the tracker's longest hold), at most the NACK's u32 ms."""
    return min(MAX_U32, int(markers_retention_s * 1000 / 2))


def decide(headers: Sequence[tuple[str, bytes | None]] | None, now_ms: int, longest_ms: int) -> Decision:
    """The worker's decision for a record with ``headers`` fetched at ``now_ms`` (epoch ms, the
    worker's clock) on a queue whose longest delay is ``longest_ms``. The last
    ``kmq-not-before`` header counts (as a later writer's would)."""
    if not headers:
        return _DELIVER
    found, raw = False, None
    for k, v in headers:
        if k == HEADER_NOT_BEFORE:
            found, raw = True, v
    if not found:
        return _DELIVER
    if raw is None:  # a null header value (Kafka allows one)
        return Decision(Verdict.MALFORMED, reason=f"{HEADER_NOT_BEFORE} has a null value; delivered now")
    if not raw or len(raw) > _MAX_DIGITS or not raw.isdigit() or not raw.isascii():
        shown = bytes(raw[:40]).decode("ascii", "replace")
        return Decision(Verdict.MALFORMED, reason=f"{HEADER_NOT_BEFORE} {shown!r} is not epoch milliseconds in "
                                                  "ascii decimal; delivered now")
    delay = int(raw) - now_ms
    if delay <= 0:
        return _DELIVER
    if delay > longest_ms:
        return Decision(Verdict.REJECT, reason=f"{HEADER_NOT_BEFORE} {int(raw)} is {delay / 1000:.0f}s ahead, beyond "
                                               f"the queue's longest delay of {longest_ms / 1000:.0f}s (half its "
                                               "markers retention): schedule it sooner or keep the markers longer")
    return Decision(Verdict.HOLD, delay_ms=delay)


def schedule(delay: float | None = None, *, at: float | datetime | None = None,
             longest: float = DEFAULT_LONGEST_DELAY_S, now: float | None = None) -> list[tuple[str, bytes]]:
    """The headers that schedule a message ``delay`` seconds from now, or ``at`` a time (epoch
    seconds or an aware :class:`~datetime.datetime`): pass them as the record's headers
    (kafka-python ``send(..., headers=...)``, confluent-kafka ``produce(..., headers=...)``;
    add your own to the list). ``longest``: the queue's longest delay in seconds, half its
    ``markers_retention`` (default: half of 7 days). Raises :class:`ScheduleError` for a time
    further ahead than that (a worker would dead-letter the message) or not finite."""
    if (delay is None) == (at is None):
        raise TypeError("schedule() takes either delay (seconds from now) or at (a time), not both or neither")
    now_s = time.time() if now is None else float(now)
    if at is None:
        when = now_s + float(delay)  # type: ignore[arg-type]
    elif isinstance(at, datetime):
        if at.tzinfo is None:
            raise ScheduleError(f"at={at!r} has no time zone: pass an aware datetime (e.g. tzinfo=timezone.utc)")
        when = at.timestamp()
    else:
        when = float(at)
    if not math.isfinite(when):
        raise ScheduleError(f"a scheduled time must be finite, got {when!r}")
    ahead = when - now_s
    if ahead > longest:
        raise ScheduleError(f"the message would wait {ahead:.0f}s, beyond the queue's longest delay of {longest:.0f}s "
                            "(half its markers retention; a worker would dead-letter it): schedule it sooner, or "
                            "raise queues[].markers_retention and pass longest=")
    return [(HEADER_NOT_BEFORE, str(max(0, int(math.ceil(when * 1000)))).encode("ascii"))]
