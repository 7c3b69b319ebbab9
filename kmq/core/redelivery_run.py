"""One partition's redelivery run, decided without I/O: reads, sends, judgements and CLOSED markers in order.

The tracker hands the due items of a markers partition to
:class:`RedeliveryRun`; its I/O shell (``tracker/redeliver.py``) carries out
each action the run returns and answers it with an event::

    action                               answered by
    Read(items)                          ReadResult(records, missing, log_end, size)
    Clock()                              the time now (ms)
    CloseMissing(ranges)                 OK, once Kafka acknowledged the CLOSED markers
    StartSends(sends, records, now_ms)   Started(handle): the shell's token for those sends
    Judge(handles, what)                 Judged(results): each handle's send results, in order
    WriteClosed(ranges, outcome)         OK (a write that failed is only logged: the copies exist)
    Deferred, Unread, HeldPastEnd,       OK: done to the state already; the shell counts and logs
    SettledRound, SendsRetried, RetriedAll

Any I/O action may instead be answered by :class:`Failed`. The run changes
its :class:`~kmq.core.lease_state.PartitionState` itself, each change at its
place in that order (an offset is closed as missing only after its CLOSED
marker was acknowledged; an outcome's offsets are closed before its CLOSED
marker is written, as the copies exist).

The order, per chunk of the due offsets (at most a chunk's bytes of the
queue's records, as seen so far):

1. read the originals, ask :func:`~kmq.core.redelivery_plan.plan`; close what
   the read proved gone, defer what waits a backoff, retry what was neither
   read nor reported missing, hold back what is at or past the end the read
   ran into (the next chunks are cut below that end), start the sends;
2. once the sends started hold :attr:`round_bytes` of originals, or no chunk
   is left: judge them all at once, :func:`~kmq.core.redelivery_plan.settle`
   each, send the fallbacks and judge those, until none is left; then close
   and write the outcomes, and retry the failed sends with a capped backoff.

A failure while reading or starting a chunk first judges what was started,
then retries that chunk and every chunk after it; a failure anywhere else
retries every offset of the run that is still open. Nothing is closed without
a read or an acknowledgement that proves it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Sequence

from kmq.core.lease_state import DueItem, PartitionState
from kmq.core.markers import Outcome
from kmq.core.ranges import OffsetRange, coalesce
from kmq.core.redelivery_plan import (
    Send,
    SendResult,
    Settled,
    below,
    chunk_offsets,
    plan,
    retry_at_ms,
    settle,
    take_chunk,
    wanted_ranges,
)

__all__ = [
    "RedeliveryRun", "Read", "Clock", "CLOCK", "CloseMissing", "StartSends", "Judge", "WriteClosed", "Deferred",
    "Unread", "HeldPastEnd", "SettledRound", "SendsRetried", "RetriedAll", "ReadResult", "Started", "Judged",
    "Failed", "OK", "REDELIVERIES", "DEAD_LETTERS",
]

# What a Judge action's flush is of (the shell's log line when a flush does not complete).
REDELIVERIES = "redeliveries"
DEAD_LETTERS = "dead letters"


# ------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class Read:
    """Read the originals of ``items`` from the queue partition (answer: :class:`ReadResult`)."""

    items: list[DueItem]

    @property
    def ranges(self) -> list[OffsetRange]:
        return wanted_ranges(self.items)


@dataclass(frozen=True, slots=True)
class Clock:
    """Answer with the time now (ms)."""


CLOCK = Clock()


@dataclass(frozen=True, slots=True)
class CloseMissing:
    """Write CLOSED markers (``MISSING``) of ``ranges`` and wait for Kafka's acknowledgement (answer: OK)."""

    ranges: list[OffsetRange]


@dataclass(frozen=True, slots=True)
class StartSends:
    """Start producing ``sends`` (originals in ``records``) without waiting (answer: :class:`Started`)."""

    sends: list[Send]
    records: Mapping[int, Any]
    now_ms: int


@dataclass(frozen=True, slots=True)
class Judge:
    """Flush the producer, then each handle's send results (answer: :class:`Judged`); ``what``:
    :data:`REDELIVERIES` or :data:`DEAD_LETTERS`."""

    handles: tuple[Any, ...]
    what: str


@dataclass(frozen=True, slots=True)
class WriteClosed:
    """Write CLOSED markers of ``ranges`` with ``outcome`` (already closed in the state; answer: OK)."""

    ranges: list[OffsetRange]
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Deferred:
    """Notice: ``count`` offsets wait for their backoff (deferred in the state)."""

    count: int


@dataclass(frozen=True, slots=True)
class Unread:
    """Notice: ``ranges`` were neither read nor reported missing; retried at ``at_ms``."""

    ranges: list[OffsetRange]
    at_ms: int


@dataclass(frozen=True, slots=True)
class HeldPastEnd:
    """Notice: the read ended at ``log_end`` below ``held``; they are read again at ``at_ms``."""

    held: list[OffsetRange]
    log_end: int
    at_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class SettledRound:
    """Notice: :func:`~kmq.core.redelivery_plan.settle`'s answer for sends started at ``started_ms``."""

    sends: list[Send]
    results: Sequence[SendResult]
    settled: Settled
    records: Mapping[int, Any]
    started_ms: int


@dataclass(frozen=True, slots=True)
class SendsRetried:
    """Notice: ``count`` sends failed and are retried at ``at_ms`` (``first``: the first one's failure)."""

    count: int
    at_ms: int
    first: str


@dataclass(frozen=True, slots=True)
class RetriedAll:
    """Notice: a read or write failed with ``error``; the open ``ranges`` are retried at ``at_ms``."""

    ranges: list[OffsetRange]
    at_ms: int
    now_ms: int
    error: BaseException


# ------------------------------------------------------------ events
@dataclass(frozen=True, slots=True)
class ReadResult:
    """What a read found: ``records`` by offset, what it reported ``missing``, the log end it ran
    into (None: it did not), the payload bytes of the records (keys and values), the time after it."""

    records: Mapping[int, Any]
    missing: Sequence[tuple[int, int]]
    log_end: int | None
    size: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class Started:
    """The shell's token for sends it started (given back in :class:`Judge`)."""

    handle: Any


@dataclass(frozen=True, slots=True)
class Judged:
    """Each handle's send results, in the order of the :class:`Judge` action's handles."""

    results: list[list[SendResult]]


@dataclass(frozen=True, slots=True)
class Failed:
    """The action failed with ``error`` (a read, a send, a CLOSED marker)."""

    error: BaseException


OK = None  # the answer to an action that returns nothing


class _Failure(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class _Batch:
    """Sends started together and not judged yet."""

    sends: list[Send]
    records: Mapping[int, Any]
    now_ms: int
    handle: Any


@dataclass
class _Round:
    """The batches started since the sends were last judged, and the payload bytes they hold."""

    started: list[_Batch] = field(default_factory=list)
    bytes: int = 0


Action = Any  # one of the action classes above
Event = Any  # one of the event classes above, an int (the clock) or OK


class RedeliveryRun:
    """One partition's due ``items`` carried through to closed, deferred or retried (module docstring).

    ``record_bytes``: the queue's records' average size seen so far (the first chunk's size);
    :attr:`record_bytes` is updated by every read. :meth:`start` returns the first action,
    :meth:`send` answers the last one and returns the next (None: the run is over)."""

    def __init__(self, state: PartitionState, items: Sequence[DueItem], record_bytes: float, *,
                 chunk_bytes: int, read_chunk: int, round_bytes: int) -> None:
        self.state = state
        self.items = list(items)
        self.record_bytes = record_bytes
        self._chunk_bytes = chunk_bytes
        self._read_chunk = read_chunk
        self._round_bytes = round_bytes
        self._gen = self._run()

    def start(self) -> Action | None:
        return next(self._gen, None)

    def send(self, event: Event) -> Action | None:
        try:
            return self._gen.send(event)
        except StopIteration:
            return None
        except _Failure as f:  # the retry of every offset itself failed: the caller's to handle
            raise f.error from None

    # ------------------------------------------------------------ the run
    def _run(self) -> Generator[Action, Event, None]:
        try:
            yield from self._chunks()
        except _Failure as f:
            yield from self._retry(self.items, f.error)

    @staticmethod
    def _answer(event: Event) -> Event:
        if isinstance(event, Failed):
            raise _Failure(event.error)
        return event

    def _chunks(self) -> Generator[Action, Event, None]:
        """Read and start sending chunk after chunk (a read waits on the broker while the sends of the
        chunk before are on their way), then judge every send at once; a round is judged early when
        the records it holds reach ``round_bytes`` (memory stays bounded)."""
        pending = _Round()
        rest = list(self.items)
        log_end: int | None = None
        while rest:
            most = chunk_offsets(self.record_bytes, self._chunk_bytes, self._read_chunk)
            if log_end is not None:
                # What is at or past the log end was held back with the read that ran into it.
                rest = below(rest, log_end)
                if not rest:
                    break
            chunk, rest = take_chunk(rest, most)
            try:
                log_end = yield from self._read_and_start(chunk, pending)
            except _Failure as f:
                # What was started is judged and closed first; only the offsets not yet planned are retried.
                yield from self._finish(pending)
                yield from self._retry(chunk + rest, f.error)
                return
            if pending.bytes >= self._round_bytes:
                yield from self._finish(pending)
                pending = _Round()
        yield from self._finish(pending)

    def _read_and_start(self, chunk: list[DueItem], pending: _Round) -> Generator[Action, Event, int | None]:
        """Read ``chunk``'s originals, plan them and start their sends; returns the log end the read
        ran into (None: it did not)."""
        state = self.state
        read: ReadResult = self._answer((yield Read(chunk)))
        if read.records:
            self.record_bytes = read.size / len(read.records)
        now = read.now_ms
        step = plan(state, chunk, read.records, read.missing, read.log_end, now)
        if step.missing:
            self._answer((yield CloseMissing(step.missing)))
            state.close(step.missing)
        for d in step.defer:
            state.defer(d.ranges, d.until_ms, d.count)
        if step.defer:
            self._answer((yield Deferred(sum(d.offset_count for d in step.defer))))
        if step.unread:
            state.retry(step.unread, step.retry_at_ms)  # type: ignore[arg-type]  # set with unread
            self._answer((yield Unread(step.unread, step.retry_at_ms)))  # type: ignore[arg-type]
        if step.past_end:
            held = state.hold_from(step.log_end, now, step.past_end_at_ms)  # type: ignore[arg-type]  # set with past_end
            self._answer((yield HeldPastEnd(held, step.log_end, step.past_end_at_ms, now)))  # type: ignore[arg-type]
        if step.sends:
            started: Started = self._answer((yield StartSends(step.sends, read.records, now)))
            pending.started.append(_Batch(step.sends, read.records, now, started.handle))
            pending.bytes += read.size
        return step.log_end if step.past_end else None

    def _finish(self, pending: _Round) -> Generator[Action, Event, None]:
        """Judge every started send at once, settle them, send the fallbacks until nothing is left;
        then write the outcomes (CLOSED only for what Kafka acknowledged) and retry what failed."""
        if not pending.started:
            return
        judged: Judged = self._answer((yield Judge(tuple(b.handle for b in pending.started), REDELIVERIES)))
        rounds = list(zip(pending.started, judged.results))
        closed: dict[Outcome, list[int]] = defaultdict(list)
        retry: list[int] = []
        retry_at, first_failure = 0, ""
        while rounds:
            fallbacks: list[Send] = []
            for started, results in rounds:
                sends = started.sends
                settled = settle(sends, results, self._answer((yield CLOCK)))
                self._answer((yield SettledRound(sends, results, settled, started.records, started.now_ms)))
                for outcome, done in settled.closed.items():
                    closed[outcome].extend(s.offset for s in done)
                if settled.retry:
                    if not first_failure:
                        detail = {s.offset: r.detail for s, r in zip(sends, results)}
                        first_failure = f"offset {settled.retry[0].offset}, {detail[settled.retry[0].offset]}"
                    retry.extend(s.offset for s in settled.retry)
                    retry_at = max(retry_at, settled.retry_at_ms or 0)
                fallbacks.extend(settled.fallbacks)
            rounds = []
            if fallbacks:  # rare: records a topic refused for good; sent and judged on their own
                records = {off: rec for st in pending.started for off, rec in st.records.items()}
                now = self._answer((yield CLOCK))
                sent: Started = self._answer((yield StartSends(fallbacks, records, now)))
                batch = _Batch(fallbacks, records, now, sent.handle)
                judged = self._answer((yield Judge((batch.handle,), DEAD_LETTERS)))
                rounds = [(batch, judged.results[0])]
        yield from self._write_outcomes(closed)
        if retry:
            self.state.retry(coalesce(retry), retry_at)
            self._answer((yield SendsRetried(len(retry), retry_at, first_failure)))

    def _write_outcomes(self, closed: dict[Outcome, list[int]]) -> Generator[Action, Event, None]:
        """The copies are acknowledged: close them, and write CLOSED so a restarted tracker does not repeat them."""
        for outcome, offs in closed.items():
            ranges = coalesce(offs)
            self.state.close(ranges)
            self._answer((yield WriteClosed(ranges, outcome)))

    def _retry(self, items: list[DueItem], error: BaseException) -> Generator[Action, Event, None]:
        """A read or a write failed: everything of ``items`` not yet closed goes back with a capped backoff."""
        now = self._answer((yield CLOCK))
        at = retry_at_ms(max(i.failures for i in items), now)
        left = self.state.open_within(r for i in items for r in i.ranges)
        self.state.retry(left, at)
        self._answer((yield RetriedAll(left, at, now, error)))

