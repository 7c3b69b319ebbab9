"""What the tracker's copy of a queue record looks like, and where a record goes when a copy fails.

Pure: no Kafka import. Kafka accepts records that kafka-python's producer
(the tracker's client) refuses, so the tracker decides here, per record, how
to copy it and where a record goes when a copy fails:

* **null header values** (Kafka allows them; librdkafka produces them):
  kafka-python cannot send one. The copy carries empty bytes for that header
  plus one ``kmq-null-header`` header naming it, so a consumer that cares can
  tell ``None`` from ``b""`` (:func:`restore_null_headers`).
* **tombstones** (null key and null value): kafka-python refuses to produce
  one, and a copy with an empty value would hand the consumer something the
  producer never wrote. The record is dead-lettered (reason
  ``undeliverable``) with an empty value and the cause in ``kmq-dlq-error``.
* **a copy refused for good** (larger than the topic or the producer accepts,
  invalid record): a redelivery falls back to the DLQ (reason
  ``undeliverable``); a dead letter the DLQ refuses too becomes a *reference
  dead letter*: the record's coordinates, size and the reasons, without the
  payload (:func:`reference_headers`), so it can be found and redriven from
  the queue log. The message is then closed as *undeliverable* (CLOSED
  outcome 4). Never retried forever, never closed without a trace.
* **a transient failure** (broker unreachable, DLQ topic missing or not
  writable): the offsets stay open and are retried with a capped backoff;
  nothing is closed, nothing is lost.

The tracker sizes its producer from the topics' ``max.message.bytes``
(:func:`copy_request_size`): a record the queue accepted can be copied.
"""

from __future__ import annotations

from enum import Enum
from typing import Mapping, Sequence

from kmq.core.lease_state import Reason
from kmq.core.message import (
    HEADER_DELIVERY_COUNT,
    HEADER_DLQ_ERROR,
    HEADER_DLQ_REASON,
    HEADER_DLQ_TS,
    HEADER_GROUP,
    HEADER_ORIGIN,
    header_text,
    origin_of,
)

__all__ = [
    "HEADER_NULL_HEADER",
    "HEADER_DLQ_REFERENCE",
    "HEADER_DLQ_SIZE",
    "REASON_UNDELIVERABLE",
    "MAX_ERROR_CHARS",
    "COPY_HEADROOM",
    "smallest_record_limit",
    "refused_with_its_batch",
    "Step",
    "Fallback",
    "fallback",
    "producible_headers",
    "restore_null_headers",
    "copy_problem",
    "copy_headers",
    "copy_count",
    "copy_headers_for",
    "group_headers",
    "dead_letter_headers",
    "reference_headers",
    "reference_of",
    "record_size",
    "copy_request_size",
]

# A header whose value was null in the original record (one per such header).
HEADER_NULL_HEADER = "kmq-null-header"
# On a reference dead letter (no payload): ``topic/partition/offset`` of the record the tracker read,
# where the payload stays until the queue's retention deletes it.
HEADER_DLQ_REFERENCE = "kmq-dlq-reference"
# On a reference dead letter: the size of that record in bytes (key, value and headers).
HEADER_DLQ_SIZE = "kmq-dlq-size"
# kmq-dlq-reason of a record that could not be redelivered as it is.
REASON_UNDELIVERABLE = "undeliverable"
# kmq-dlq-error is cut to this many characters (a client's error text can be long).
MAX_ERROR_CHARS = 2000
# Room the tracker's producer keeps above the largest record a topic accepts: the kmq headers a copy
# or dead letter adds (the error text included) and the record batch overhead.
COPY_HEADROOM = 8192

# Headers the tracker sets itself on a copy or dead letter (an original's values are replaced).
_REPLACED = frozenset({HEADER_DELIVERY_COUNT, HEADER_ORIGIN, HEADER_DLQ_REASON, HEADER_DLQ_ERROR, HEADER_DLQ_TS,
                       HEADER_DLQ_REFERENCE, HEADER_DLQ_SIZE, HEADER_GROUP})

Headers = Sequence[tuple[str, "bytes | None"]]


class Step(str, Enum):
    """What is being produced for a due record."""

    COPY = "copy"  # the redelivered copy to the queue
    DEAD_LETTER = "dead_letter"  # the record, payload included, to the DLQ
    REFERENCE = "reference"  # a dead letter without the payload, naming the record


class Fallback(str, Enum):
    """What to do after a failed send."""

    RETRY = "retry"  # transient: keep the offsets open, try again after a backoff
    DEAD_LETTER = "dead_letter"  # the copy cannot be made: dead-letter the record instead
    REFERENCE = "reference"  # the DLQ refuses the record: dead-letter a reference to it
    UNDELIVERABLE = "undeliverable"  # not even a reference is accepted: close with outcome 4


def fallback(step: Step, permanent: bool) -> Fallback:
    """The next move for a record whose ``step`` failed (``permanent``: the same record fails again)."""
    if not permanent:
        return Fallback.RETRY
    return {Step.COPY: Fallback.DEAD_LETTER, Step.DEAD_LETTER: Fallback.REFERENCE}.get(step, Fallback.UNDELIVERABLE)


def copy_problem(key: bytes | None, value: bytes | None) -> str | None:
    """Why a record cannot be redelivered as it is (None: it can)."""
    if key is None and value is None:
        return ("tombstone (null key and value): kafka-python cannot produce one; "
                "dead-lettered with an empty value")
    return None


def producible_headers(headers: Headers | None) -> list[tuple[str, bytes]]:
    """Headers as kafka-python can send them: a null value becomes ``b""`` plus a
    ``kmq-null-header`` header naming it (a key that is not text is kept as text)."""
    out: list[tuple[str, bytes]] = []
    nulls: list[str] = []
    for k, v in headers or ():
        name = k if isinstance(k, str) else bytes(k).decode("utf-8", "replace")
        if v is None:
            nulls.append(name)
            out.append((name, b""))
        else:
            out.append((name, bytes(v)))
    out.extend((HEADER_NULL_HEADER, n.encode("utf-8")) for n in nulls)
    return out


def restore_null_headers(headers: Sequence[tuple[str, bytes]] | None) -> list[tuple[str, bytes | None]]:
    """Undo :func:`producible_headers`: headers named by ``kmq-null-header`` get ``None`` back."""
    items = list(headers or ())
    nulls = {v.decode("utf-8", "replace") for k, v in items if k == HEADER_NULL_HEADER and v is not None}
    return [(k, None if k in nulls and v == b"" else v) for k, v in items if k != HEADER_NULL_HEADER]


def copy_count(count: int, reason: str) -> int:
    """``kmq-delivery-count`` of the copy of a record delivered ``count`` times, redelivered for
    ``reason`` (a :class:`~kmq.core.lease_state.Reason` value): count + 1, but a record given back
    without being delivered to user code (``release``: a NACK "not a delivery") keeps its count."""
    return count if reason == Reason.RELEASE.value else count + 1


def copy_headers(original: Headers | None, origin: str, count: int, group: str | None = None, *,
                 counted: bool = True) -> list[tuple[str, bytes]]:
    """Headers of the redelivered copy of a record delivered ``count`` times: the application's
    headers (producible), ``kmq-delivery-count`` = count + 1 (``counted=False``: count, for a
    record given back without a delivery), ``kmq-origin`` and, for a named consumer ``group`` of
    the queue, ``kmq-group`` (only that group's workers deliver the copy)."""
    headers = _kept(original)
    headers.append((HEADER_DELIVERY_COUNT, str(count + 1 if counted else count).encode()))
    headers.append((HEADER_ORIGIN, origin.encode()))
    return group_headers(headers, group)


def copy_headers_for(original: Headers | None, topic: str, partition: int, offset: int,
                     count: int, group: str | None = None, *, counted: bool = True) -> list[tuple[str, bytes]]:
    """The headers of the copy of the record at ``topic/partition/offset`` delivered ``count``
    times: :func:`copy_headers` with the record's origin (:func:`~kmq.core.message.origin_of`)."""
    if not original:  # most originals of a backlog: no header to keep, no origin to honour
        return group_headers([(HEADER_DELIVERY_COUNT, str(count + 1 if counted else count).encode()),
                              (HEADER_ORIGIN, f"{topic}/{partition}/{offset}".encode())], group)
    return copy_headers(original, origin_of(original, topic, partition, offset), count, group, counted=counted)


def group_headers(headers: list[tuple[str, bytes]], group: str | None) -> list[tuple[str, bytes]]:
    """``headers`` (which hold no ``kmq-group``) plus ``kmq-group: <group>`` for a named consumer
    ``group``: a copy for it, delivered by its workers only. The default group's copies (None) carry
    none, as before groups: their ``kmq-origin`` tells them from originals (:func:`~kmq.core.message.for_group`)."""
    if group is not None:
        headers.append((HEADER_GROUP, group.encode()))
    return headers


def dead_letter_headers(original: Headers | None, origin: str, count: int, reason: str, error: str,
                        now_ms: int) -> list[tuple[str, bytes]]:
    """Headers of a dead letter: the application's headers, the delivery count, the origin,
    ``kmq-dlq-reason``, ``kmq-dlq-error`` (when there is one) and ``kmq-dlq-ts``."""
    headers = _kept(original)
    headers.append((HEADER_DELIVERY_COUNT, str(count).encode()))
    headers.append((HEADER_ORIGIN, origin.encode()))
    return headers + _dlq_tail(reason, error, now_ms)


def reference_headers(origin: str, location: str, size: int, count: int, reason: str, error: str,
                      now_ms: int) -> list[tuple[str, bytes]]:
    """Headers of a reference dead letter: no application header (they may be what is too large),
    the record's ``location`` (``topic/partition/offset``) and ``size`` in bytes, and the dead
    letter headers."""
    headers = [(HEADER_DELIVERY_COUNT, str(count).encode()), (HEADER_ORIGIN, origin.encode()),
               (HEADER_DLQ_REFERENCE, location.encode()), (HEADER_DLQ_SIZE, str(size).encode())]
    return headers + _dlq_tail(reason, error, now_ms)


def reference_of(headers: Headers | None) -> str | None:
    """Where the payload of a reference dead letter is (``topic/partition/offset``); None for a
    dead letter that carries its payload."""
    return header_text(headers, HEADER_DLQ_REFERENCE)


def record_size(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """Bytes of a record's key, value and headers (names and values), without batch overhead."""
    size = len(key or b"") + len(value or b"")
    for k, v in headers or ():
        size += len(k.encode("utf-8", "replace") if isinstance(k, str) else k) + len(v or b"")
    return size


def refused_with_its_batch(size: int, smallest_limit: int) -> bool:
    """Whether a record of ``size`` bytes refused as too large can only have been refused with its
    batch: a broker answers MESSAGE_TOO_LARGE for a whole produce batch when one of its records is
    over the topic's ``max.message.bytes``, and every record of the batch gets that answer. A record
    with the headers a copy adds still under the smallest limit of the tracker's topics was not too
    large itself: it is sent again (a refused-for-good verdict would dead-letter it as a reference)."""
    return size + COPY_HEADROOM <= smallest_limit


def copy_request_size(configured: int, limits: Mapping[str, int | None]) -> tuple[int, list[str]]:
    """The tracker producer's largest request, and the topics whose limit is unknown.

    ``limits`` maps topic -> ``max.message.bytes`` (None: the broker did not say). The producer
    must send any record its topics accept, plus the headers a copy adds: the largest known limit
    plus :data:`COPY_HEADROOM`, never below ``configured`` (``tracker.max_request_size``, which is
    all the tracker has for a topic whose limit it cannot read)."""
    known = [n for n in limits.values() if n is not None and n > 0]
    unknown = sorted(t for t, n in limits.items() if n is None or n <= 0)
    return max([configured] + [n + COPY_HEADROOM for n in known]), unknown


def smallest_record_limit(configured: int, limits: Mapping[str, int | None]) -> int:
    """The smallest record limit among the tracker's topics: their ``max.message.bytes`` where known,
    ``configured`` (``tracker.max_request_size``) for the others and as a ceiling."""
    return min([configured] + [n for n in limits.values() if n is not None and n > 0])


def _kept(original: Headers | None) -> list[tuple[str, bytes]]:
    if not original:
        return []
    return producible_headers([(k, v) for k, v in original or () if k not in _REPLACED])


def _dlq_tail(reason: str, error: str, now_ms: int) -> list[tuple[str, bytes]]:
    tail = [(HEADER_DLQ_REASON, reason.encode())]
    if error:
        tail.append((HEADER_DLQ_ERROR, error[:MAX_ERROR_CHARS].encode("utf-8", "replace")))
    tail.append((HEADER_DLQ_TS, str(now_ms).encode()))
    return tail
