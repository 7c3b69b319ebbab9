"""Per-key ordering (``consumer.ordering: key``): which waiting message may be handed out now.

Pure: no Kafka import, no threads, no clock (``now`` is passed in). The
consumer's :class:`~kmq.consumer.keyed_ready.KeyedReadyQueue` feeds it the
messages that are ready (START acknowledged, offset committed), in offset
order per partition, and the settlements of what it handed out; it answers
which messages may go to user code now. The contract is in
docs/protocol.md ("Per-key ordering").

A *key* is ``(partition, record key)``. A record with a null key is its own
key: it is never held and holds nothing back. Per key:

* at most one message is out in user code at a time (``busy``); the rest wait
  in offset order;
* a message settled *for good* (acked, rejected, or failed at its last
  delivery, which the tracker dead-letters) releases the key: the next one
  may go;
* a message that failed and will be redelivered (nack, abandon, lease run
  out) keeps the key blocked (``awaiting`` its origin offset) until its copy
  arrives: a copy, recognised by its origin (the ``kmq-origin`` header),
  takes its origin's place in the key's order, ahead of the later messages
  waiting there;
* the wait for a copy is bounded: past ``deadline`` (:meth:`KeyOrder.expire`)
  the key is released and the caller warns: the copy may come later, after
  messages of its key already handed out (ordering given up for that one
  message, nothing lost);
* across a change of owner: a newly assigned partition is *held*
  (:meth:`KeyOrder.hold`: its messages wait) until the consumer learned what
  the earlier owner left unsettled (:mod:`kmq.core.inherited_keys`);
  :meth:`KeyOrder.inherit` then seeds each such key with the origins it waits
  for (``inherited``): a message goes only when its origin is not after the
  first of them, and the copy of that origin (or its settlement in the
  markers, :meth:`KeyOrder.inherited_settled`, or the bounded wait) lets the
  key go on.

Everything is O(1) per message except a copy (O(messages waiting for its
key)), :meth:`KeyOrder.expire` and :meth:`KeyOrder.blocked_keys` (O(keys))
and :meth:`KeyOrder.waiting` (O(waiting)).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, Iterator, TypeVar

__all__ = ["KeyOrder", "Released"]

_NO_ORIGINS: tuple[int, ...] = ()

T = TypeVar("T")


#: A waiting message: (item, offset, origin offset (== offset unless a copy)).
_Entry = tuple


class _Key:
    """One key's state: the message out in user code, the copy awaited, the messages waiting."""

    __slots__ = ("pk", "queue", "busy", "busy_origin", "awaiting", "deadline", "runnable", "inherited",
                 "inherited_deadline")

    def __init__(self, pk: tuple[int, bytes]) -> None:
        self.pk = pk  # (partition, key)
        self.queue: deque = deque()  # entries in offset order, an awaited copy first
        self.busy: int | None = None  # offset of the message out in user code
        self.busy_origin: int | None = None
        self.awaiting: int | None = None  # origin offset whose copy must go before anything else
        self.deadline = 0.0  # when the wait for the copy ends
        self.runnable = False  # its head is in KeyOrder._runnable
        #: Origins (ascending) an earlier owner of the partition left unsettled (KeyOrder.inherit).
        self.inherited: tuple[int, ...] = _NO_ORIGINS
        self.inherited_deadline = 0.0


@dataclass(frozen=True, slots=True)
class Released:
    """A key released because its copy did not come within the bound."""

    partition: int
    key: bytes
    origin: int  # the offset whose copy was awaited


class KeyOrder(Generic[T]):
    """The per-key gate between ready messages and user code (one consumer, every partition)."""

    def __init__(self) -> None:
        self._keys: dict[tuple[int, bytes], _Key] = {}
        #: (key state, or None for a null key; entry; partition): messages that may go now, in arrival order.
        self._runnable: deque[tuple[_Key | None, _Entry, int]] = deque()
        #: (partition, offset) out in user code -> its key's state (None: a null key, nothing to release).
        self._out: dict[tuple[int, int], _Key | None] = {}
        self._queued = 0  # messages of non-null keys not handed out (runnable heads included)
        self._nulls = 0  # null-key messages in _runnable
        #: Partitions whose messages wait until what an earlier owner left unsettled is known.
        self._holding: set[int] = set()

    # ------------------------------------------------------------ events
    def add(self, item: T, partition: int, offset: int, key: bytes | None, origin: int | None = None) -> None:
        """A message became ready (call in offset order per partition). ``origin``: the offset of
        its first delivery in this partition when it is a copy, else None."""
        if key is None:
            self._runnable.append((None, (item, offset, offset), partition))
            self._nulls += 1
            return
        pk = (partition, key)
        k = self._keys.get(pk)
        if k is None:
            k = self._keys[pk] = _Key(pk)
        self._queued += 1
        queue = k.queue
        if origin is None or not queue or queue[-1][2] <= origin:
            queue.append((item, offset, offset if origin is None else origin))
        else:  # a copy goes by its origin: before the later messages of its key already here
            at = len(queue) - 1
            while at > 0 and queue[at - 1][2] > origin:
                at -= 1
            queue.insert(at, (item, offset, origin))
            if at == 0 and k.runnable:  # the head that was runnable must wait behind the copy
                self._runnable = deque(r for r in self._runnable if r[0] is not k)
                k.runnable = False
        if not k.runnable and k.busy is None:
            self._maybe_run(k)

    def take(self, n: int) -> list[T]:
        """Up to ``n`` messages that may go to user code now, in arrival order; their keys are busy
        until :meth:`settled`."""
        out: list[T] = []
        runnable, outs = self._runnable, self._out
        while runnable and len(out) < n:
            k, (item, offset, origin), partition = runnable.popleft()
            out.append(item)
            if k is None:  # a null key: nothing to release when it is settled
                self._nulls -= 1
                continue
            outs[(partition, offset)] = k
            k.queue.popleft()
            k.runnable = False
            k.busy, k.busy_origin = offset, origin
            if k.inherited and origin in k.inherited:  # from here on it is this owner's to settle
                k.inherited = tuple(o for o in k.inherited if o != origin)
            self._queued -= 1
        return out

    def settled(self, partition: int, offset: int, final: bool, deadline: float = 0.0) -> bool:
        """The message at ``offset`` (handed out by :meth:`take`) was settled. ``final``: for good
        (acked, rejected, dead-lettered): its key is released. Otherwise a copy will come: the key
        waits for it until ``deadline``. True when that lets a message of the key go now."""
        k = self._out.pop((partition, offset), None)
        if k is None or k.busy != offset:
            return False
        origin, k.busy, k.busy_origin = k.busy_origin, None, None
        assert origin is not None  # set together with busy
        if final:
            if k.awaiting is not None and origin >= k.awaiting:  # not when an earlier origin's copy went first
                k.awaiting = None
            if k.inherited and origin in k.inherited:  # this owner's own message, inherited from itself
                k.inherited = tuple(o for o in k.inherited if o != origin)
        else:
            # An earlier origin's copy that failed again keeps the wait for the later one it went before.
            k.awaiting = origin if k.awaiting is None else max(k.awaiting, origin)
            k.deadline = deadline
        return self._maybe_run(k)

    def settled_late(self, partition: int, key: bytes | None, origin: int) -> bool:
        """A message whose lease had run out (its key awaits the copy of ``origin``) was settled for
        good after all: release the key. True when that released it."""
        k = self._keys.get((partition, key)) if key is not None else None
        if k is None or k.awaiting != origin or k.busy is not None or self._head_is_copy(k):
            return False
        k.awaiting = None
        self._maybe_run(k)
        return True

    def expire(self, now: float) -> list[Released]:
        """Release every key whose copy did not come by its deadline, or whose inherited origins
        were not settled by theirs (O(keys))."""
        released: list[Released] = []
        for k in list(self._keys.values()):
            if k.inherited and k.inherited_deadline <= now:
                released.append(Released(k.pk[0], k.pk[1], k.inherited[0]))
                k.inherited = _NO_ORIGINS
                self._maybe_run(k)
            if k.awaiting is not None and k.busy is None and k.deadline <= now and not self._head_is_copy(k):
                released.append(Released(k.pk[0], k.pk[1], k.awaiting))
                k.awaiting = None
                self._maybe_run(k)
        return released

    # ------------------------------------------------------------ a change of owner
    def hold(self, partition: int) -> None:
        """``partition`` was assigned: its messages wait until :meth:`inherit` (messages already
        runnable stay so: they were fetched before, below anything an interim owner handled)."""
        self._holding.add(partition)

    def inherit(self, partition: int, keys: dict[bytes, list[int]], deadline: float) -> int:
        """What the earlier owner of ``partition`` left unsettled: per key, the origins it waits for
        until ``deadline``. Ends the hold; returns how many keys were seeded."""
        self._holding.discard(partition)
        for key, origins in keys.items():
            pk = (partition, key)
            k = self._keys.get(pk)
            if k is None:
                k = self._keys[pk] = _Key(pk)
            k.inherited = tuple(sorted(set(k.inherited).union(origins)))
            k.inherited_deadline = deadline
            if k.runnable and k.queue[0][2] > k.inherited[0]:  # its head must now wait
                self._runnable = deque(r for r in self._runnable if r[0] is not k)
                k.runnable = False
        for k in [k for k in self._keys.values() if k.pk[0] == partition]:
            self._maybe_run(k)
        return len(keys)

    def inherited_settled(self, partition: int, key: bytes, origin: int) -> bool:
        """The markers show ``origin``'s delivery settled for good at the earlier owner (END,
        REJECT, dead-lettered): the key no longer waits for it. True when it did."""
        k = self._keys.get((partition, key))
        if k is None or origin not in k.inherited:
            return False
        k.inherited = tuple(o for o in k.inherited if o != origin)
        self._maybe_run(k)
        return True

    def inherited_origins(self, partition: int) -> set[int]:
        """The origins keys of ``partition`` still wait for (O(keys))."""
        return {o for k in self._keys.values() if k.pk[0] == partition for o in k.inherited}

    def inherited_keys(self) -> int:
        """Keys waiting for a message an earlier owner of their partition left unsettled."""
        return sum(1 for k in self._keys.values() if k.inherited)

    # ------------------------------------------------------------ reading
    @property
    def held(self) -> int:
        """Messages waiting behind a busy or blocked key."""
        return self._queued - (len(self._runnable) - self._nulls)

    @property
    def ready(self) -> int:
        """Messages that may go now."""
        return len(self._runnable)

    def blocked_keys(self) -> int:
        """Keys with messages waiting that may not go now (busy, or awaiting a copy)."""
        return sum(1 for k in self._keys.values() if k.queue and not k.runnable)

    def waiting(self) -> Iterator[T]:
        """Every message not handed out: runnable null-key ones first, then those of keys (for
        renewal and closing)."""
        for k, entry, _p in self._runnable:
            if k is None:
                yield entry[0]
        for k in self._keys.values():
            for e in k.queue:
                yield e[0]

    def state_of(self, partition: int, key: bytes) -> tuple[int | None, int | None]:
        """``(busy offset, awaited origin)`` of a key (tests, diagnostics)."""
        k = self._keys.get((partition, key))
        return (k.busy, k.awaiting) if k is not None else (None, None)

    # ------------------------------------------------------------ the gate
    @staticmethod
    def _head_is_copy(k: _Key) -> bool:
        """The key's first waiting message is the awaited copy, or a copy of an earlier origin (one
        whose wait a deadline gave up: it still goes before the awaited one, in origin order)."""
        if not k.queue or k.awaiting is None:
            return False
        _item, offset, origin = k.queue[0]
        return origin <= k.awaiting and offset != origin

    def _maybe_run(self, k: _Key) -> bool:
        """Make the key's head runnable if the key is free (or the head is the awaited copy);
        forget a key with nothing left to remember. True when its head became runnable."""
        if k.runnable or k.busy is not None:
            return False
        if not k.queue:
            if k.awaiting is None and not k.inherited:
                del self._keys[k.pk]
            return False
        if self._holding and k.pk[0] in self._holding:
            return False
        if k.awaiting is not None and not self._head_is_copy(k):
            return False
        if k.inherited and k.queue[0][2] > k.inherited[0]:  # an earlier owner's message goes first
            return False
        if k.awaiting is not None and k.queue[0][2] == k.awaiting:
            k.awaiting = None  # the awaited copy goes now: from here it is the busy message
        k.runnable = True
        self._runnable.append((k, k.queue[0], k.pk[0]))
        return True
