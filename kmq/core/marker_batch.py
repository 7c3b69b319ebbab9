"""Markers read from one markers partition, applied to its lease state without I/O.

The tracker's step asks :func:`to_apply` which partitions' fetched records to apply
(those of partitions positioned before the fetch, with the fetch's floor for those
at their log end), feeds each batch to :func:`apply_batch` and counts and logs what
it answers (:class:`Applied`):

* a record that is no marker (:func:`~kmq.core.markers.decode_record` names why)
  is skipped: the position moves past it;
* a marker of a newer wire version that cannot be read by its version-1 fields
  *holds* the partition: nothing after it is applied, so the position (and the
  commit) stays at it until a tracker that reads it takes over; one of a newer
  version that can be is applied by those fields, and its version reported;
* every other marker is applied to the
  :class:`~kmq.core.lease_state.PartitionState` at ``read_ms`` (``floor_ms``:
  it was written after then, see :mod:`kmq.core.marker_clock`); the STARTs read
  so are reported with their record time for the clock-skew gauge.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Container, Iterable, Mapping, Protocol, TypeVar

from kmq.core.lease_state import PartitionState
from kmq.core.markers import VERSION, BadMarker, Start, decode_record

__all__ = ["Applied", "FetchedRecord", "Reading", "RecordLike", "apply_batch", "to_apply"]


class RecordLike(Protocol):
    """What is read of a markers record (either client's record fits)."""

    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int: ...


class FetchedRecord(RecordLike, Protocol):
    """A fetched markers record: its partition too."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...


class Reading(Protocol):
    """What :func:`to_apply` reads of a partition (:class:`tracker.partition.OwnedPartition`)."""

    positioned: bool  # sought to its committed offset since it was assigned or re-read
    at_end: bool  # at its log end after the fetch before (its markers read now were written after it)


P = TypeVar("P", bound=Reading)
R = TypeVar("R", bound=FetchedRecord)


def to_apply(records: Iterable[R], owned: Mapping[Any, P], just_positioned: Container[Any],
             floor_ms: int | None, stale: bool = False) -> list[tuple[P, list[R], int | None]]:
    """The fetched ``records`` by partition, in offset order, each with the partition of ``owned``
    it is applied to and its floor (``floor_ms``, when the fetch before was sent, for a partition
    at its log end then; else None). Records of a partition not owned, not positioned, or positioned
    in this step (``just_positioned``: fetched from its old position) are dropped: it is read again
    from its committed offset. ``stale``: the view was dropped since the fetch (the membership in
    doubt, the clock jumped): all of them are dropped, every partition is read again."""
    if stale:
        return []
    by_partition: dict[tuple[str, int], list[R]] = {}
    for rec in records:
        by_partition.setdefault((rec.topic, rec.partition), []).append(rec)
    out: list[tuple[P, list[R], int | None]] = []
    for tp, batch in by_partition.items():
        o = owned.get(tp)
        if o is not None and o.positioned and tp not in just_positioned:
            out.append((o, batch, floor_ms if o.at_end else None))
    return out


@dataclass
class Applied:
    """What :func:`apply_batch` did."""

    types: Counter = field(default_factory=Counter)  # marker type name (lower case) -> markers applied
    late: int = 0  # offsets closed by a marker that came after their copy was made (MarkerEffect.late)
    bad: list[tuple[int, str]] = field(default_factory=list)  # (offset, why) of records skipped
    newer: list[int] = field(default_factory=list)  # wire version of each marker read by its version-1 fields
    starts: list[tuple[str, int]] = field(default_factory=list)  # (owner, record time) of STARTs with a floor
    held: tuple[int, BadMarker] | None = None  # (offset, marker) it is held at: nothing after it was applied


def apply_batch(state: PartitionState, batch: Iterable[RecordLike], partition: int, read_ms: int,
                floor_ms: int | None) -> Applied:
    """Apply ``batch`` (records of markers ``partition``, in offset order), read at ``read_ms``;
    ``floor_ms``: its markers were written after it (None: replayed or read behind)."""
    out = Applied()
    types, starts = out.types, out.starts
    for rec in batch:
        marker = decode_record(rec.key, rec.value, partition)
        if isinstance(marker, BadMarker):
            if marker.newer is not None:
                out.held = (rec.offset, marker)
                break  # its position stays at that marker: the commit never passes it
            out.bad.append((rec.offset, marker.reason))
            state.skip(rec.offset)
            continue
        if rec.value[0] > VERSION:  # type: ignore[index]  # decoded: not None
            out.newer.append(rec.value[0])  # type: ignore[index]
        out.late += state.apply(marker, rec.offset, rec.timestamp, read_ms, floor_ms).late
        if floor_ms is not None and isinstance(marker, Start):
            starts.append((marker.owner, rec.timestamp))
        types[marker.TYPE.name.lower()] += 1
    return out
