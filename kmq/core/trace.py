"""The attempt timeline of one message, reconstructed from the queue, markers and DLQ topics.

Pure (no Kafka import), the per-message companion of :mod:`kmq.core.ledger`: the
ledger counts what happened to every message, a :class:`TraceBuilder` tells
the story of one. Both identify a message by its origin (``topic/partition/
offset`` of the first delivery, carried by every copy in ``kmq-origin``).

Every copy of a message (tracker redeliveries and DLQ redrives alike) lives in
the origin's queue partition, and every marker about a copy lives in the
markers partition with the same number, so a trace needs one queue partition,
one markers partition and the DLQ. Feed the queue records first (they say
which offsets are copies of the message), then the markers and DLQ records in
log order, then ask :meth:`TraceBuilder.result` with ``now`` passed in.

Event kinds, in the order they usually happen:

``delivered`` (a copy in the queue: first delivery, tracker redelivery or DLQ
redrive), ``start`` (owner, lease, deadline), ``renew``, ``nack`` (delay),
``ack`` (END), ``late-ack`` (END for a copy the tracker had already closed:
counted, otherwise ignored), ``reject`` (reason), ``lease-expired`` (derived:
the deadline of a copy that was closed, or is overdue, without a NACK or
REJECT), ``closed`` (the tracker's CLOSED with its outcome) and
``dead-lettered`` (the DLQ record with reason and error).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from kmq.core.errors import TraceError
from kmq.core.markers import BadMarker, Closed, End, Nack, Outcome, Reject, Renew, Start, decode_record
from kmq.core.message import (
    HEADER_DELIVERY_COUNT,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_REASON,
    HEADER_ORIGIN,
    delivery_count_of,
    header_text,
    origin_of,
)
from kmq.core.message import parse_origin as parse_origin_header

__all__ = ["TraceEvent", "Trace", "TraceBuilder", "parse_origin", "describe_event", "clock", "STATES", "EVENT_KINDS"]

EVENT_KINDS = ("delivered", "start", "renew", "nack", "ack", "late-ack", "reject", "lease-expired", "closed",
               "dead-lettered")
# Final states, with what each means for the operator (also the human output's last line).
STATES = {
    "acked": "acknowledged: processing finished",
    "dead-lettered": "in the dead-letter topic",
    "in-flight": "held by a consumer under a lease",
    "awaiting-redelivery": "the tracker will redeliver it (lease over, NACKed or REJECTed)",
    "scheduled": "scheduled (kmq-not-before): the tracker delivers it at its time, no delivery counted before",
    "queued": "in the queue, not yet polled by a consumer",
    "missing": "gone from the queue log before it could be redelivered",
    "unknown": "polled before the scanned markers: trace again with a longer --since",
    "not-found": "no record of this message in the scanned range",
}
# Causal order of events written in the same millisecond.
_RANK = {k: i for i, k in enumerate(("lease-expired", "delivered", "start", "renew", "nack", "reject", "ack",
                                     "late-ack", "dead-lettered", "closed"))}
_OUTCOME = {Outcome.REDELIVERED: "redelivered", Outcome.DEAD_LETTERED: "dead-lettered",
            Outcome.MISSING: "missing"}


def parse_origin(origin: str) -> tuple[str, int, int]:
    """``topic/partition/offset`` -> its parts; :class:`TraceError` when malformed.

    The same rules as the consumer's reading of ``kmq-origin`` (:func:`kmq.core.message.parse_origin`).
    """
    parsed = parse_origin_header(origin)
    if parsed is None:
        raise TraceError(f"origin {origin!r} is not topic/partition/offset (e.g. orders/0/42); "
                         "copy it from a kmq-origin header or use --partition/--offset")
    return parsed


@dataclass(frozen=True)
class TraceEvent:
    """One step of a message's history. ``partition``/``offset`` name the queue copy it
    is about (the DLQ record's own position for ``dead-lettered``)."""

    ts_ms: int
    kind: str
    partition: int
    offset: int
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ts_ms": self.ts_ms, "time": _iso(self.ts_ms), "kind": self.kind, "partition": self.partition,
                "offset": self.offset, **dict(self.detail)}


@dataclass(frozen=True)
class Trace:
    origin: str
    state: str
    events: tuple[TraceEvent, ...]
    key: str | None = None
    deliveries: int = 0
    scan: Mapping[str, Any] = field(default_factory=dict)  # what was read, filled in by the reader

    @property
    def state_text(self) -> str:
        return STATES[self.state]

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "key": self.key, "state": self.state, "state_text": self.state_text,
                "deliveries": self.deliveries, "events": [e.to_dict() for e in self.events], "scan": dict(self.scan)}


@dataclass
class _Copy:
    offset: int
    ts_ms: int
    delivery_count: int
    started: bool = False
    deadline_ms: int | None = None
    cause: str | None = None  # what ends the current lease early: "nack" / "reject"; None = the lease itself
    nack_due_ms: int | None = None
    ack_index: int | None = None  # index of the accepted ack event
    closed: Outcome | None = None


@dataclass
class TraceBuilder:
    """Collects the history of the message ``origin`` of ``queue``; see the module docstring."""

    queue: str
    origin: str
    _copies: dict[int, _Copy] = field(default_factory=dict)
    _events: list[TraceEvent] = field(default_factory=list)
    _key: str | None = None
    _dlq_ts: int | None = None
    bad_markers: int = 0

    def __post_init__(self) -> None:
        _, self.partition, self.origin_offset = parse_origin(self.origin)

    # ------------------------------------------------------------ feeding
    def add_queue_record(self, partition: int, offset: int, ts_ms: int, key: bytes | None,
                         headers: Sequence[tuple[str, bytes | None]] | None) -> bool:
        """A record of the queue topic; True when it is a copy of this message."""
        if partition != self.partition or offset < self.origin_offset or offset in self._copies:
            return False
        if origin_of(headers, self.queue, partition, offset) != self.origin:
            return False
        count = delivery_count_of(headers)
        if header_text(headers, HEADER_ORIGIN) is None:
            via = "first delivery"
        elif header_text(headers, HEADER_DELIVERY_COUNT) is None:
            via = "redriven from the DLQ"  # a DLQ replay drops the count and keeps the origin
        else:
            via = "redelivered by the tracker"
        if self._key is None and key is not None:
            self._key = key.decode("utf-8", "replace")
        self._copies[offset] = _Copy(offset, ts_ms, count)
        self._add(ts_ms, "delivered", offset, delivery_count=count, via=via)
        return True

    def add_marker_record(self, marker_offset: int, ts_ms: int, key: bytes | None, value: bytes | None) -> None:
        """A record of the markers partition of this message (log order)."""
        marker = decode_record(key, value, self.partition)
        if isinstance(marker, BadMarker):
            self.bad_markers += 1
            return
        at = self.origin_offset
        if (at not in self._copies and isinstance(marker, Closed) and marker.outcome is Outcome.MISSING
                and any(r.first <= at < r.first + r.count for r in marker.ranges)):
            # Its record is gone from the queue log (the tracker read past it: retention, DeleteRecords),
            # so no queue record names it; the tracker's CLOSED is what tells its end.
            self._copies[at] = _Copy(at, ts_ms, 1)
        for r in marker.ranges:
            # A message has a handful of copies: test them rather than walk a range of thousands.
            for off in sorted(self._copies):
                if r.first <= off < r.first + r.count:
                    self._apply(self._copies[off], marker, marker_offset, ts_ms)

    def add_dlq_record(self, partition: int, offset: int, ts_ms: int,
                       headers: Sequence[tuple[str, bytes | None]] | None) -> bool:
        """A record of the DLQ; True when it is a dead letter of this message."""
        if header_text(headers, HEADER_ORIGIN) != self.origin:
            return False
        self._dlq_ts = max(self._dlq_ts or ts_ms, ts_ms)
        self._events.append(TraceEvent(ts_ms, "dead-lettered", partition, offset, {
            "reason": header_text(headers, HEADER_DLQ_REASON) or "unknown",
            "error": header_text(headers, HEADER_DLQ_ERROR),
            "delivery_count": delivery_count_of(headers),
        }))
        return True

    # ------------------------------------------------------------ answer
    def result(self, now_ms: int, workers_committed: int | None = None) -> Trace:
        """The timeline so far. ``workers_committed`` (the workers group's committed offset
        of the partition) tells a queued copy from one polled before the scanned markers."""
        events = list(self._events)
        for c in self._copies.values():
            if c.started and c.closed is None and c.ack_index is None and c.cause is None \
                    and c.deadline_ms is not None and c.deadline_ms <= now_ms:
                events.append(TraceEvent(c.deadline_ms, "lease-expired", self.partition, c.offset,
                                         {"deadline_ms": c.deadline_ms, "pending": True}))
        events.sort(key=lambda e: (e.ts_ms, _RANK[e.kind]))
        return Trace(self.origin, self._state(now_ms, workers_committed), tuple(events), self._key,
                     len(self._copies))

    # ------------------------------------------------------------ inside
    def _add(self, ts_ms: int, kind: str, offset: int, **detail: Any) -> int:
        self._events.append(TraceEvent(ts_ms, kind, self.partition, offset, detail))
        return len(self._events) - 1

    def _apply(self, c: _Copy, marker: Any, moff: int, ts: int) -> None:
        done = c.closed is not None or c.ack_index is not None
        if isinstance(marker, Start):
            c.started, c.deadline_ms, c.cause = True, ts + marker.lease_ms, None
            self._add(ts, "start", c.offset, owner=marker.owner, lease_ms=marker.lease_ms,
                      deadline_ms=c.deadline_ms, marker_offset=moff)
        elif isinstance(marker, Renew):
            if not done:
                c.deadline_ms = ts + marker.lease_ms
            self._add(ts, "renew", c.offset, lease_ms=marker.lease_ms, deadline_ms=ts + marker.lease_ms,
                      late=done, marker_offset=moff)
        elif isinstance(marker, Nack):
            if not done:
                # A NACK "not a delivery" with a delay is a scheduled message held back until its time.
                scheduled = not marker.counted and marker.delay_ms > 0
                c.cause, c.nack_due_ms = "scheduled" if scheduled else "nack", ts + marker.delay_ms
            self._add(ts, "nack", c.offset, delay_ms=marker.delay_ms, due_ms=ts + marker.delay_ms, marker_offset=moff,
                      counted=marker.counted)
        elif isinstance(marker, Reject):
            if not done:
                c.cause = "reject"
            self._add(ts, "reject", c.offset, reason=marker.reason, marker_offset=moff)
        elif isinstance(marker, End):
            if c.closed is not None:
                self._add(ts, "late-ack", c.offset, closed_as=_OUTCOME[c.closed], marker_offset=moff)
            elif c.ack_index is not None:
                self._add(ts, "ack", c.offset, duplicate=True, marker_offset=moff)
            else:
                c.ack_index = self._add(ts, "ack", c.offset, marker_offset=moff)
        elif isinstance(marker, Closed):
            if c.closed is not None:
                return  # a repeated CLOSED (tracker restart): one close is the story
            if c.ack_index is not None:
                # The END reached the log after the tracker had already decided to redeliver:
                # the tracker counted it as late, so does the trace.
                e = self._events[c.ack_index]
                self._events[c.ack_index] = replace(e, kind="late-ack",
                                                    detail={**e.detail, "closed_as": _OUTCOME[marker.outcome]})
                c.ack_index = None
            if marker.outcome is not Outcome.MISSING and c.cause is None and c.deadline_ms is not None:
                self._add(c.deadline_ms, "lease-expired", c.offset, deadline_ms=c.deadline_ms)
            c.closed = marker.outcome
            self._add(ts, "closed", c.offset, outcome=_OUTCOME[marker.outcome], marker_offset=moff)
        # Other marker types (added by later protocol versions) do not change the story.

    def _state(self, now_ms: int, workers_committed: int | None) -> str:
        if not self._copies:
            return "dead-lettered" if self._dlq_ts is not None else "not-found"
        last = self._copies[max(self._copies)]
        if last.ack_index is not None:
            return "acked"
        if last.closed is Outcome.DEAD_LETTERED or (self._dlq_ts is not None and self._dlq_ts >= last.ts_ms):
            return "dead-lettered"
        if last.closed is Outcome.MISSING:
            return "missing"
        if last.closed is Outcome.REDELIVERED:
            return "awaiting-redelivery"  # its next copy is not in the scanned range yet
        if last.started:
            if last.cause == "scheduled" and last.nack_due_ms is not None and last.nack_due_ms > now_ms:
                return "scheduled"
            overdue = last.deadline_ms is not None and last.deadline_ms <= now_ms
            return "awaiting-redelivery" if last.cause or overdue else "in-flight"
        if workers_committed is not None and last.offset < workers_committed:
            return "unknown"
        return "queued"


def _iso(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def _ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1000:g}s" if ms < 120_000 else f"{ms / 60_000:g}m"


def clock(ts_ms: int) -> str:
    """UTC wall-clock time with milliseconds, as the timelines show it."""
    return datetime.fromtimestamp(ts_ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def describe_event(e: TraceEvent) -> str:
    """One line of prose for an event (the CLI and the console show the same words)."""
    d = e.detail
    if e.kind == "delivered":
        return f"delivery {d['delivery_count']} ({d['via']})"
    if e.kind == "start":
        return f"START by {d['owner'] or '?'}, lease {_ms(d['lease_ms'])} (until {clock(d['deadline_ms'])})"
    if e.kind == "renew":
        late = " (late: the copy was already settled, ignored)" if d.get("late") else ""
        return f"RENEW lease {_ms(d['lease_ms'])} (until {clock(d['deadline_ms'])}){late}"
    if e.kind == "nack":
        if d.get("counted", True) is False:
            if d["delay_ms"] > 0:
                return f"scheduled: held back until {clock(d['due_ms'])} (kmq-not-before; no delivery counted)"
            return "given back without a delivery (NACK, same delivery count), redeliver now"
        return f"NACK, redeliver after {_ms(d['delay_ms'])}"
    if e.kind == "ack":
        return "END: acknowledged" + (" again (duplicate ack)" if d.get("duplicate") else "")
    if e.kind == "late-ack":
        return f"END arrived late: the tracker had already closed this copy as {d['closed_as']} (counted, ignored)"
    if e.kind == "reject":
        return f"REJECT: {d['reason'] or '(no reason)'}"
    if e.kind == "lease-expired":
        return "lease expired" + (": waiting for the tracker to redeliver" if d.get("pending") else "")
    if e.kind == "closed":
        return f"CLOSED by the tracker: {d['outcome']}"
    if e.kind == "dead-lettered":
        err = f" ({d['error']})" if d.get("error") else ""
        return f"dead letter, reason {d['reason']}{err}, after delivery {d['delivery_count']}"
    return e.kind
