"""Coalescing buffer of acks, nacks, rejects and renews -> marker objects.

Pure: no Kafka, no threads (the owner guards it with its lock). Settlements
are appended per queue partition as bare offsets (cheap on the hot path);
:meth:`AckBuffer.drain` turns them into one marker per partition per type
(and per lease / delay / reason value) with consecutive offsets coalesced
into ranges. So a flush of 6,000 acks on one partition is one END record.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from kmq.core.markers import End, Marker, Nack, Reject, Renew
from kmq.core.message import ACK, NACK, REJECT
from kmq.core.ranges import coalesce
from kmq.core import settlement
from kmq.core.settlement import MAX_MS, reject_reason

__all__ = ["AckBuffer", "Drained"]


@dataclass
class Drained:
    """What one :meth:`AckBuffer.drain` produced."""

    markers: list[tuple[int, Marker]] = field(default_factory=list)  # (queue partition, marker)
    #: Acks waiting for their END to be acknowledged: (partition, offset, future).
    waiting: list[tuple[int, int, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # outcome -> messages ("acked", "nacked", ...)

    def __bool__(self) -> bool:
        return bool(self.markers)


def _u32_ms(name: str, value: int) -> int:
    # Refuse here, at append time: a value the marker cannot carry found only at
    # drain time would fail the whole flush and lose every other message's ack in it.
    value = int(value)
    if not 0 <= value <= MAX_MS:
        raise ValueError(f"{name} must be within 0..{MAX_MS} ms, got {value}")
    return value


def _chunks(offsets: list[int], max_ranges: int):
    ranges = coalesce(offsets)
    for i in range(0, len(ranges), max_ranges):
        yield ranges[i : i + max_ranges]


class AckBuffer:
    """Pending settlements per queue partition, drained into coalesced markers."""

    __slots__ = ("_end", "_nack", "_reject", "_renew", "_size", "max_ranges", "_waiting", "before_drain")

    def __init__(self, max_ranges: int = 0xFFFF) -> None:
        self._end: dict[int, list[int]] = defaultdict(list)
        self._nack: dict[tuple[int, int, bool], list[int]] = defaultdict(list)  # (partition, delay_ms, counted)
        self._reject: dict[tuple[int, str], list[int]] = defaultdict(list)  # (partition, reason)
        self._renew: dict[tuple[int, int], list[int]] = defaultdict(list)  # (partition, lease_ms)
        self._size = 0
        self.max_ranges = max_ranges
        self._waiting: list[tuple[int, int, Any]] = []  # acks with a response: (partition, offset, future)
        #: Called first by each :meth:`drain` (under the owner's lock, as the drain is): a settler
        #: that notes acks and buffers them per run (:class:`~kmq.consumer.consumer.KmqConsumer`)
        #: puts them in, so no drain misses one.
        self.before_drain: list[Callable[[], None]] = []

    def __len__(self) -> int:
        """Number of buffered settlements (renews included)."""
        return self._size

    def ack(self, partition: int, offset: int) -> None:
        self._end[partition].append(offset)
        self._size += 1

    def settle(self, partition: int, offset: int, outcome: str, arg: object) -> None:
        """Buffer the marker of a :class:`~kmq.core.message.KmqMessage` settlement: ACK, NACK
        (``arg``: delay in seconds; a :class:`~kmq.core.settlement.Released` one is not a delivery),
        REJECT (``arg``: reason); ABANDON writes none. An ACK's ``arg`` is None or the future of an ack
        with a response (handed out by :meth:`drain`)."""
        if outcome is ACK:
            self._end[partition].append(offset)
            self._size += 1
            if arg is not None:
                self._waiting.append((partition, offset, arg))
        elif outcome is NACK:
            self.nack(partition, offset, settlement.delay_ms(arg), not isinstance(arg, settlement.Released))
        elif outcome is REJECT:
            self.reject(partition, offset, str(arg))

    def ack_many(self, partition: int, offsets: list[int]) -> None:
        self._end[partition].extend(offsets)
        self._size += len(offsets)

    def nack(self, partition: int, offset: int, delay_ms: int = 0, counted: bool = True) -> None:
        """``counted=False``: given back without a delivery (the copy keeps the delivery count)."""
        self._nack[(partition, _u32_ms("delay_ms", delay_ms), counted)].append(offset)
        self._size += 1

    def reject(self, partition: int, offset: int, reason: str = "") -> None:
        self._reject[(partition, reject_reason(reason))].append(offset)
        self._size += 1

    def renew(self, partition: int, offset: int, lease_ms: int) -> None:
        self._renew[(partition, _u32_ms("lease_ms", lease_ms))].append(offset)
        self._size += 1

    def renew_many(self, partition: int, offsets: list[int], lease_ms: int) -> None:
        self._renew[(partition, _u32_ms("lease_ms", lease_ms))].extend(offsets)
        self._size += len(offsets)

    def drop_partition(self, partition: int) -> int:
        """Forget everything buffered for ``partition``; return how many entries."""
        n = len(self._end.pop(partition, ()))
        for table in (self._nack, self._reject, self._renew):
            for k in [k for k in table if k[0] == partition]:
                n += len(table.pop(k))  # type: ignore[arg-type]  # k is a key of table
        self._size -= n
        return n

    def drain(self) -> Drained:
        """Everything buffered as markers, and empty the buffer.

        Order within a partition: RENEW first, then END, NACK, REJECT, so a
        renew and an ack of the same message in one flush leave it acked.
        A renew of an offset settled in the same flush is dropped.
        """
        for fold in self.before_drain:
            fold()
        out = Drained()
        if not self._size:
            return out
        settled: dict[int, set[int]] = defaultdict(set)
        counts = {"acked": 0, "nacked": 0, "rejected": 0, "renewed": 0}
        if self._waiting:
            out.waiting, self._waiting = self._waiting, []
        ends, nacks, rejects, renews = self._end, self._nack, self._reject, self._renew
        self._end, self._nack, self._reject, self._renew = defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list)
        self._size = 0
        body: list[tuple[int, Marker]] = []
        for p, offs in ends.items():
            counts["acked"] += len(offs)
            if renews:
                settled[p].update(offs)
            for chunk in _chunks(offs, self.max_ranges):
                body.append((p, End(tuple(chunk))))
        for (p, delay, counted), offs in nacks.items():
            counts["nacked"] += len(offs)
            settled[p].update(offs)
            for chunk in _chunks(offs, self.max_ranges):
                body.append((p, Nack(tuple(chunk), delay, counted)))
        for (p, reason), offs in rejects.items():
            counts["rejected"] += len(offs)
            settled[p].update(offs)
            for chunk in _chunks(offs, self.max_ranges):
                body.append((p, Reject(tuple(chunk), reason)))
        for (p, lease), offs in renews.items():
            done = settled.get(p)
            live = [o for o in offs if o not in done] if done else offs
            counts["renewed"] += len(set(live))
            for chunk in _chunks(live, self.max_ranges):
                out.markers.append((p, Renew(tuple(chunk), lease)))
        out.markers.extend(body)
        out.counts = {k: v for k, v in counts.items() if v}
        return out
