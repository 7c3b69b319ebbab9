"""One partition's redelivery step, decided without I/O.

The tracker hands the due items of a markers partition
(:meth:`~kmq.core.lease_state.PartitionState.due`) to its I/O shell
(``tracker/redeliver.py``), which reads the original records and then asks
this module what to do, executes the answer and reports back::

    plan(state, items, read, now)   -> StepPlan   close as missing, wait (backoff), send
    settle(sends, results, now)     -> Settled    close with an outcome, send a fallback, retry
    retry_at_ms(failures, now)      -> int        when failed offsets are handed out again

Per due offset, :func:`plan` decides:

* not in the queue log (the read passed it without finding it: deleted below
  the log start by retention or DeleteRecords, or a gap in the log): close as
  ``MISSING``;
* at or past the end of the log the read ran into: *not yet*, never a close.
  A START names offsets a consumer had fetched, so they existed: a read that
  ends below one proves nothing (a new leader's high-water mark lagging behind
  the old one's; a reader that stops at an open transaction). They wait with a
  capped backoff (``past_end``) and are read again;
* the backoff for its delivery count is not over: wait (``defer``);
* ``REJECT``, or the delivery count reached ``max_deliveries``: dead-letter;
* else copy it to the queue, unless it cannot be copied as it is (a
  tombstone, :func:`~kmq.core.copies.copy_problem`): dead-letter it as
  ``undeliverable``;
* asked for but neither found nor reported missing (a reader that stopped
  short): retry later.

Per send result, :func:`settle` decides (:func:`~kmq.core.copies.fallback`):
acknowledged -> close (``REDELIVERED``, ``DEAD_LETTERED``, or
``UNDELIVERABLE`` for a reference dead letter); refused for good -> the next
step in the same call (copy -> dead letter -> reference -> closed as
undeliverable without one); transient -> retry after a capped backoff. One
record's failure never holds back the others: what succeeded is closed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, NamedTuple, Protocol, Sequence

from kmq.core.backoff import backoff_delay
from kmq.core.copies import MAX_ERROR_CHARS, REASON_UNDELIVERABLE, Fallback, Step, copy_problem, fallback
from kmq.core.lease_state import Action, DueItem, PartitionState, Plan
from kmq.core.markers import MAX_U32, Outcome
from kmq.core.message import delivery_count_of
from kmq.core.ranges import OffsetRange, RangeSet, coalesce

__all__ = [
    "RecordLike", "Send", "SendResult", "SENT", "Defer", "StepPlan", "Settled",
    "plan", "settle", "retry_at_ms", "retry_delay_s", "wanted_ranges", "take_chunk", "below", "chunk_offsets",
    "closed_chunks",
    "closed_ranges_limit", "MAX_CLOSED_RANGES",
]

# Failed attempts are retried after 0.5 s, 1 s, 2 s, ... at most 30 s.
_RETRY_INITIAL_S = 0.5
_RETRY_CAP_S = 30.0
# The largest Kafka offset: "at or past the log end" is the range from it to here.
_MAX_OFFSET = (1 << 63) - 1
# Most ranges one CLOSED marker may carry (u16 in the wire format).
MAX_CLOSED_RANGES = 0xFFFF
_OUTCOME = {Step.COPY: Outcome.REDELIVERED, Step.DEAD_LETTER: Outcome.DEAD_LETTERED,
            Step.REFERENCE: Outcome.UNDELIVERABLE}


class RecordLike(Protocol):
    """What the planner reads of an original record (either client's record fits)."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] | None


class Send(NamedTuple):
    """One record to produce: a copy to the queue, or a dead letter (with or without its payload).
    A tuple: one is made per offset redelivered (a frozen dataclass cost three times as much)."""

    offset: int
    step: Step
    count: int  # type: ignore[assignment]  # delivery count of the record read (a copy carries count + 1)
    reason: str  # copy: why redelivered (timeout, nack); dead letter: kmq-dlq-reason
    error: str = ""  # kmq-dlq-error
    due_ms: int = 0  # when its lease became due (the redelivery delay metric)
    failures: int = 0  # earlier failed attempts (the retry backoff)


@dataclass(frozen=True, slots=True)
class SendResult:
    """How one send ended, as the I/O shell classified the client's answer."""

    cause: str | None = None  # None: acknowledged; else kmq_tracker_record_failures_total{cause}
    permanent: bool = False  # the same send would fail again however often it is retried
    detail: str = ""  # the client's error, for dead letter headers and logs


SENT = SendResult()


@dataclass(frozen=True, slots=True)
class Defer:
    """Offsets whose backoff is not over: hand them out again at ``until_ms``."""

    ranges: tuple[OffsetRange, ...]
    until_ms: int
    count: int  # their delivery count, now known

    @property
    def offset_count(self) -> int:
        return sum(r.count for r in self.ranges)


@dataclass
class StepPlan:
    """What :func:`plan` decided for the due items of one partition."""

    missing: list[OffsetRange] = field(default_factory=list)  # close with Outcome.MISSING
    defer: list[Defer] = field(default_factory=list)
    sends: list[Send] = field(default_factory=list)
    unread: list[OffsetRange] = field(default_factory=list)  # neither read nor missing: retry
    retry_at_ms: int | None = None  # for ``unread``
    # Open offsets at or past the log end the read ran into: not yet in the log as read, never closed;
    # they (and every other offset at or past that end that is due) are read again at past_end_at_ms.
    past_end: list[OffsetRange] = field(default_factory=list)
    past_end_at_ms: int | None = None
    log_end: int | None = None  # the end the read ran into (the shell holds back what is due past it)


@dataclass
class Settled:
    """What :func:`settle` decided from the results of a round of sends."""

    closed: dict[Outcome, list[Send]] = field(default_factory=lambda: defaultdict(list))
    fallbacks: list[Send] = field(default_factory=list)  # to send next, in the same step
    retry: list[Send] = field(default_factory=list)  # transient failures: hand out again at retry_at_ms
    retry_at_ms: int | None = None
    unreferenced: list[Send] = field(default_factory=list)  # closed undeliverable with no record in the DLQ

    def closed_offsets(self, outcome: Outcome) -> list[int]:
        return [s.offset for s in self.closed.get(outcome, ())]


def retry_delay_s(failures: int) -> float:
    """Seconds before offsets that failed ``failures`` times before are tried again (0.5 s doubling, <= 30 s)."""
    return backoff_delay(max(0, failures) + 1, _RETRY_INITIAL_S, _RETRY_CAP_S, 2.0)


def retry_at_ms(failures: int, now_ms: int) -> int:
    """When offsets whose worst earlier failure count is ``failures`` are handed out again."""
    return now_ms + int(retry_delay_s(failures) * 1000)


def wanted_ranges(items: Iterable[DueItem]) -> list[OffsetRange]:
    """The queue offsets to read for ``items``, coalesced."""
    return RangeSet(r for i in items for r in i.ranges).ranges()


def take_chunk(items: Sequence[DueItem], max_offsets: int) -> tuple[list[DueItem], list[DueItem]]:
    """The first ``max_offsets`` offsets of ``items`` (at least one) and the rest, in order: what the
    shell reads and sends at once. An item is cut where the chunk ends; both parts keep its lease
    fields, so every decision about an offset is the same as for the whole item."""
    chunk: list[DueItem] = []
    room = max(1, max_offsets)
    for i, item in enumerate(items):
        size = item.offset_count
        if size <= room:
            chunk.append(item)
            room -= size
            if room == 0:
                return chunk, list(items[i + 1:])
            continue
        head, tail = _cut_ranges(item.ranges, room)
        chunk.append(replace(item, ranges=head))
        return chunk, [replace(item, ranges=tail), *items[i + 1:]]
    return chunk, []


def below(items: Sequence[DueItem], end: int) -> list[DueItem]:
    """``items`` cut to their offsets below ``end`` (items with none left are dropped): what is still
    worth reading once a read ran into the log end at ``end``."""
    out: list[DueItem] = []
    for item in items:
        if item.ranges[-1].end <= end:
            out.append(item)
            continue
        kept = tuple(OffsetRange(r.first, min(r.end, end) - r.first) for r in item.ranges if r.first < end)
        if kept:
            out.append(replace(item, ranges=kept))
    return out


def chunk_offsets(record_bytes: float, chunk_bytes: int, most: int) -> int:
    """How many offsets to read at once when records are about ``record_bytes`` each: about
    ``chunk_bytes`` of them, at least one, at most ``most``."""
    return max(1, min(most, int(chunk_bytes // max(1.0, record_bytes))))


def _cut_ranges(ranges: Sequence[OffsetRange], n: int) -> tuple[tuple[OffsetRange, ...], tuple[OffsetRange, ...]]:
    """``ranges`` split after their first ``n`` offsets (0 < n < their count)."""
    head: list[OffsetRange] = []
    for i, r in enumerate(ranges):
        if r.count < n:
            head.append(r)
            n -= r.count
            continue
        if r.count == n:
            return (*head, r), tuple(ranges[i + 1:])
        return (*head, OffsetRange(r.first, n)), (OffsetRange(r.first + n, r.count - n), *ranges[i + 1:])
    return tuple(head), ()


def plan(state: PartitionState, items: Sequence[DueItem], records: Mapping[int, RecordLike],
         missing: Iterable[tuple[int, int]], log_end: int | None, now_ms: int) -> StepPlan:
    """Decide for every offset of ``items`` given what the read found (``records`` by offset),
    what it reported ``missing`` and the log end it ran into (None: it did not). Nothing at or past
    ``log_end`` is closed, also when a reader reported it missing."""
    gone = RangeSet(missing)
    if log_end is not None:
        gone.remove(log_end, _MAX_OFFSET - log_end)
    out = StepPlan(missing=state.open_within(gone) if gone else [], log_end=log_end)
    deferred: dict[tuple[int, int], list[int]] = defaultdict(list)
    unread: list[int] = []
    for item in items:
        _plan_item(state, item, records, gone, log_end, now_ms, out.sends, deferred, unread)
    out.defer = [Defer(tuple(coalesce(offs)), until, count) for (until, count), offs in deferred.items()]
    out.unread = state.open_within(coalesce(unread)) if unread else []
    if out.unread:
        out.retry_at_ms = retry_at_ms(max(i.failures for i in items), now_ms)
    if log_end is not None:
        _plan_past_end(out, state, items, log_end, now_ms)
    return out


def _plan_item(state: PartitionState, item: DueItem, records: Mapping[int, RecordLike], gone: RangeSet,
               log_end: int | None, now_ms: int, sends: list[Send], deferred: dict[tuple[int, int], list[int]],
               unread: list[int]) -> None:
    """The offsets of one due item: a send each (to ``sends``), deferred by (until, count), or unread."""
    # One pass per offset of a backlog: names looked up once (an enum member through its class
    # costs a few hundred ns), and each Send built from the fields its item and count share.
    add, get, new_send, problem = sends.append, records.get, tuple.__new__, copy_problem
    wait, dead = Action.WAIT, Action.DEAD_LETTER
    # By delivery count: the decision and the send's fields, the same for every record of the item.
    decided: dict[int, tuple[Plan, tuple]] = {}
    for r in item.ranges:
        for off in r.offsets():
            rec = get(off)
            if rec is None:
                if off not in gone and (log_end is None or off < log_end):
                    unread.append(off)
                continue  # missing, or past the log end (below)
            headers = rec.headers
            count = delivery_count_of(headers) if headers else 1  # no headers: a first delivery
            entry = decided.get(count)
            if entry is None:
                decision = state.plan(item, count, now_ms)
                entry = decided[count] = (decision, _send_fields(item, count, decision))
            decision, fields = entry
            action = decision.action
            if action is wait:
                deferred[(decision.until_ms, count)].append(off)  # type: ignore[index]  # WAIT sets until_ms
            elif action is dead or problem(rec.key, rec.value) is None:
                add(new_send(Send, (off, *fields)))  # Send(off, *fields) without its Python-level __new__
            else:
                add(_first_send(item, off, rec, count, action, decision.dlq_reason))


def _plan_past_end(out: StepPlan, state: PartitionState, items: Sequence[DueItem], log_end: int,
                   now_ms: int) -> None:
    """The open offsets of ``items`` at or past ``log_end``: never closed, retried later."""
    past = [i for i in items if i.ranges[-1].end > log_end]
    out.past_end = state.open_within(
        (max(r.first, log_end), r.end - max(r.first, log_end)) for i in past for r in i.ranges if r.end > log_end)
    if out.past_end:
        out.past_end_at_ms = retry_at_ms(max(i.failures for i in past), now_ms)

def settle(sends: Sequence[Send], results: Sequence[SendResult], now_ms: int) -> Settled:
    """Decide from each send's result (``results[i]`` is the result of ``sends[i]``)."""
    out = Settled()
    for s, res in zip(sends, results, strict=True):
        if res.cause is None:
            out.closed[_OUTCOME[s.step]].append(s)
            continue
        move = fallback(s.step, res.permanent)
        if move is Fallback.RETRY:
            out.retry.append(s)
        elif move is Fallback.DEAD_LETTER:
            out.fallbacks.append(s._replace(step=Step.DEAD_LETTER, reason=REASON_UNDELIVERABLE,
                                            error=_cut(f"copy to the queue refused: {res.detail}")))
        elif move is Fallback.REFERENCE:
            earlier = f"; {s.error}" if s.error else ""
            out.fallbacks.append(s._replace(step=Step.REFERENCE, reason=REASON_UNDELIVERABLE,
                                            error=_cut(f"dead letter ({s.reason}) refused by the DLQ: {res.detail}"
                                                       f"{earlier}")))
        else:
            out.closed[Outcome.UNDELIVERABLE].append(s)
            out.unreferenced.append(s)
    if out.retry:
        out.retry_at_ms = retry_at_ms(max(s.failures for s in out.retry), now_ms)
    return out


def _send_fields(item: DueItem, count: int, decision: Plan) -> tuple:
    """The fields after the offset of the :class:`Send` a record of ``item`` gets (as
    :func:`_first_send` makes it for a record that can be copied as it is)."""
    if decision.action is Action.DEAD_LETTER:
        return (Step.DEAD_LETTER, count, decision.dlq_reason or "timeout", item.error, item.due_ms, item.failures)
    return (Step.COPY, count, item.reason.value, "", item.due_ms, item.failures)


def _first_send(item: DueItem, offset: int, rec: RecordLike, count: int, action: Action,
                dlq_reason: str | None) -> Send:
    if action is Action.DEAD_LETTER:
        return Send(offset, Step.DEAD_LETTER, count, dlq_reason or "timeout", item.error, item.due_ms, item.failures)
    problem = copy_problem(rec.key, rec.value)
    if problem is not None:
        return Send(offset, Step.DEAD_LETTER, count, REASON_UNDELIVERABLE, problem, item.due_ms, item.failures)
    return Send(offset, Step.COPY, count, item.reason.value, "", item.due_ms, item.failures)


def _cut(text: str) -> str:
    return text[:MAX_ERROR_CHARS]


def closed_chunks(ranges: Iterable[OffsetRange], max_ranges: int = MAX_CLOSED_RANGES) -> list[list[OffsetRange]]:
    """Ranges of the CLOSED markers for ``ranges``, each fitting the wire format: counts within u32
    (coalesced STARTs can be longer), at most ``max_ranges`` ranges a marker (u16, and the producer's
    request size), and no two adjacent pieces in one marker (the encoder would merge them)."""
    groups: list[list[OffsetRange]] = [[]]
    for r in ranges:
        first, left = r.first, r.count
        while left:
            n = min(left, MAX_U32)
            cur = groups[-1]
            if len(cur) >= max_ranges or (cur and cur[-1].end == first):
                cur = []
                groups.append(cur)
            cur.append(OffsetRange(first, n))
            first, left = first + n, left - n
    return [g for g in groups if g]


def closed_ranges_limit(max_request_size: int) -> int:
    """Most ranges one CLOSED marker may carry for a producer of ``max_request_size`` bytes
    (12 bytes a range, plus headroom), at most the wire format's u16."""
    return max(1, min(MAX_CLOSED_RANGES, (max_request_size - 512) // 12))
