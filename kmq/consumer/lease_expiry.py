"""Messages whose lease ended in user code, unsettled: when they leave flow control.

Pure (no Kafka, no threads, ``now`` passed in). Flow control counts a message
as outstanding until it is settled; a message user code never settles (the
SQS habit of letting a message time out, a code path that forgets to nack)
would stay outstanding after its lease is over and the tracker redelivered
it, until the consumer has no room left and stops fetching for good. As in
the Pub/Sub client, a message leaves the bound when its lease management
ends: here when its lease is over and nothing renews it any more (an
explicit ``renew``, or ``consumer.auto_renew`` up to ``consumer.max_lease``,
extends it; :meth:`LeaseExpiry.extend`).

What user code took arrives as ``(messages, first, end, leased_at)`` records
(:meth:`kmq.consumer.ready_queue.ReadyQueue.taken`). They are looked at once,
``look_after`` seconds later, and only the messages still unsettled then are
kept until their deadline: memory follows what user code holds, not the
message rate.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import islice
from typing import Sequence

from kmq.core.message import KmqMessage

__all__ = ["LeaseExpiry"]


class LeaseExpiry:
    """Deadlines of messages handed to user code and not settled yet.

    ``extended`` (``(partition, offset)`` -> lease deadline) holds the messages whose lease
    was renewed past their batch's; the owner drops a message from it when it is settled
    (:meth:`forget`)."""

    def __init__(self, lease: float, look_after: float | None = None) -> None:
        if lease <= 0:
            raise ValueError("lease must be > 0")
        self.lease = lease
        self.look_after = min(1.0, lease / 4) if look_after is None else look_after
        self.extended: dict[tuple[int, int], float] = {}
        self._fresh: deque[tuple[float, Sequence[KmqMessage], int, int, float]] = deque()
        self._heap: list[tuple[float, int, list[KmqMessage]]] = []  # (deadline, seq, unsettled messages)
        self._seq = 0

    def __len__(self) -> int:
        """Messages tracked (taken and not looked at yet, or unsettled when looked at)."""
        return sum(end - first for _, _, first, end, _ in self._fresh) + sum(len(e[2]) for e in self._heap)

    def handed(self, messages: Sequence[KmqMessage], first: int, end: int, leased_at: float, now: float) -> None:
        """User code took ``messages[first:end]``, whose lease (re)started at ``leased_at``."""
        self._fresh.append((now, messages, first, end, leased_at))

    def extend(self, key: tuple[int, int], deadline: float) -> None:
        """The message's lease was renewed: it now ends at ``deadline``."""
        self.extended[key] = deadline

    def forget(self, key: tuple[int, int]) -> None:
        """The message was settled."""
        self.extended.pop(key, None)

    def _push(self, deadline: float, messages: list[KmqMessage]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, messages))

    def due(self, now: float) -> bool:
        """Whether :meth:`expired` has anything to look at (cheap, no lock needed)."""
        return bool((self._fresh and self._fresh[0][0] + self.look_after <= now)
                    or (self._heap and self._heap[0][0] <= now))

    def look(self, now: float) -> None:
        """Keep, of what user code took ``look_after`` seconds ago, only the messages still
        unsettled. Needs no lock: a message settled meanwhile is only kept a little longer."""
        fresh = self._fresh
        while fresh and fresh[0][0] + self.look_after <= now:
            _, msgs, first, end, leased_at = fresh.popleft()
            unsettled = [m for m in islice(msgs, first, end) if m._outcome is None]
            if unsettled:
                self._push(leased_at + self.lease, unsettled)

    def expired(self, now: float) -> list[KmqMessage]:
        """The unsettled messages whose lease is over at ``now`` (each reported once). Call it
        under the lock their settlements take, so none is settled while it is decided."""
        self.look(now)
        out: list[KmqMessage] = []
        heap, extended = self._heap, self.extended
        while heap and heap[0][0] <= now:
            for m in heapq.heappop(heap)[2]:
                if m._outcome is not None:
                    continue
                if extended:
                    key = (m.partition, m.offset)
                    deadline = extended.get(key)
                    if deadline is not None:
                        if deadline > now:
                            self._push(deadline, [m])
                            continue
                        del extended[key]
                out.append(m)
        return out
