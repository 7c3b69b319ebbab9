"""Marker wire format, version 1, and version 2's NACK flags (docs/protocol.md, "Marker wire format").

Pure: no Kafka import. A marker record is written to markers partition p for
queue partition p:

* key:   ``int32 queue_partition`` (big-endian)
* value: ``u8 version (=1)``, ``u8 type``, then the type's body
* the record timestamp is the marker time

Ranges are ``u16 n`` then n x (``i64 first_offset``, ``u32 count``).

:func:`decode` raises :class:`MarkerDecodeError` (and nothing else) for any
value that is not a valid version-1 marker. :func:`decode_record` is what every
reader of the markers topic calls (tracker, ``kmq status``, ``kmq trace``, the
audit, the Spark job): it also checks the key against the partition the record
was read from, and answers a bad record with a :class:`BadMarker` naming why.

Rolling upgrades (docs/protocol.md, "Rolling upgrades"): every later version
keeps the version-1 layout of each type and may only append fields to it, and
a change a version-1 reader would misread takes a new type code. So a marker of
a newer version and a known type is read by its version-1 fields, the rest
ignored. One of a newer version whose header and ranges parse but whose type
is unknown or whose version-1 body does not parse raises
:class:`~kmq.core.errors.NewerMarkerVersion` (a :class:`MarkerDecodeError`): a
reader must not skip it as garbage, since it may open or keep a lease (the
tracker holds the partition at it). A newer version whose ranges do not parse is
no marker: an ordinary :class:`MarkerDecodeError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Iterable, Union

from kmq.core.errors import MarkerDecodeError, NewerMarkerVersion
from kmq.core.ranges import OffsetRange, RangeOverlapError, normalize

__all__ = [
    "VERSION",
    "NACK_NOT_A_DELIVERY",
    "MarkerType",
    "Outcome",
    "Start",
    "End",
    "Renew",
    "Nack",
    "Reject",
    "Closed",
    "Marker",
    "MarkerDecodeError",
    "NewerMarkerVersion",
    "encode",
    "decode",
    "encode_key",
    "decode_key",
    "BadMarker",
    "decode_record",
    "MAX_OWNER_BYTES",
    "BAD_RECORD",
    "clip_owner",
    "clip_utf8",
]

#: The newest wire version this build reads and writes. Every marker is written as version 1 but a
#: NACK that is not a delivery (``counted=False``), written as version 2: its version-1 body plus a
#: ``u8 flags`` (docs/protocol.md, "Marker wire format"). A version-1 reader reads that NACK by its
#: version-1 fields: a delivery counted, which is what it did before (safe).
VERSION = 2
#: Version 2 NACK flags: bit 0 set = not a delivery (the copy keeps ``kmq-delivery-count``).
NACK_NOT_A_DELIVERY = 0x01

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">BB")
_RANGE = struct.Struct(">qI")

MAX_U16 = 0xFFFF
MAX_U32 = 0xFFFFFFFF
#: Type code that decoders working in columns (kmq.core.markers_bulk) and the lag job give a record
#: that is not a valid marker; the :class:`MarkerType` values are 1..6.
BAD_RECORD = 0
#: Largest owner id of a START marker in utf-8 bytes (``u8`` length prefix).
MAX_OWNER_BYTES = 0xFF
MAX_I64 = (1 << 63) - 1


class MarkerType(IntEnum):
    START = 1
    END = 2
    RENEW = 3
    NACK = 4
    REJECT = 5
    CLOSED = 6


class Outcome(IntEnum):
    """Why the tracker closed a range (CLOSED marker)."""

    REDELIVERED = 1
    DEAD_LETTERED = 2
    MISSING = 3  # offsets no longer in the queue log
    UNDELIVERABLE = 4  # neither the queue nor the DLQ took a copy (cause logged and counted)


def _ranges_field(ranges: Iterable[tuple[int, int]]) -> tuple[OffsetRange, ...]:
    try:
        out = normalize(ranges)
    except RangeOverlapError:
        raise
    if not out:
        raise ValueError("a marker needs at least one offset range")
    if len(out) > MAX_U16:
        raise ValueError(f"a marker holds at most {MAX_U16} ranges, got {len(out)}")
    for r in out:
        if r.count > MAX_U32:
            raise ValueError(f"range count {r.count} exceeds u32")
        if r.first + r.count - 1 > MAX_I64:
            raise ValueError("range runs past the largest i64 offset")
    return out


def _check_u32(name: str, value: int) -> int:
    value = int(value)
    if not 0 <= value <= MAX_U32:
        raise ValueError(f"{name} must be within 0..{MAX_U32} ms, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class _Base:
    ranges: tuple[OffsetRange, ...]
    TYPE: ClassVar[MarkerType]

    def offset_count(self) -> int:
        return sum(r.count for r in self.ranges)


def _init_ranges(obj: _Base) -> None:
    object.__setattr__(obj, "ranges", _ranges_field(obj.ranges))


@dataclass(frozen=True, slots=True)
class Start(_Base):
    """Consumer received these offsets; lease ends at marker time + lease_ms."""

    lease_ms: int
    owner: str = ""
    TYPE: ClassVar[MarkerType] = MarkerType.START

    def __post_init__(self) -> None:
        _init_ranges(self)
        object.__setattr__(self, "lease_ms", _check_u32("lease_ms", self.lease_ms))
        if len(self.owner.encode("utf-8")) > MAX_OWNER_BYTES:
            raise ValueError(f"owner id is longer than {MAX_OWNER_BYTES} utf-8 bytes (clip_owner cuts one to fit)")


@dataclass(frozen=True, slots=True)
class End(_Base):
    """Acknowledged: processing of these offsets is complete."""

    TYPE: ClassVar[MarkerType] = MarkerType.END

    def __post_init__(self) -> None:
        _init_ranges(self)


@dataclass(frozen=True, slots=True)
class Renew(_Base):
    """Lease extension: new deadline = marker time + lease_ms."""

    lease_ms: int
    TYPE: ClassVar[MarkerType] = MarkerType.RENEW

    def __post_init__(self) -> None:
        _init_ranges(self)
        object.__setattr__(self, "lease_ms", _check_u32("lease_ms", self.lease_ms))


@dataclass(frozen=True, slots=True)
class Nack(_Base):
    """Redeliver after delay_ms (0 = now). ``counted=False``: the messages were given back without
    being delivered to user code (a close, a scheduled message not due yet): the copy keeps their
    delivery count (a version-2 marker)."""

    delay_ms: int = 0
    counted: bool = True
    TYPE: ClassVar[MarkerType] = MarkerType.NACK

    def __post_init__(self) -> None:
        _init_ranges(self)
        object.__setattr__(self, "delay_ms", _check_u32("delay_ms", self.delay_ms))


@dataclass(frozen=True, slots=True)
class Reject(_Base):
    """Send to the DLQ now, with a reason."""

    reason: str = ""
    TYPE: ClassVar[MarkerType] = MarkerType.REJECT

    def __post_init__(self) -> None:
        _init_ranges(self)
        raw = self.reason.encode("utf-8")
        if len(raw) > MAX_U16:
            # Cut at a character boundary rather than refuse: the reason is informative only.
            object.__setattr__(self, "reason", raw[:MAX_U16].decode("utf-8", "ignore"))


@dataclass(frozen=True, slots=True)
class Closed(_Base):
    """Written by the tracker once the redelivered or DLQ copy was acknowledged."""

    outcome: Outcome
    TYPE: ClassVar[MarkerType] = MarkerType.CLOSED

    def __post_init__(self) -> None:
        _init_ranges(self)
        object.__setattr__(self, "outcome", Outcome(self.outcome))


Marker = Union[Start, End, Renew, Nack, Reject, Closed]


def encode_key(queue_partition: int) -> bytes:
    """Record key of a marker: the queue partition as big-endian int32."""
    return _I32.pack(queue_partition)


def clip_utf8(text: str, max_bytes: int) -> str:
    """``text`` made valid utf-8 (unencodable characters become ``?``) and cut at a
    character boundary to at most ``max_bytes`` bytes: a text kmq builds itself always fits its field."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= max_bytes:
        return raw.decode("utf-8")
    return raw[:max_bytes].decode("utf-8", "ignore")


def clip_owner(owner: str) -> str:
    """``owner`` cut to fit a START marker (:data:`MAX_OWNER_BYTES`), at a character boundary."""
    return clip_utf8(owner, MAX_OWNER_BYTES)


def decode_key(key: bytes | None) -> int:
    """Queue partition from a marker key; :class:`MarkerDecodeError` if malformed."""
    if key is None or len(key) != 4:
        raise MarkerDecodeError(f"marker key must be 4 bytes, got {0 if key is None else len(key)}")
    (p,) = _I32.unpack(key)
    if p < 0:
        raise MarkerDecodeError(f"marker key holds negative partition {p}")
    return p


def _encode_ranges(ranges: tuple[OffsetRange, ...]) -> bytes:
    parts = [_U16.pack(len(ranges))]
    parts.extend(_RANGE.pack(r.first, r.count) for r in ranges)
    return b"".join(parts)


def encode(marker: Marker) -> bytes:
    """Marker value bytes (version 1)."""
    head = _HEAD.pack(2 if isinstance(marker, Nack) and not marker.counted else 1, marker.TYPE)
    body = _encode_ranges(marker.ranges)
    if isinstance(marker, Start):
        owner = marker.owner.encode("utf-8")
        tail = _U32.pack(marker.lease_ms) + _U8.pack(len(owner)) + owner
    elif isinstance(marker, End):
        tail = b""
    elif isinstance(marker, Renew):
        tail = _U32.pack(marker.lease_ms)
    elif isinstance(marker, Nack):
        tail = _U32.pack(marker.delay_ms)
        if not marker.counted:
            tail += _U8.pack(NACK_NOT_A_DELIVERY)
    elif isinstance(marker, Reject):
        reason = marker.reason.encode("utf-8")
        tail = _U16.pack(len(reason)) + reason
    elif isinstance(marker, Closed):
        tail = _U8.pack(marker.outcome)
    else:  # pragma: no cover - the Union is closed
        raise TypeError(f"not a marker: {marker!r}")
    return head + body + tail


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, st: struct.Struct, what: str) -> tuple:
        end = self.pos + st.size
        if end > len(self.buf):
            raise MarkerDecodeError(f"truncated: {what} needs {st.size} bytes at byte {self.pos}, {len(self.buf) - self.pos} left")
        out = st.unpack_from(self.buf, self.pos)
        self.pos = end
        return out

    def take_bytes(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise MarkerDecodeError(f"truncated: {what} needs {n} bytes at byte {self.pos}, {len(self.buf) - self.pos} left")
        out = bytes(self.buf[self.pos : end])
        self.pos = end
        return out

    def text(self, n: int, what: str) -> str:
        raw = self.take_bytes(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MarkerDecodeError(f"{what} is not valid utf-8") from exc

    def ranges(self) -> tuple[OffsetRange, ...]:
        (n,) = self.take(_U16, "range count")
        if n == 0:
            raise MarkerDecodeError("marker has no offset ranges")
        end = self.pos + n * _RANGE.size
        if end > len(self.buf):
            raise MarkerDecodeError(f"truncated: {n} ranges need {n * _RANGE.size} bytes, {len(self.buf) - self.pos} left")
        raw = list(_RANGE.iter_unpack(self.buf[self.pos : end]))
        self.pos = end
        for first, count in raw:
            if count == 0:
                raise MarkerDecodeError(f"range at offset {first} has count 0")
            if first < 0:
                raise MarkerDecodeError(f"range starts at negative offset {first}")
            if first + count - 1 > MAX_I64:
                raise MarkerDecodeError(f"range at offset {first} runs past the largest offset")
        try:
            return normalize(raw)
        except RangeOverlapError as exc:
            raise MarkerDecodeError(str(exc)) from exc


def _new(cls, **fields):
    # Fields were validated while reading; skip __post_init__'s re-validation.
    obj = object.__new__(cls)
    for k, v in fields.items():
        object.__setattr__(obj, k, v)
    return obj


def decode(value: bytes | bytearray | memoryview | None) -> Marker:
    """Parse a marker value. Raises :class:`MarkerDecodeError` for anything invalid; a value of a
    newer version is read by its version-1 fields or raises :class:`NewerMarkerVersion` (see the
    module docstring)."""
    if value is None:
        raise MarkerDecodeError("marker value is empty (tombstone)")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise MarkerDecodeError(f"marker value must be bytes, got {type(value).__name__}")
    rd = _Reader(bytes(value))
    version, code = rd.take(_HEAD, "header")
    if 1 <= version <= VERSION:
        return _decode_body(rd, code, version)
    if version < 1:
        raise MarkerDecodeError(f"unknown marker version {version} (this build reads versions 1..{VERSION})")
    try:
        ranges = rd.ranges()  # every version starts with them: a value whose ranges do not parse is no marker
    except MarkerDecodeError as exc:
        raise MarkerDecodeError(f"unknown marker version {version} and no marker's ranges after it "
                                f"({exc.reason})") from None
    rd.pos = _HEAD.size
    try:
        return _decode_body(rd, code, version, newer=True)
    except MarkerDecodeError as exc:
        what = f"type {code}" if code not in _TYPES else f"{MarkerType(code).name} ({exc.reason})"
        raise NewerMarkerVersion(f"marker of wire version {version} (this build reads versions 1..{VERSION}) with "
                                 f"{what} not readable by its version-1 fields; it names offsets "
                                 f"{ranges[0].first}..{ranges[-1].last}", version, code) from None


_TYPES = frozenset(int(t) for t in MarkerType)


def _decode_body(rd: _Reader, code: int, version: int, newer: bool = False) -> Marker:
    """The marker of type ``code`` from the ranges on, of wire ``version``; ``newer``: of a later
    version than this build reads, whose fields after the ones it knows are ignored."""
    try:
        mtype = MarkerType(code)
    except ValueError:
        raise MarkerDecodeError(f"unknown marker type {code}") from None
    ranges = rd.ranges()
    marker: Marker
    if mtype is MarkerType.START:
        (lease,) = rd.take(_U32, "lease_ms")
        (n,) = rd.take(_U8, "owner length")
        owner = rd.text(n, "owner id")
        marker = _new(Start, ranges=ranges, lease_ms=lease, owner=owner)
    elif mtype is MarkerType.END:
        marker = _new(End, ranges=ranges)
    elif mtype is MarkerType.RENEW:
        (lease,) = rd.take(_U32, "lease_ms")
        marker = _new(Renew, ranges=ranges, lease_ms=lease)
    elif mtype is MarkerType.NACK:
        (delay,) = rd.take(_U32, "delay_ms")
        flags = 0
        if version >= 2:  # version 2 appended the flags; bits other than NACK_NOT_A_DELIVERY are ignored
            (flags,) = rd.take(_U8, "NACK flags")
        marker = _new(Nack, ranges=ranges, delay_ms=delay, counted=not flags & NACK_NOT_A_DELIVERY)
    elif mtype is MarkerType.REJECT:
        (n,) = rd.take(_U16, "reason length")
        reason = rd.text(n, "reject reason")
        marker = _new(Reject, ranges=ranges, reason=reason)
    else:
        (code_out,) = rd.take(_U8, "outcome")
        try:
            outcome = Outcome(code_out)
        except ValueError:
            raise MarkerDecodeError(f"unknown CLOSED outcome {code_out}") from None
        marker = _new(Closed, ranges=ranges, outcome=outcome)
    if rd.pos != len(rd.buf) and not newer:
        raise MarkerDecodeError(f"{len(rd.buf) - rd.pos} trailing bytes after a {mtype.name} marker")
    return marker


@dataclass(frozen=True, slots=True)
class BadMarker:
    """A markers-topic record that is not a marker of its partition; ``reason`` says why
    (readers count it and skip it: one bad record never stops them). ``newer``: the wire version
    of a marker newer than this build reads by its version-1 fields (:class:`NewerMarkerVersion`):
    not to be skipped where leases are judged (the tracker holds the partition at it)."""

    reason: str
    newer: int | None = None


def decode_record(key: bytes | None, value: bytes | bytearray | memoryview | None, partition: int) -> Marker | BadMarker:
    """The marker of a record read from markers partition ``partition``, or a :class:`BadMarker`:
    a key that is not a marker key or names another queue partition (markers partition p holds the
    markers of queue partition p only), or a value that is not wire format version 1."""
    if key != _I32.pack(partition):  # the common case: the key is the partition's own
        try:
            qp = decode_key(key)
        except MarkerDecodeError as exc:
            return BadMarker(exc.reason)
        return BadMarker(f"marker for queue partition {qp} found in markers partition {partition}")
    try:
        return decode(value)
    except NewerMarkerVersion as exc:
        return BadMarker(exc.reason, exc.version)
    except MarkerDecodeError as exc:
        return BadMarker(exc.reason)
