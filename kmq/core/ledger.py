"""An independent account of a queue, reconstructed from its three topics.

Pure (no Kafka import): fed with queue records, marker records and DLQ
records as they are read, it answers "what happened to every message":
produced, acknowledged, redelivered, dead-lettered, still open, lost. The
demo's live view and its guarantee line come from here, and tests use it to
check the guarantee without trusting the components under test.

A message is identified by its origin (``topic/partition/offset`` of the first
delivery; redelivered copies carry it in the ``kmq-origin`` header).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from kmq.core.markers import BadMarker, Closed, End, Outcome, Start, decode_record
from kmq.core.message import HEADER_DLQ_REASON, HEADER_ORIGIN, header_text, origin_of

__all__ = ["Ledger", "LedgerSnapshot"]


@dataclass(frozen=True)
class LedgerSnapshot:
    produced: int  # first deliveries seen in the queue
    deliveries: int  # all records in the queue (first deliveries + redelivered copies)
    started: int  # queue offsets with a START marker
    acked: int  # distinct messages (origins) acknowledged at least once
    ack_markers_offsets: int  # offsets covered by END markers (duplicates included)
    duplicates: int  # extra acks: acked deliveries beyond one per message
    redelivered: int  # offsets closed with outcome "redelivered"
    dead_lettered: int  # distinct messages in the DLQ
    dlq_records: int  # DLQ records (more than dead_lettered means a duplicate dead letter)
    dlq_reasons: dict[str, int]
    missing: int  # offsets closed as gone from the queue log
    open: int  # produced messages neither acked nor dead-lettered yet
    bad_markers: int

    @property
    def lost(self) -> int:
        """Messages that are neither acknowledged nor dead-lettered. Only a loss once
        the system has drained (nothing can still be redelivered)."""
        return self.open


@dataclass
class Ledger:
    queue: str
    _origin_of: dict[tuple[int, int], str] = field(default_factory=dict)
    _originals: set[str] = field(default_factory=set)
    _started: set[tuple[int, int]] = field(default_factory=set)
    _acked_offsets: set[tuple[int, int]] = field(default_factory=set)
    _unresolved_acks: set[tuple[int, int]] = field(default_factory=set)
    _acked_origins: Counter = field(default_factory=Counter)
    _dlq_origins: Counter = field(default_factory=Counter)
    _dlq_reasons: Counter = field(default_factory=Counter)
    _dlq_reason_of: dict[str, str] = field(default_factory=dict)  # origin -> reason of its (last) dead letter
    _ack_offsets_total: int = 0
    _redelivered: int = 0
    _missing: int = 0
    _bad: int = 0
    _deliveries: int = 0

    # ------------------------------------------------------------ feeding
    def add_queue_record(self, partition: int, offset: int, headers: Sequence[tuple[str, bytes | None]] | None) -> None:
        key = (partition, offset)
        if key in self._origin_of:
            return
        origin = origin_of(headers, self.queue, partition, offset)
        self._origin_of[key] = origin
        self._deliveries += 1
        if origin == f"{self.queue}/{partition}/{offset}":  # no (trusted) kmq-origin: a first delivery
            self._originals.add(origin)
        if key in self._unresolved_acks:
            self._unresolved_acks.discard(key)
            self._acked_origins[origin] += 1

    def add_marker_record(self, key: bytes | None, value: bytes | None, partition: int) -> None:
        """A record of markers partition ``partition`` (= the queue partition its markers are about)."""
        marker = decode_record(key, value, partition)
        if isinstance(marker, BadMarker):
            self._bad += 1
            return
        if isinstance(marker, Start):
            for r in marker.ranges:
                self._started.update((partition, o) for o in r.offsets())
        elif isinstance(marker, End):
            for r in marker.ranges:
                self._ack_offsets_total += r.count
                for o in r.offsets():
                    k = (partition, o)
                    if k in self._acked_offsets:
                        continue  # the same delivery acked twice (a late or repeated END)
                    self._acked_offsets.add(k)
                    origin = self._origin_of.get(k)
                    if origin is None:
                        self._unresolved_acks.add(k)
                    else:
                        self._acked_origins[origin] += 1
        elif isinstance(marker, Closed):
            n = marker.offset_count()
            if marker.outcome is Outcome.REDELIVERED:
                self._redelivered += n
            elif marker.outcome is Outcome.MISSING:
                self._missing += n

    def add_dlq_record(self, partition: int, offset: int, headers: Sequence[tuple[str, bytes | None]] | None) -> None:
        origin = header_text(headers, HEADER_ORIGIN) or f"?dlq/{partition}/{offset}"
        self._dlq_origins[origin] += 1
        reason = header_text(headers, HEADER_DLQ_REASON) or "unknown"
        self._dlq_reasons[reason] += 1
        self._dlq_reason_of[origin] = reason

    def add_records(self, topic_kind: str, records: Iterable) -> None:
        """Feed records (:class:`kmq.client.Record` or alike) of one kind: "queue", "markers" or "dlq"."""
        for r in records:
            if topic_kind == "queue":
                self.add_queue_record(r.partition, r.offset, r.headers)
            elif topic_kind == "markers":
                self.add_marker_record(r.key, r.value, r.partition)
            else:
                self.add_dlq_record(r.partition, r.offset, r.headers)

    # ------------------------------------------------------------ answers
    def snapshot(self) -> LedgerSnapshot:
        acked = self.acked_origins()
        dead = {o for o in self._dlq_origins if o in self._originals}
        settled = acked | dead
        return LedgerSnapshot(
            produced=len(self._originals),
            deliveries=self._deliveries,
            started=len(self._started),
            acked=len(acked),
            ack_markers_offsets=self._ack_offsets_total,
            duplicates=sum(self._acked_origins[o] for o in acked) - len(acked),
            redelivered=self._redelivered,
            dead_lettered=len(dead),
            dlq_records=sum(self._dlq_origins.values()),
            dlq_reasons=dict(self._dlq_reasons),
            missing=self._missing,
            open=len(self._originals - settled),
            bad_markers=self._bad,
        )

    def unsettled(self, limit: int = 20) -> list[str]:
        """Origins of messages neither acked nor dead-lettered (for error messages)."""
        settled = set(self._acked_origins) | set(self._dlq_origins)
        return sorted(self._originals - settled)[:limit]

    def dead_letters(self) -> dict[str, str]:
        """Dead-lettered messages of this queue: origin -> ``kmq-dlq-reason``."""
        return {o: r for o, r in self._dlq_reason_of.items() if o in self._originals}

    def acked_origins(self) -> set[str]:
        """Messages of this queue acknowledged at least once."""
        return {o for o in self._acked_origins if o in self._originals}

    def acked_and_dead(self) -> set[str]:
        """Origins both acknowledged and dead-lettered (a poison message must not be both)."""
        return {o for o in self._dlq_origins if self._acked_origins.get(o)}

    def dlq_duplicates(self) -> dict[str, int]:
        return {o: n for o, n in self._dlq_origins.items() if n > 1}
