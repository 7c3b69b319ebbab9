"""The hand-over to user code with per-key ordering (``consumer.ordering: key``).

Same interface as :class:`~kmq.consumer.ready_queue.ReadyQueue` (the fetcher
puts committed batches, user code takes messages), but a message is taken
only when :class:`~kmq.core.key_order.KeyOrder` lets its key go: one message
per key in user code at a time, in offset order, a failed message's copy
before the messages held behind it. Held messages stay here with their
batch's lease time, so :meth:`due_for_renewal` keeps renewing them: holding
never turns into a timeout. The consumer reports every settlement of a
handed message (:meth:`settled`) and every lease that ran out in user code
(:meth:`settled`, :meth:`settled_late`): they are queued without a lock (a
settlement runs under the consumer's lock, which the fetcher's hand-over of a
whole batch must not hold up) and applied by the next take, or at once when
a taker waits.

A newly assigned partition is held (:meth:`hold`) until
:mod:`kmq.consumer.key_recovery` learned which of its keys an earlier owner
left unsettled (:meth:`inherit`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from kmq.core.key_order import KeyOrder, Released
from kmq.core.message import KmqMessage, origin_offset

__all__ = ["KeyedReadyQueue", "copy_origin"]

_LEASED_AT, _GEN = 0, 1  # a batch's cell: [lease (re)started at, generation], shared by its messages


def copy_origin(msg: KmqMessage) -> int | None:
    """The offset of ``msg``'s first delivery when it is the tracker's copy of a record of the same
    partition (``kmq-origin`` names this topic and partition), else None."""
    origin = origin_offset(msg._headers, msg.topic, msg.partition, msg.offset)
    return None if origin == msg.offset else origin


class KeyedReadyQueue:
    """Ready messages handed out in key order (fetcher -> application), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # taken directly on the per-message paths (cheaper than the Condition's)
        self.cond = threading.Condition(self._lock)
        self._order: KeyOrder[tuple[KmqMessage, list]] = KeyOrder()
        self._taken: list[list] = []
        self._waiters = 0  # takers in a take (under the lock or waiting): a settlement wakes them
        #: Settlements not applied yet: (partition, offset, final, deadline), or (partition, None, key,
        #: origin) for a late one; appended without the lock (deque appends are atomic).
        self._settled: deque[tuple] = deque()
        self.error: BaseException | None = None
        self._holds: dict[int, int] = {}  # partition -> how many times it was held (its latest hold)
        #: Held partitions -> the pipeline generation of the hold; the first offset handed over for
        #: one from a batch fetched since (an earlier batch is from an earlier ownership) -> _first.
        self._first_due: dict[int, int] = {}
        self._first: dict[int, int] = {}

    # ------------------------------------------------------------ fetcher side
    def put(self, messages: list[KmqMessage], leased_at: float, gen: int = 0) -> None:
        cell = [leased_at, gen]
        with self.cond:
            self._apply_settled()
            add = self._order.add
            for m in messages:
                add((m, cell), m.partition, m.offset, m.key, copy_origin(m) if m._headers else None)
            if self._first_due:
                for m in messages:
                    if self._first_due.get(m.partition, gen + 1) <= gen:
                        del self._first_due[m.partition]
                        self._first[m.partition] = m.offset
            self.cond.notify_all()

    def expire(self, now: float) -> list[Released]:
        """Release the keys whose copy did not come in time (the consumer warns and counts them)."""
        with self.cond:
            self._apply_settled()
            released = self._order.expire(now)
            if released:
                self.cond.notify_all()
        return released

    # ------------------------------------------------------------ settlements (under the consumer's lock)
    def settled(self, msg: KmqMessage, final: bool, deadline: float) -> None:
        """A handed message was settled (``final``: for good) or its lease ran out (not final)."""
        self._settled.append((msg.partition, msg.offset, final, deadline))
        if self._waiters:  # read after the append: a taker that missed it was counted first (_wait)
            with self._lock:
                self.cond.notify_all()

    def settled_late(self, msg: KmqMessage) -> None:
        """A message whose lease had run out was acked or rejected after all: its key goes on."""
        origin = copy_origin(msg)
        self._settled.append((msg.partition, None, msg.key, msg.offset if origin is None else origin))
        if self._waiters:
            with self._lock:
                self.cond.notify_all()

    def _apply_settled(self) -> None:
        """Apply the queued settlements to the key order (with the lock held)."""
        pending, order = self._settled, self._order
        while pending:
            p, offset, a, b = pending.popleft()
            if offset is None:
                order.settled_late(p, a, b)
            else:
                order.settled(p, offset, a, b)

    # ------------------------------------------------------------ application side
    def _wait(self, timeout: float, stopped: Callable[[], bool]) -> bool:
        """Whether a message may be taken (with the lock held), waiting up to ``timeout``. Counted
        as a waiter before the queued settlements are applied, so one appended meanwhile wakes it."""
        deadline = time.monotonic() + timeout
        self._waiters += 1
        try:
            while True:
                self._apply_settled()
                if self._order.ready:
                    return True
                if self.error is not None:
                    raise self.error
                remaining = deadline - time.monotonic()
                if remaining <= 0 or stopped():
                    return False
                self.cond.wait(remaining)
        finally:
            self._waiters -= 1

    def _took(self, items: list[tuple[KmqMessage, list]]) -> list[KmqMessage]:
        """Record what user code took, per batch lease time (for the fetcher's lease expiry)."""
        out: list[KmqMessage] = []
        last: list | None = None
        rec: list = []
        for m, cell in items:
            out.append(m)
            if cell is not last:  # items of one batch mostly come together: one record per run
                last = cell
                rec = [[], 0, 0, cell[_LEASED_AT]]
                self._taken.append(rec)
            rec[0].append(m)
            rec[2] += 1
        self.cond.notify_all()
        return out

    def take(self, timeout: float, max_records: int, stopped: Callable[[], bool]) -> list[KmqMessage]:
        """Up to ``max_records`` (0: all) messages whose keys are free; as ``ReadyQueue.take``."""
        with self.cond:
            if not self._wait(timeout, stopped):
                return []
            return self._took(self._order.take(max_records if max_records > 0 else self._order.ready))

    def take_chunk(self, timeout: float, max_records: int,
                   stopped: Callable[[], bool]) -> tuple[list[KmqMessage], float, int]:
        """One message at most (as :meth:`take_one`): taking a message lets its key go to user code,
        which :meth:`put_back` cannot undo, so a taker must not take ahead of what it hands on (a
        message waiting there would hold its key). No lease start or generation is kept per take."""
        m = self.take_one(timeout, stopped)
        return ([m] if m is not None else []), 0.0, 0

    def put_back(self, messages: list[KmqMessage], leased_at: float, gen: int) -> bool:
        """False: their keys were let go to user code (:class:`~kmq.core.key_order.KeyOrder`), which
        a put-back cannot undo; the taker settles them instead."""
        return not messages

    def take_one(self, timeout: float, stopped: Callable[[], bool]) -> KmqMessage | None:
        with self.cond:
            if not self._wait(timeout, stopped):
                return None
            return self._took(self._order.take(1))[0]

    def taken(self) -> list[list]:
        """What user code took since the last call: ``[messages, first, end, leased_at]`` records."""
        if not self._taken:
            return []
        with self.cond:
            out, self._taken = self._taken, []
        return out

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            self.error = exc
            self.cond.notify_all()

    def raise_error(self) -> None:
        """Raise :attr:`error` if nothing may be taken any more."""
        with self.cond:
            self._apply_settled()
            if self.error is not None and not self._order.ready:
                raise self.error

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    @property
    def ready(self) -> bool:
        """Whether a message may be taken (read without the lock: a glance for the fetcher)."""
        return self._order.ready > 0

    def drain(self, final: bool = True) -> list[tuple[list[KmqMessage], int]]:
        """Take every waiting message out, held ones too (closing, or giving the partitions up
        for a while: ``final`` changes nothing here): ``(messages, generation)`` groups."""
        with self.cond:
            self._settled.clear()
            groups: dict[int, list[KmqMessage]] = {}
            for m, cell in self._order.waiting():
                groups.setdefault(cell[_GEN], []).append(m)
            self._order = KeyOrder()
            self.cond.notify_all()
        return list((msgs, gen) for gen, msgs in groups.items())

    def take_out(self, partitions: set[int], may: Callable[[int, int], bool]) -> list[tuple[list[KmqMessage], float, int]]:
        """Nothing (the plain queue's :meth:`~kmq.consumer.ready_queue.ReadyQueue.take_out` gives a revoked
        partition's waiting messages back): in key order they stay and are handed over here, and the
        partition's new owner holds their keys until they settle (:mod:`kmq.consumer.key_recovery`).
        Given back, their STARTs here would be unsettled leases to the new owner: it would hold
        their keys until those leases ran out."""
        return []

    def due_for_renewal(self, older_than: float, now: float) -> list[KmqMessage]:
        """Waiting messages (held ones too) whose lease (re)started before ``older_than``; their
        batches' times are reset to ``now``. O(waiting), called a few times per lease."""
        due: list[KmqMessage] = []
        renewed: set[int] = set()
        with self.cond:
            self._apply_settled()
            for m, cell in self._order.waiting():
                if cell[_LEASED_AT] <= older_than or id(cell) in renewed:
                    if id(cell) not in renewed:
                        renewed.add(id(cell))
                        cell[_LEASED_AT] = now
                    due.append(m)
        return due

    # ------------------------------------------------------------ a change of owner
    def hold(self, partitions: set[int], gen: int) -> dict[int, int]:
        """``partitions`` were assigned at pipeline generation ``gen``: hold their messages; returns
        each one's hold number."""
        with self.cond:
            for p in partitions:
                self._order.hold(p)
                self._holds[p] = self._holds.get(p, 0) + 1
                self._first_due[p] = gen
                self._first.pop(p, None)
            return {p: self._holds[p] for p in partitions}

    def first_offset(self, partition: int) -> int | None:
        """The first offset handed over for ``partition`` since its latest hold (None: none yet)."""
        with self.cond:
            return self._first.get(partition)

    def inherit(self, partition: int, keys: dict[bytes, list[int]], deadline: float, hold: int) -> bool:
        """End hold number ``hold`` of ``partition``, its keys waiting for these origins until
        ``deadline``. False (nothing done) when the partition was held again since: that
        assignment's own lookup decides."""
        with self.cond:
            if self._holds.get(partition) != hold:
                return False
            self._apply_settled()
            self._order.inherit(partition, keys, deadline)
            self.cond.notify_all()
        return True

    def inherited_settled(self, partition: int, released: list[tuple[bytes, int]]) -> int:
        """``(key, origin)`` pairs settled for good at the earlier owner; how many released a key."""
        with self.cond:
            n = sum(self._order.inherited_settled(partition, key, origin) for key, origin in released)
            if n:
                self.cond.notify_all()
        return n

    def inherited_origins(self, partition: int) -> set[int]:
        with self.cond:
            self._apply_settled()
            return self._order.inherited_origins(partition)

    def inherited_keys(self) -> int:
        with self.cond:
            return self._order.inherited_keys()

    # ------------------------------------------------------------ observing
    @property
    def held(self) -> int:
        """Messages waiting behind a busy or blocked key (read without the lock, settlements not
        applied yet not counted: for the gauges and flow control, which look again soon)."""
        return self._order.held

    def blocked_keys(self) -> int:
        with self.cond:
            self._apply_settled()
            return self._order.blocked_keys()
