"""Ready messages taken a few at a time and handed to user code one by one.

Iterating a consumer (``for msg in consumer``, ``async for msg in consumer``)
hands out one message per step. Taking each from the
:class:`~kmq.consumer.ready_queue.ReadyQueue` under its lock cost more than
the rest of a step's own work (about 1.4 us of the asyncio loop's 3.4 us per
message), so while the taker keeps up with a backlog each take is twice the
size of the last one, up to :data:`MOST`, if the last one was used up within
:data:`HOLD` seconds; otherwise it is one message. Messages therefore wait
here only while user code runs through a backlog, never long behind a slow
handler.

What was taken and not handed on goes back into the ready queue when the
consumer closes (:meth:`TakeAhead.put_back`), at its head with its batch's
lease start and revocation generation, so closing gives it back to the group
like every other never-handed message (same delivery count). Only then:
a put-back while the fetcher runs would let the lease bookkeeping of user
code (:mod:`kmq.consumer.lease_expiry`) count those messages twice.

Thread-safe for one taker and one closer: each message leaves by one
``deque.popleft`` (atomic), so it goes either to the taker or back; chunks
come and go under a lock taken once per chunk, not per message.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from kmq.core.message import KmqMessage

__all__ = ["TakeAhead", "MOST", "HOLD"]

#: Most messages taken from the ready queue at once.
MOST = 64
#: Seconds: a take doubles (up to MOST) only if the last one was used up within this time.
HOLD = 0.002

#: ``take_chunk(timeout, max_records) -> (messages, leased_at, gen)`` of the ready queue.
TakeChunk = Callable[[float, int], tuple[list[KmqMessage], float, int]]


class TakeAhead:
    """The messages taken ahead of user code, in order: ``[messages, lease start, generation]``
    per chunk (``messages`` a deque, each chunk from one ready batch)."""

    def __init__(self, take_chunk: TakeChunk, clock: Callable[[], float] = time.monotonic) -> None:
        self._take_chunk = take_chunk
        self._clock = clock
        self._held: deque[list] = deque()
        self._lock = threading.Lock()  # chunks in and out (not messages)
        self._size = 1  # of the last take
        self._took_at = -HOLD - 1.0

    def __bool__(self) -> bool:
        """Whether messages are held."""
        return bool(self._held)

    def next(self, timeout: float = 0.0) -> KmqMessage | None:
        """The next message: a held one, else one taken now (waiting up to ``timeout`` seconds
        for one to be ready); None when none came. Raises what the ready queue raises."""
        m = self._pop()
        if m is not None:
            return m
        now = self._clock()
        # The last take used up within HOLD: the taker keeps up, take twice as many.
        n = self._size = min(2 * self._size, MOST) if now - self._took_at <= HOLD else 1
        msgs, leased_at, gen = self._take_chunk(timeout, n)
        self._took_at = self._clock()
        if len(msgs) > 1:
            self.keep(msgs[1:], leased_at, gen)
        return msgs[0] if msgs else None

    def take(self, max_records: int) -> list[KmqMessage]:
        """Up to ``max_records`` held messages (no new take); [] when none are held."""
        out: list[KmqMessage] = []
        while len(out) < max_records:
            m = self._pop()
            if m is None:
                break
            out.append(m)
        return out

    def keep(self, messages: list[KmqMessage], leased_at: float, gen: int) -> None:
        """Hold ``messages`` (taken from one ready batch, not handed on) behind the others."""
        if messages:
            with self._lock:
                self._held.append([deque(messages), leased_at, gen])

    def put_back(self, put_back: Callable[[list[KmqMessage], float, int], bool]) -> list[KmqMessage]:
        """Give every held message back through ``put_back(messages, leased_at, gen)``
        (:meth:`~kmq.consumer.ready_queue.ReadyQueue.put_back`), the last chunk first so each
        lands at the head in order. Returns the messages it refused."""
        with self._lock:
            chunks = list(self._held)
            self._held.clear()
        refused: list[KmqMessage] = []
        for msgs, leased_at, gen in reversed(chunks):
            mine = []
            while True:  # message by message: one the taker popped meanwhile stays the taker's
                try:
                    mine.append(msgs.popleft())
                except IndexError:
                    break
            if mine and not put_back(mine, leased_at, gen):
                refused.extend(mine)
        return refused

    def _pop(self) -> KmqMessage | None:
        held = self._held
        while held:
            try:
                chunk = held[0]
            except IndexError:  # put back meanwhile
                return None
            msgs = chunk[0]
            try:
                m = msgs.popleft()
            except IndexError:
                m = None
            if not msgs:
                with self._lock:
                    if held and held[0] is chunk:
                        held.popleft()
            if m is not None:
                return m
        return None
