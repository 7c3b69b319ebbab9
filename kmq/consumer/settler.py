"""What a settlement does to a :class:`~kmq.consumer.consumer.KmqConsumer`'s books: the
:class:`~kmq.core.message.Settler` side of the consumer, called under its lock.

A settlement's marker goes into the writer's :class:`~kmq.consumer.ack_buffer.AckBuffer`; the
partition's in-flight count and the flow-control counts go down; the message leaves the renewal
schedule and the extended leases; tracing and ``ordering: key`` are told. A plain ack, the
settlement nearly every message makes, is only noted, and a run of them is booked at once
(:meth:`ConsumerSettler._fold_acks`) before the next flush or flow-control look.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping

from kmq.consumer.give_back import RETURNED
from kmq.consumer.writer import _ms
from kmq.core.message import ABANDON, ACK, KmqMessage, offsets_by_partition
from kmq.core.settlement import Released

if TYPE_CHECKING:
    from kmq.config import QueueConfig
    from kmq.consumer.ack_buffer import AckBuffer
    from kmq.consumer.flow import FlowControl
    from kmq.consumer.key_hold import KeyHold
    from kmq.consumer.lease_expiry import LeaseExpiry
    from kmq.core.lease import LeaseSchedule
    from kmq.telemetry.tracing import DeliveryTracing

__all__ = ["ConsumerSettler"]


class ConsumerSettler:
    """The consumer's settlement bookkeeping; :class:`~kmq.consumer.consumer.KmqConsumer` sets
    these attributes up (one lock, the writer's, guards them)."""

    queue: QueueConfig
    flow: FlowControl
    _acks: AckBuffer
    _inflight: dict[int, int]
    _acked: list[KmqMessage]
    _fold_later: bool
    _settled_counts: list[int]
    _returned_counts: list[int]
    _schedule: LeaseSchedule | None
    _tracked: Mapping[Any, Any]
    _extended: dict[tuple[int, int], float]
    _expiry: LeaseExpiry
    _tracing: DeliveryTracing | None
    _keys: KeyHold | None

    def settled(self, msg: KmqMessage, outcome: str, arg: Any) -> None:
        if outcome is ACK and arg is None and self._fold_later:
            # The settlement nearly every message makes: its bookkeeping is done for a run of acks at
            # once (_fold_acks), before the next flush or flow-control look. The outcome is already
            # set (under the lock), which is what expiry, renewals and a second settlement look at.
            self._acked.append(msg)
            return
        p = msg.partition
        self._acks.settle(p, msg.offset, outcome, arg)
        self._inflight[p] -= 1
        # Counted here, folded into the flow state by the fetcher (no clock read per message).
        # Given back without a delivery (RETURNED, Released: a close, a scheduled message): no settlement for the rate.
        c = self._returned_counts if outcome is not ACK and (
            (outcome is ABANDON and arg == RETURNED) or type(arg) is Released) else self._settled_counts
        c[0] += 1
        c[1] += msg._nbytes
        if self._tracked:  # only messages still unsettled after their batch's look are tracked
            self._schedule.forget(msg)  # type: ignore[union-attr]
        if self._extended:
            self._extended.pop((p, msg.offset), None)
        if self._tracing is not None:
            self._tracing.settled(msg, outcome)
        if self._keys is not None:
            if outcome is ACK:  # the common case, kept short
                self._keys.keyed.settled(msg, True, 0.0)
            else:
                self._keys.settled(msg, outcome, arg)

    def settled_many(self, msgs: list[KmqMessage]) -> None:
        """A run of plain acks (:func:`~kmq.core.message.ack_all`; their outcomes are set), under
        the lock: noted at once for :meth:`_fold_acks`, or each as :meth:`settled` does when
        ``ordering: key`` or tracing hears of each settlement."""
        if self._fold_later:
            self._acked += msgs
            return
        settled = self.settled
        for m in msgs:
            settled(m, ACK, None)

    def _fold_acks(self) -> None:
        """The acks :meth:`settled` only noted: their END offsets into the writer's buffer (one
        append per partition), the in-flight and flow counts, and out of the renewal
        schedule and the extended leases (under self._lock; the buffer calls it before each drain).
        A message tracked or extended after its ack is not renewed: both look at the outcome first,
        and a RENEW buffered before the fold is dropped by the drain that writes the END."""
        acked = self._acked
        if not acked:
            return
        self._acked = []
        inflight, buffer = self._inflight, self._acks
        for p, offsets in offsets_by_partition(acked).items():
            buffer.ack_many(p, offsets)
            inflight[p] -= len(offsets)
        counts = self._settled_counts
        counts[0] += len(acked)
        counts[1] += sum([m._nbytes for m in acked])
        if self._tracked:
            forget = self._schedule.forget  # type: ignore[union-attr]  # tracked: there is a schedule
            for m in acked:
                forget(m)
        if self._extended:
            extended = self._extended
            for m in acked:
                extended.pop((m.partition, m.offset), None)

    def _fold_settlements(self, now: float) -> None:
        """Move the settlement counts into the flow state (under self._lock)."""
        self._fold_acks()
        if self._settled_counts[0]:
            self.flow.settled(self._settled_counts[0], self._settled_counts[1], now)
            self._settled_counts[:] = [0, 0]
        if self._returned_counts[0]:
            self.flow.returned(self._returned_counts[0], self._returned_counts[1], now)
            self._returned_counts[:] = [0, 0]

    def renewed(self, msg: KmqMessage, lease: float | None) -> None:
        lease = lease or self.queue.lease
        key = (msg.partition, msg.offset)
        self._acks.renew(msg.partition, msg.offset, _ms(lease))
        now = time.monotonic()
        if self._schedule is not None:
            self._schedule.renewed(msg, now, lease)
        self._expiry.extend(key, now + lease)
