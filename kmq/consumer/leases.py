"""Leases a :class:`~kmq.consumer.consumer.KmqConsumer` keeps running for its messages.

* :class:`HeldLeases`: messages held by the consumer but not handed to user
  code yet (START sent, waiting for the commit, e.g. through a rebalance, or
  for a free handler) get a RENEW half a lease after their lease started, so
  held messages never time out (the Pub/Sub client's lease management).
  Flow control keeps this rare; a rebalance or a slow spell is when it counts.
* :func:`auto_renewal`: with ``consumer.auto_renew``, handed-over messages are
  renewed up to ``consumer.max_lease`` (:class:`~kmq.core.lease.LeaseKeeper`).
* :class:`LateSettler`: a handed-over message whose lease ended unsettled left
  flow control (:mod:`kmq.consumer.lease_expiry`); settling it later still
  writes its marker (the tracker counts a late ack if it redelivered it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

from kmq.consumer.ack_buffer import AckBuffer
from kmq.consumer.lease_expiry import LeaseExpiry
from kmq.core.lease import LeaseKeeper, LeaseSchedule, default_margin
from kmq.core.log_fields import log_fields
from kmq.core.message import KmqMessage, unsettled
from kmq.consumer.writer import _ms

__all__ = ["HeldLeases", "AutoRenewal", "auto_renewal", "LateSettler"]

log = logging.getLogger(__name__)


def _renew(buffer: Any, keys: Iterable[tuple[int, int]], lease: float) -> int:
    by_part: dict[int, list[int]] = defaultdict(list)
    for p, off in keys:
        by_part[p].append(off)
    for p, offs in by_part.items():
        buffer.renew_many(p, offs, _ms(lease))
    return sum(map(len, by_part.values()))


class HeldLeases:
    """RENEW what the consumer holds, half a lease after each batch's lease (re)started."""

    def __init__(self, name: str, lease: float, buffer: Any, lock: threading.Lock) -> None:
        self.name, self.lease, self._buffer, self._lock = name, lease, buffer, lock
        self._next = 0.0  # next look

    def renew_due(self, pending: Iterable[Any], ready: Any, now: float) -> None:
        """``pending``: fetch batches (``leased_at``, ``messages``); ``ready``: the consumer's
        :class:`~kmq.consumer.ready_queue.ReadyQueue`."""
        half = self.lease / 2
        if now < self._next:
            return
        self._next = now + max(0.05, half / 4)
        due: list[KmqMessage] = []
        for b in pending:
            if b.leased_at + half <= now:
                b.leased_at = now
                due.extend(b.messages)
        due.extend(ready.due_for_renewal(now - half, now))
        if not due:
            return
        with self._lock:
            n = _renew(self._buffer, ((m.partition, m.offset) for m in due if m._outcome is None), self.lease)
        log.debug("%s: renewed %d held message(s)", self.name, n)


class AutoRenewal:
    """``consumer.auto_renew``: the keeper's callbacks (under the consumer's lock)."""

    def __init__(self, name: str, max_lease: float, buffer: Any, expiry: LeaseExpiry | None = None) -> None:
        self.name, self.max_lease, self._buffer, self._expiry = name, max_lease, buffer, expiry
        self.exhausted = 0  # messages that reached max_lease unsettled

    def renew(self, lease: float, messages: list) -> None:
        keys = [(m.partition, m.offset) for m in messages]
        _renew(self._buffer, keys, lease)
        if self._expiry is not None:  # their leases go on: they keep their room in flow control
            deadline = time.monotonic() + lease
            for key in keys:
                self._expiry.extend(key, deadline)

    def exhausted_leases(self, messages: list) -> None:
        self.exhausted += len(messages)
        first = min((m.partition, m.offset) for m in messages)
        log.warning(
            "%d message(s) of %s (first %s/%d/%d) reached consumer.max_lease (%gs) without being settled; "
            "no more automatic renewals: the tracker will redeliver them when their current lease ends",
            len(messages), self.name, self.name, first[0], first[1], self.max_lease,
            extra=log_fields(self.name, first[0], first[1], count=len(messages)),
        )


def auto_renewal(name: str, lease: float, max_lease: float, flush_interval: float, buffer: Any,
                 lock: threading.Lock, expiry: LeaseExpiry | None = None
                 ) -> tuple[LeaseSchedule, LeaseKeeper, AutoRenewal]:
    """The schedule, keeper thread (not started) and callbacks of ``consumer.auto_renew``."""
    # A RENEW's deadline counts from its marker time, which is up to a flush
    # interval after the keeper decided it: keep that much of max_lease in hand.
    budget = max(lease, max_lease - 2 * flush_interval)
    schedule = LeaseSchedule(lease, budget, default_margin(lease, flush_interval), unsettled=unsettled)
    renewal = AutoRenewal(name, max_lease, buffer, expiry)
    keeper = LeaseKeeper(schedule, lock, renewal.renew, renewal.exhausted_leases,
                         max_sleep=max(0.05, min(0.5, lease / 4)))
    return schedule, keeper, renewal


class LateSettler:
    """Settles messages whose lease ended in user code unsettled (they already left the in-flight
    count and flow control): the marker is still written, nothing else is counted. To the tracker
    it is a late ack if it redelivered the message meanwhile, else a normal settlement."""

    def __init__(self, name: str, lease: float, buffer: AckBuffer,
                 on_settled: Callable[[KmqMessage, str], None] | None = None) -> None:
        self.name, self.lease, self._buffer = name, lease, buffer
        self._on_settled = on_settled  # e.g. per-key ordering: a late ack releases the key
        self.settled_late = 0

    def settled(self, msg: KmqMessage, outcome: str, arg: Any) -> None:
        self._buffer.settle(msg.partition, msg.offset, outcome, arg)
        self.settled_late += 1
        if self._on_settled is not None:
            self._on_settled(msg, outcome)
        log.debug("%s/%d/%d settled (%s) after its lease ended; marker written", self.name, msg.partition,
                  msg.offset, outcome)

    def renewed(self, msg: KmqMessage, lease: float | None) -> None:
        self._buffer.renew(msg.partition, msg.offset, _ms(lease or self.lease))
