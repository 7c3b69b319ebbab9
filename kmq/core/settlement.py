"""Settlement arguments checked against the marker wire, before anything is recorded.

Pure: no Kafka, no I/O. ``nack(delay)``, ``renew(lease)`` and
``reject(reason)`` end up as a ``u32 delay_ms``, a ``u32 lease_ms`` and a
``u16 len`` + utf-8 reason (docs/protocol.md). A value the wire cannot carry
must be refused *before* the message's outcome is set: otherwise the message
counts as settled, no marker is ever written, its in-flight slot leaks, and
-- worse -- the bad value poisons the flush that drains it together with
other messages' acks. So every entry point (:class:`~kmq.core.message.KmqMessage`,
:class:`~kmq.consumer.writer.MarkerWriter`) converts through these functions first and
raises :class:`~kmq.core.errors.InvalidSettlement` (a ``ValueError``) with the
cause and the accepted range.

:func:`clip_reason` is for reasons kmq builds itself (``@marked`` from an
exception text): those are cut to fit rather than refused, so an automatic
settlement never fails.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from kmq.core.errors import InvalidSettlement
from kmq.core.markers import clip_utf8

__all__ = ["MAX_MS", "MAX_REASON_BYTES", "Released", "delay_ms", "lease_ms", "reject_reason", "clip_reason"]

#: Largest ``u32`` milliseconds value on the wire (about 49.7 days).
MAX_MS = 0xFFFFFFFF
#: Largest REJECT reason in utf-8 bytes (``u16`` length prefix).
MAX_REASON_BYTES = 0xFFFF


class Released(float):
    """The NACK delay (seconds) of a message given back *without a delivery*: fetched, never handed
    to user code (a close, a scheduled message not due yet). Written as a NACK "not a delivery"
    (docs/protocol.md), so the tracker's copy keeps the message's ``kmq-delivery-count``. A float,
    so every place that takes a nack delay takes it."""

    __slots__ = ()


def _show(value: Any) -> str:
    """``repr`` for an error message, short even for a 10,000-digit int."""
    try:
        text = repr(value)
    except ValueError:  # ints beyond sys.get_int_max_str_digits() refuse repr
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= 40 else text[:37] + "..."


def _seconds(what: str, value: Any) -> float:
    # bool is an int to Python, but nack(True) is a bug, not a delay of 1 s.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidSettlement(f"{what} must be a number of seconds, got {_show(value)}")
    try:
        seconds = float(value)
    except OverflowError:  # an int or Fraction beyond any float
        raise InvalidSettlement(f"{what} is out of range (about 49.7 days at most), got {_show(value)}") from None
    if not math.isfinite(seconds):
        raise InvalidSettlement(f"{what} must be a finite number of seconds, got {_show(value)}")
    return seconds


def _to_ms(what: str, seconds: float, value: Any) -> int:
    ms = round(seconds * 1000)
    if ms > MAX_MS:
        raise InvalidSettlement(
            f"{what} must be at most {MAX_MS / 1000} seconds (about 49.7 days: the wire carries u32 ms), got {_show(value)}"
        )
    return ms


def delay_ms(delay: Any) -> int:
    """``nack`` delay in seconds -> wire milliseconds (0 = redeliver now)."""
    seconds = _seconds("nack delay", delay)
    if seconds < 0:
        raise InvalidSettlement(f"nack delay must be >= 0 seconds, got {_show(delay)}")
    return _to_ms("nack delay", seconds, delay)


def lease_ms(lease: Any) -> int:
    """``renew`` lease in seconds -> wire milliseconds (at least 1 ms)."""
    seconds = _seconds("lease", lease)
    if seconds <= 0:
        raise InvalidSettlement(f"lease must be > 0 seconds, got {_show(lease)}")
    ms = _to_ms("lease", seconds, lease)
    if ms < 1:
        raise InvalidSettlement(f"lease must be at least 1 ms (the wire's unit), got {_show(lease)}")
    return ms


def reject_reason(reason: Any) -> str:
    """``reject`` reason as the text the wire carries (``str()`` of non-strings)."""
    text = reason if isinstance(reason, str) else str(reason)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidSettlement(f"reject reason is not valid unicode text ({exc.reason} at {exc.start})") from None
    if size > MAX_REASON_BYTES:
        raise InvalidSettlement(
            f"reject reason is {size} utf-8 bytes; the wire carries at most {MAX_REASON_BYTES} (shorten it)"
        )
    return text


def clip_reason(text: str) -> str:
    """``text`` made valid utf-8 and cut at a character boundary to fit the wire."""
    return clip_utf8(text, MAX_REASON_BYTES)
