"""What the tracker's copy of a queue record looks like, and what happens when it cannot be made.

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
* **a copy refused for good** (too large for the producer's
  ``max_request_size`` or the topic's limit, invalid record): a redelivery
  falls back to the DLQ (reason ``undeliverable``); a dead letter that is
  refused too is closed as *undeliverable* (CLOSED outcome 4) with the cause
  logged and counted. Never retried forever.
* **a transient failure** (broker unreachable, DLQ topic missing or not
  writable): the offsets stay open and are retried with a capped backoff;
  nothing is closed, nothing is lost.
"""

from __future__ import annotations

from enum import Enum
from typing import Sequence

__all__ = [
    "HEADER_NULL_HEADER",
    "REASON_UNDELIVERABLE",
    "Step",
    "Fallback",
    "fallback",
    "producible_headers",
    "restore_null_headers",
    "copy_problem",
]

# A header whose value was null in the original record (one per such header).
HEADER_NULL_HEADER = "kmq-null-header"
# kmq-dlq-reason of a record that could not be redelivered as it is.
REASON_UNDELIVERABLE = "undeliverable"


class Step(str, Enum):
    """What was being produced when a send failed."""

    COPY = "copy"  # the redelivered copy to the queue
    DEAD_LETTER = "dead_letter"  # the DLQ copy


class Fallback(str, Enum):
    """What to do after a failed send."""

    RETRY = "retry"  # transient: keep the offsets open, try again after a backoff
    DEAD_LETTER = "dead_letter"  # the copy cannot be made: dead-letter the record instead
    UNDELIVERABLE = "undeliverable"  # not even the DLQ takes it: close with outcome 4


def fallback(step: Step, permanent: bool) -> Fallback:
    """The next move for a record whose ``step`` failed (``permanent``: the same record fails again)."""
    if not permanent:
        return Fallback.RETRY
    return Fallback.DEAD_LETTER if step is Step.COPY else Fallback.UNDELIVERABLE


def copy_problem(key: bytes | None, value: bytes | None) -> str | None:
    """Why a record cannot be redelivered as it is (None: it can)."""
    if key is None and value is None:
        return ("tombstone (null key and value): kafka-python cannot produce one; "
                "dead-lettered with an empty value")
    return None


def producible_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> list[tuple[str, bytes]]:
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
