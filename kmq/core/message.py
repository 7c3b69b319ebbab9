"""A queue message handed to user code, and its settle state.

Pure: no Kafka import. A :class:`KmqMessage` is created by
:class:`~kmq.consumer.consumer.KmqConsumer` after the message's START marker was
acknowledged by Kafka and the queue offsets were committed. User code settles
it exactly once with :meth:`~KmqMessage.ack`, :meth:`~KmqMessage.nack` or
:meth:`~KmqMessage.reject` (any thread, any order); :meth:`~KmqMessage.renew`
extends the lease of an unsettled message. A second terminal call raises
:class:`~kmq.core.errors.MessageAlreadySettled` and writes no second marker.

The settle decision is made under a lock shared with the owner (the
consumer), so the owner's bookkeeping (ack buffer, in-flight count) happens
atomically with the state change.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable, Protocol, Sequence

from kmq.core.errors import MessageAlreadySettled
from kmq.core.settlement import Released, delay_ms, lease_ms, reject_reason

__all__ = [
    "offsets_by_partition",
    "KmqMessage",
    "Settler",
    "ACK",
    "NACK",
    "REJECT",
    "ABANDON",
    "HEADER_DELIVERY_COUNT",
    "HEADER_ORIGIN",
    "HEADER_DLQ_REASON",
    "HEADER_DLQ_ERROR",
    "HEADER_DLQ_TS",
    "HEADER_GROUP",
    "DEFAULT_GROUP",
    "header_text",
    "group_of",
    "for_group",
    "delivery_count_of",
    "origin_of",
    "origin_offset",
    "parse_origin",
    "MAX_DELIVERY_COUNT",
    "unsettled",
    "ack_all",
    "message_builder",
]

ACK, NACK, REJECT, ABANDON = "ack", "nack", "reject", "abandon"
# Every kmq header (docs/protocol.md), named once.
HEADER_DELIVERY_COUNT = "kmq-delivery-count"
HEADER_ORIGIN = "kmq-origin"
HEADER_DLQ_REASON = "kmq-dlq-reason"
HEADER_DLQ_ERROR = "kmq-dlq-error"
HEADER_DLQ_TS = "kmq-dlq-ts"
# On a copy made for a named consumer group of the queue, and on a replayed dead letter (``default``
# for the default group): that group only delivers it (:func:`for_group`). The default group's
# copies carry none.
HEADER_GROUP = "kmq-group"
#: The name of a queue's default consumer group (``queues[].group`` unset or ``default``).
DEFAULT_GROUP = "default"

# A value may be None: Kafka allows null header values, and every reader here treats one as absent or empty.
Headers = Sequence[tuple[str, "bytes | None"]]


class Settler(Protocol):
    """What a message reports its settlement to. Both calls run under the shared
    lock and must not block (append to a buffer, update counters). A settler may also offer
    ``settled_many(messages)``, a run of plain acks at once (:func:`ack_all`)."""

    def settled(self, msg: "KmqMessage", outcome: str, arg: Any) -> None: ...

    def renewed(self, msg: "KmqMessage", lease: float | None) -> None: ...


def _header(headers: Headers | None, name: str) -> bytes | None:
    if headers:
        for k, v in headers:
            if k == name:
                return v
    return None


def header_text(headers: Headers | None, name: str) -> str | None:
    """Header ``name`` as text (utf-8, undecodable bytes replaced), None when absent."""
    raw = _header(headers, name)
    if raw is None:
        return None
    return raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)


_I32_MAX = 2**31 - 1
_I64_MAX = 2**63 - 1
#: Delivery counts read from headers are clamped to this (Kafka's int32 range).
MAX_DELIVERY_COUNT = _I32_MAX
_I32_DIGITS = len(str(_I32_MAX))


def delivery_count_of(headers: Headers | None) -> int:
    """``kmq-delivery-count`` as an int in ``1..MAX_DELIVERY_COUNT``.

    Absent (first delivery), unreadable or below 1 = 1; above the range =
    :data:`MAX_DELIVERY_COUNT`. Headers come from anyone who can produce to the
    queue, so no value may make a consumer or the tracker fail."""
    raw = _header(headers, HEADER_DELIVERY_COUNT)
    if raw is None:
        return 1
    try:
        text = (raw.decode("ascii") if isinstance(raw, (bytes, bytearray)) else str(raw)).strip()
    except UnicodeDecodeError:
        return 1
    if not text.isascii() or not text.isdigit():  # "-3", "1e9", "5_000", "" are unreadable
        return 1
    digits = text.lstrip("0")
    if len(digits) > _I32_DIGITS:  # checked before int(): a huge digit string costs nothing
        return MAX_DELIVERY_COUNT
    return min(max(int(text), 1), MAX_DELIVERY_COUNT)


def parse_origin(text: str) -> tuple[str, int, int] | None:
    """``topic/partition/offset`` -> its parts, or None when malformed (topic names
    hold no ``/``; partition and offset are non-negative int32 / int64 numbers)."""
    parts = text.split("/")
    if len(parts) != 3:
        return None
    topic, part, off = parts
    if not topic or not (part.isascii() and part.isdigit() and off.isascii() and off.isdigit()):
        return None
    if len(part) > 12 or len(off) > 20:
        return None
    p, o = int(part), int(off)
    if p > _I32_MAX or o > _I64_MAX:
        return None
    return topic, p, o


def origin_offset(headers: Headers | None, topic: str, partition: int, offset: int) -> int:
    """The offset of a record's first delivery when it is the tracker's copy of a record of the same
    partition (``kmq-origin`` names this topic and partition), else the record's own offset."""
    text = header_text(headers, HEADER_ORIGIN) if headers else None
    parsed = parse_origin(text) if text is not None else None
    if parsed is None or parsed[0] != topic or parsed[1] != partition:
        return offset
    return parsed[2]


def origin_of(headers: Headers | None, topic: str, partition: int, offset: int) -> str:
    """Stable id of a message: ``topic/partition/offset`` of its first delivery.

    ``kmq-origin`` is trusted only when it names this queue (``topic``): only
    the tracker's copies of this queue's records carry such a header. A header
    naming another topic (copied along by Streams or Connect from a record of
    another kmq queue) or a malformed one is ignored, and the record's own
    coordinates are its origin -- otherwise :class:`~kmq.consumer.guard.IdempotencyGuard`
    would skip it as a duplicate of an unrelated message."""
    raw = _header(headers, HEADER_ORIGIN)
    if raw:
        try:
            text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else str(raw)
        except UnicodeDecodeError:
            text = ""
        parsed = parse_origin(text)
        if parsed is not None and parsed[0] == topic:
            return f"{parsed[0]}/{parsed[1]}/{parsed[2]}"
    return f"{topic}/{partition}/{offset}"


def group_of(headers: Headers | None) -> str | None:
    """The consumer group a record was written for (``kmq-group``: a named group's copy, or any
    group's replayed dead letter); None when the header is absent."""
    return header_text(headers, HEADER_GROUP) if headers else None


def for_group(headers: Headers | None, group: str | None, topic: str, partition: int, offset: int) -> bool:
    """Whether the workers of the queue's consumer ``group`` (None: the default group) deliver the
    record at ``topic/partition/offset`` with ``headers``.

    Only a record whose ``kmq-origin`` names this topic is kmq's (headers copied along from another
    topic's records count for nothing). Of those, one with ``kmq-group`` (a named group's copy, or
    any group's replayed dead letter) is that group's (``default``: the default group's), one
    without whose origin is another offset of its partition (a copy of the default group's tracker,
    of any version, or a replay by an older kmq) is the default group's. Everything else is an
    original: every group's."""
    if not headers:
        return True
    text = header_text(headers, HEADER_ORIGIN)
    origin = parse_origin(text) if text is not None else None
    if origin is None or origin[0] != topic:
        return True
    named = group_of(headers)
    if named is None:
        return group is None or origin[1] != partition or origin[2] == offset
    return (None if named == DEFAULT_GROUP else named) == group


def unsettled(messages: Sequence["KmqMessage"]) -> list["KmqMessage"]:
    """The messages of ``messages`` not settled yet (a batch filtered once, at C speed)."""
    return [m for m in messages if m._outcome is None]


def offsets_by_partition(messages: Sequence["KmqMessage"]) -> dict[int, list[int]]:
    """The offsets of ``messages`` per partition, in their order (one partition's, the common case,
    listed at C speed)."""
    if not messages:
        return {}
    first = messages[0].partition
    if first == messages[-1].partition and [m.partition for m in messages].count(first) == len(messages):
        return {first: [m.offset for m in messages]}
    out: dict[int, list[int]] = {}
    for m in messages:
        offsets = out.get(m.partition)
        if offsets is None:
            out[m.partition] = [m.offset]
        else:
            offsets.append(m.offset)
    return out


def ack_all(messages: Sequence["KmqMessage"]) -> list["KmqMessage"]:
    """:meth:`KmqMessage.ack` each of ``messages`` (one consumer's: they share its lock) under one
    acquisition of the lock instead of one per message. Returns those settled already, left as
    they are (``ack()`` would have raised :class:`~kmq.core.errors.MessageAlreadySettled` for them).

    A settler with a ``settled_many(messages)`` method hears of the run of its messages at once,
    after every outcome is set (under the lock); any other settler once per message."""
    if not messages:
        return []
    first = messages[0]
    lock, settler = first._lock, first._settler
    many = getattr(settler, "settled_many", None)
    lock.acquire()
    try:
        if many is None:
            return _ack_each(messages)
        run: list[KmqMessage] = []
        rest: list[KmqMessage] = []  # settled already, or another settler's (a lease ended in user code)
        try:
            for m in messages:
                if m._outcome is None and m._settler is settler:
                    m._outcome = ACK
                    run.append(m)
                else:
                    rest.append(m)
        finally:
            if run:  # even after an error: an outcome set is a settlement to book
                many(run)
        return _ack_each(rest) if rest else rest
    finally:
        lock.release()


def _ack_each(messages: Sequence["KmqMessage"]) -> list["KmqMessage"]:
    """:func:`ack_all` for settlers told once per message (the lock held): the settled ones."""
    skipped: list[KmqMessage] = []
    for m in messages:
        if m._outcome is not None:
            skipped.append(m)
            continue
        m._outcome = ACK
        m._settler.settled(m, ACK, None)
    return skipped


class KmqMessage:
    """One message of a queue, delivered under a lease.

    Attributes: ``value``, ``key``, ``headers`` (list of ``(str, bytes)``),
    ``topic``, ``partition``, ``offset``, ``timestamp`` (ms),
    ``delivery_count`` (1 on the first delivery), ``origin`` (stable id
    ``topic/partition/offset`` of the first delivery, for deduplication) and
    ``span`` (the delivery's OpenTelemetry span, None when tracing is off).
    """

    __slots__ = ("topic", "partition", "offset", "key", "value", "_headers", "timestamp", "_lock", "_settler", "_outcome",
                 "_nbytes", "_span")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
        timestamp: int | None,
        settler: Settler,
        lock: threading.Lock,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        # A record without headers keeps None until ``headers`` is read: most records have none, and
        # an empty list per message in flight is one more object for the cyclic collector to visit
        # (on confluent-kafka 14-21 % of KmqConsumer's CPU; kmq bench consumer, 2026-11-28).
        self._headers = headers or None
        self.timestamp = timestamp
        self._settler = settler
        self._lock = lock
        self._outcome: str | None = None
        #: Payload bytes (key + value), what flow control counts; computed once, read at fetch and settle.
        self._nbytes = (len(value) if value else 0) + (len(key) if key else 0)
        #: The delivery's span, set by the consumer's tracing when it hands the message over.
        self._span: Any = None

    # ------------------------------------------------------------ derived
    @property
    def headers(self) -> list[tuple[str, bytes]]:
        """The record's headers, a list of ``(str, bytes)`` (empty when it has none)."""
        h = self._headers
        if h is None:
            h = self._headers = []
        return h  # type: ignore[return-value]

    @headers.setter
    def headers(self, value: Headers | None) -> None:
        self._headers = value

    @property
    def delivery_count(self) -> int:
        """How many times this message was delivered (header ``kmq-delivery-count``; absent = 1)."""
        return delivery_count_of(self._headers)

    @property
    def origin(self) -> str:
        """Stable id of the message across redeliveries: ``topic/partition/offset`` of its first delivery."""
        return origin_of(self._headers, self.topic, self.partition, self.offset)

    @property
    def span(self) -> Any:
        """The OpenTelemetry span of this delivery (``process <queue>``, from hand-over to settlement),
        or None when tracing is off (no ``kmq[otel]`` extra or no tracer provider installed).
        ``kmq.tracing.use_span(msg)`` makes it current, so spans user code starts are its children."""
        return self._span

    @property
    def outcome(self) -> str | None:
        """None while unsettled, else ``"ack"``, ``"nack"``, ``"reject"`` or ``"abandon"``."""
        return self._outcome

    @property
    def settled(self) -> bool:
        return self._outcome is not None

    def __repr__(self) -> str:
        state = self._outcome or "in flight"
        return f"KmqMessage({self.topic}/{self.partition}/{self.offset}, delivery {self.delivery_count}, {state})"

    # ------------------------------------------------------------ settling
    def _already_settled(self, outcome: str) -> MessageAlreadySettled:
        return MessageAlreadySettled(f"{self.topic}/{self.partition}/{self.offset} was already settled "
                                     f"({self._outcome}); {outcome} ignored, no second marker written")

    def _settle(self, outcome: str, arg: Any) -> None:
        with self._lock:
            if self._outcome is not None:
                raise self._already_settled(outcome)
            self._outcome = outcome
            self._settler.settled(self, outcome, arg)

    def ack(self) -> None:
        """Processing is complete: an END marker is written with the next flush."""
        # _settle inlined: ack is the one call every message makes (kmq bench consumer), and
        # acquire/release in try/finally, not ``with``: a lock's __exit__ call costs as much again.
        lock = self._lock
        lock.acquire()
        try:
            if self._outcome is not None:
                raise self._already_settled(ACK)
            self._outcome = ACK
            self._settler.settled(self, ACK, None)
        finally:
            lock.release()

    def ack_with_response(self) -> "Future[None]":
        """:meth:`ack`, and a future resolved when Kafka acknowledged the END marker covering it.

        The END is written with the next flush, batched with the other acks as usual. The
        future (a :class:`concurrent.futures.Future`: ``result(timeout)``, ``add_done_callback``)
        gets ``None`` once the marker is durable, or fails with
        :class:`~kmq.core.errors.MarkerWriteError` when the writer gives it up (past
        ``consumer.marker_retry_budget``) or closes first; the tracker then redelivers the
        message when its lease ends. Callbacks run on kmq's I/O thread: they must not block."""
        fut: Future[None] = Future()
        with self._lock:
            if self._outcome is not None:
                raise self._already_settled(ACK)
            self._outcome = ACK
            self._settler.settled(self, ACK, fut)
        return fut

    def nack(self, delay: float = 0.0) -> None:
        """Processing failed: the tracker redelivers the message after ``delay`` seconds.

        Raises :class:`~kmq.core.errors.InvalidSettlement` (a ``ValueError``) for a delay the
        wire cannot carry (negative, NaN, inf, over about 49.7 days); the message then
        stays unsettled."""
        delay_ms(delay)  # InvalidSettlement before the outcome is set: the message stays settleable
        self._settle(NACK, float(delay))

    def _give_back(self, delay: float = 0.0) -> None:
        """Given back by kmq without a delivery (never handed to user code: a close, a scheduled
        message not due yet): the tracker copies it after ``delay`` seconds and the copy keeps its
        delivery count (a NACK "not a delivery", docs/protocol.md)."""
        delay_ms(delay)
        self._settle(NACK, Released(delay))

    def reject(self, reason: str = "") -> None:
        """The message can never be processed: the tracker sends it to the DLQ with ``reason``.

        Raises :class:`~kmq.core.errors.InvalidSettlement` for a reason over 65,535 utf-8
        bytes or not encodable as utf-8; the message then stays unsettled."""
        self._settle(REJECT, reject_reason(reason))

    def abandon(self) -> None:
        """Give the message up without a marker, as a crashed worker would: it stays in
        flight at the tracker and is redelivered when its lease ends. Frees its slot
        in the in-flight cap and stops automatic renewal."""
        self._settle(ABANDON, None)

    def renew(self, lease: float | None = None) -> None:
        """Extend the lease: new deadline = now + ``lease`` seconds (default: the queue's lease).

        Raises :class:`~kmq.core.errors.MessageAlreadySettled` on a settled message and
        :class:`~kmq.core.errors.InvalidSettlement` for a lease the wire cannot carry
        (<= 0, NaN, inf, over about 49.7 days)."""
        if lease is not None:
            lease_ms(lease)  # InvalidSettlement before anything is recorded
        with self._lock:
            if self._outcome is not None:
                raise MessageAlreadySettled(
                    f"{self.topic}/{self.partition}/{self.offset} was already settled ({self._outcome}); cannot renew"
                )
            self._settler.renewed(self, lease)

    def settle_through(self, settler: Settler) -> None:
        """Send its settlement and renewals to ``settler`` from now on (the consumer's, once the
        lease ended in user code: the marker is still written, nothing counted twice). The caller
        holds the message's lock."""
        self._settler = settler

    def traced_by(self, span: Any) -> None:
        """Carry ``span`` as its delivery span (:attr:`span`): set by the consumer's tracing
        (:mod:`kmq.telemetry.tracing`) as it is handed to user code, only when tracing is on."""
        self._span = span


#: ``build(topic, partition, offset, key, value, headers, timestamp) -> KmqMessage``.
MessageBuilder = Callable[[str, int, int, "bytes | None", "bytes | None", "Headers | None", "int | None"], KmqMessage]


def message_builder(settler: Settler, lock: threading.Lock) -> MessageBuilder:
    """What a consumer's fetcher makes each fetched record into: ``build(topic, partition, offset,
    key, value, headers, timestamp)`` is ``KmqMessage(topic, ..., timestamp, settler, lock)``.

    The same fields, set without the class call: on CPython 3.11 calling the class (``__new__``
    and a nine-argument ``__init__``) cost 0.3 us a message, the fields alone 0.1 us, and the
    fetcher builds every message a consumer hands out. ``tests/unit/test_message.py`` holds the
    two to the same slots.

    ``build.many(records, failed)`` builds a whole poll's ``records`` in one call, for a client
    whose records have accessor methods (confluent-kafka's ``Message``: ``error()``, ``topic()``,
    ``partition()``, ``offset()``, ``key()``, ``value()``, ``headers()``, ``timestamp()`` as
    ``(type, ms)``): the call per record cost as much again as its fields (0.1 us a message on
    confluent-kafka, kmq bench consumer). ``records`` is emptied as it is read, each record let
    go once built (the cyclic collector counts live ones); one whose ``error()`` is not None is
    skipped and its error passed to ``failed`` (which may raise)."""
    new = object.__new__
    cls = KmqMessage

    def build(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
              headers: Headers | None, timestamp: int | None) -> KmqMessage:
        m = new(cls)
        m.topic = topic
        m.partition = partition
        m.offset = offset
        m.key = key
        m.value = value
        m._headers = headers or None  # as in KmqMessage.__init__: None until read
        m.timestamp = timestamp
        m._settler = settler
        m._lock = lock
        m._outcome = None
        m._nbytes = (len(value) if value else 0) + (len(key) if key else 0)
        m._span = None
        return m

    def many(records: list[Any], failed: Callable[[Any], None]) -> list[KmqMessage]:
        # build() for a whole poll, one call: the call per record cost as much as its fields.
        out: list[KmqMessage] = []
        append = out.append
        records.reverse()
        take = records.pop  # each record let go once read (see the docstring)
        while records:
            r = take()
            err = r.error()
            if err is not None:
                failed(err)
                continue
            m = new(cls)
            m.topic = r.topic()
            m.partition = r.partition()
            m.offset = r.offset()
            m.key = key = r.key()
            m.value = value = r.value()
            m._headers = r.headers() or None
            m.timestamp = r.timestamp()[1]
            m._settler = settler
            m._lock = lock
            m._outcome = None
            m._nbytes = (len(value) if value else 0) + (len(key) if key else 0)
            m._span = None
            append(m)
        return out

    build.many = many  # type: ignore[attr-defined]  # read by the confluent-kafka adapter
    return build
