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
(:meth:`kmq.consumer.ready_queue.ReadyQueue.taken`). They are looked at
``look_after`` seconds later, then at gaps four times longer each, until their
deadline, and only the messages still unsettled are kept each time: memory
follows what user code holds (plus what it took in the last ``look_after``),
and a message settled fast is looked at once.
"""

from __future__ import annotations

import heapq
from itertools import islice
from typing import Sequence

from kmq.core.lease import SETTLED_WITHIN
from kmq.core.message import KmqMessage, unsettled

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
        self.look_after = min(SETTLED_WITHIN, lease / 4) if look_after is None else look_after
        self.extended: dict[tuple[int, int], float] = {}
        #: (next look, seq, messages, lease deadline, gap to the next look); a look at the deadline decides.
        self._heap: list[tuple[float, int, list[KmqMessage], float, float]] = []
        self._due: list[list[KmqMessage]] = []  # looked at on their deadline, unsettled: for expired()
        self._seq = 0

    def __len__(self) -> int:
        """Messages tracked (not looked at yet, or unsettled when last looked at)."""
        return sum(len(e[2]) for e in self._heap) + sum(map(len, self._due))

    def handed(self, messages: Sequence[KmqMessage], first: int, end: int, leased_at: float, now: float) -> None:
        """User code took ``messages[first:end]``, whose lease (re)started at ``leased_at``."""
        taken = messages if first == 0 and end == len(messages) else list(islice(messages, first, end))
        deadline = leased_at + self.lease
        self._push(min(now + self.look_after, deadline), taken, deadline, self.look_after)  # type: ignore[arg-type]

    def extend(self, key: tuple[int, int], deadline: float) -> None:
        """The message's lease was renewed: it now ends at ``deadline``."""
        self.extended[key] = deadline

    def forget(self, key: tuple[int, int]) -> None:
        """The message was settled."""
        self.extended.pop(key, None)

    def _push(self, at: float, messages: list[KmqMessage], deadline: float, gap: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, messages, deadline, gap))

    def due(self, now: float) -> bool:
        """Whether :meth:`expired` may find anything (cheap, no lock needed)."""
        return bool(self._due) or bool(self._heap and self._heap[0][0] <= now)

    def look(self, now: float) -> None:
        """Drop what was settled since the last look. Needs no lock: a message settled meanwhile
        is only kept a little longer, and the decision is :meth:`expired`'s."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, _, msgs, deadline, gap = heapq.heappop(heap)
            left = unsettled(msgs)
            if not left:
                continue
            if at < deadline:
                gap *= 4
                self._push(min(now + gap, deadline), left, deadline, gap)
            else:
                self._due.append(left)

    def expired(self, now: float) -> list[KmqMessage]:
        """The unsettled messages whose lease is over at ``now`` (each reported once). Call it
        under the lock their settlements take, so none is settled while it is decided."""
        self.look(now)
        out: list[KmqMessage] = []
        due, self._due = self._due, []
        extended = self.extended
        for msgs in due:
            for m in msgs:
                if m.settled:
                    continue
                if extended:
                    key = (m.partition, m.offset)
                    deadline = extended.get(key)
                    if deadline is not None:
                        if deadline > now:
                            self._push(deadline, [m], deadline, 0.0)
                            continue
                        del extended[key]
                out.append(m)
        return out
