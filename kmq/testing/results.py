"""What a test reads back from a :class:`~kmq.testing.queue.TestQueue`: its topics, decoded.

Nothing here is bookkeeping of its own: every answer is read from the simulated
topics the real consumer and tracker wrote, the way ``kmq trace`` or an
operator would read a real cluster:

* the queue topic: every record, first deliveries and the tracker's copies, each with
  its delivery count (the ``kmq-delivery-count`` header);
* the markers topic: which offsets an END, NACK or REJECT marker settled;
* the dead-letter topic: each dead letter with its reason and delivery count.
"""

from __future__ import annotations

from dataclasses import dataclass

from kmq.config import QueueConfig
from kmq.core.markers import End, Nack, Reject, decode_record
from kmq.core.message import HEADER_DLQ_ERROR, HEADER_DLQ_REASON, HEADER_ORIGIN, delivery_count_of, header_text
from kmq.dev.sim import SimCluster
from kmq.dev.sim.log import StoredRecord

__all__ = ["Delivered", "Nacked", "Rejected", "DeadLetter", "QueueView"]

Headers = tuple[tuple[str, "bytes | None"], ...]


@dataclass(frozen=True)
class Delivered:
    """One record of the queue topic: a produced message or a copy the tracker redelivered."""

    value: bytes | None
    key: bytes | None
    partition: int
    offset: int
    delivery_count: int  # 1 for a produced message, one more for each copy
    headers: Headers


@dataclass(frozen=True)
class Nacked:
    """A delivery settled with ``nack(delay)`` (an exception in ``run()``'s handler, ``RELEASE``)."""

    message: Delivered
    delay: float  # seconds

    @property
    def value(self) -> bytes | None:
        return self.message.value


@dataclass(frozen=True)
class Rejected:
    """A delivery settled with ``reject(reason)`` (``reject_on`` in ``run()``, ``REJECT``)."""

    message: Delivered
    reason: str

    @property
    def value(self) -> bytes | None:
        return self.message.value


@dataclass(frozen=True)
class DeadLetter:
    """A record of the dead-letter topic, written by the tracker."""

    value: bytes | None
    key: bytes | None
    reason: str  # ``kmq-dlq-reason``: why it is here (``rejected``, ``max_deliveries``, ...)
    error: str  # ``kmq-dlq-error``: the reject's reason text (``run()``: ``"Type: message"``), else ""
    delivery_count: int  # deliveries the message had
    origin: str | None  # ``topic/partition/offset`` of the first delivery
    headers: Headers


class QueueView:
    """Reads one queue's topics on a simulated cluster (call under the cluster's lock)."""

    def __init__(self, cluster: SimCluster, queue: QueueConfig) -> None:
        self.cluster = cluster
        self.queue = queue

    def _records(self, topic: str) -> list[tuple[int, StoredRecord]]:
        out: list[tuple[int, StoredRecord]] = []
        for p in range(self.cluster.partition_counts()[topic]):
            plog = self.cluster.log(topic, p)
            out.extend((p, r) for r in plog.read(plog.log_start, plog.high_water - plog.log_start))
        return out

    def records(self) -> list[Delivered]:
        """Every record of the queue topic, by partition and offset."""
        return [Delivered(r.value, r.key, p, r.offset, delivery_count_of(list(r.headers)), tuple(r.headers))
                for p, r in self._records(self.queue.name)]

    def settlements(self) -> list[tuple[object, Delivered]]:
        """``(marker, record)`` for each offset an END, NACK or REJECT settled, in the order written
        (per partition)."""
        by_offset = {(d.partition, d.offset): d for d in self.records()}
        out: list[tuple[object, Delivered]] = []
        for p, r in self._records(self.queue.markers_topic):
            marker = decode_record(r.key, r.value, p)
            if not isinstance(marker, (End, Nack, Reject)):
                continue
            for rng in marker.ranges:
                for offset in range(rng.first, rng.first + rng.count):
                    record = by_offset.get((p, offset))
                    if record is not None:
                        out.append((marker, record))
        return out

    def dead_letters(self) -> list[DeadLetter]:
        out = []
        for _p, r in self._records(self.queue.dlq_topic):
            headers = list(r.headers)
            out.append(DeadLetter(r.value, r.key, header_text(headers, HEADER_DLQ_REASON) or "",
                                  header_text(headers, HEADER_DLQ_ERROR) or "", delivery_count_of(headers),
                                  header_text(headers, HEADER_ORIGIN), tuple(headers)))
        return out
