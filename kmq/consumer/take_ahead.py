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

A close can come between a take from the ready queue and the keeping of what
the taker does not hand on (another thread, in the instant of the take). Such
a take is *in progress* (:meth:`TakeAhead.idle` waits for it): once the
close has begun, no new take starts, and what an in-progress take (all of
it, none being handed out) or a late :meth:`TakeAhead.keep` brings goes back
the way the held messages went, so no message is left held after the close,
handed to nobody and given back to nobody.

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
#: ``put_back(messages, leased_at, gen) -> bool`` of the ready queue (False: refused).
PutBack = Callable[[list[KmqMessage], float, int], bool]
#: Called with the messages a put-back refused.
Refused = Callable[[list[KmqMessage]], None]


class TakeAhead:
    """The messages taken ahead of user code, in order: ``[messages, lease start, generation]``
    per chunk (``messages`` a deque, each chunk from one ready batch)."""

    def __init__(self, take_chunk: TakeChunk, clock: Callable[[], float] = time.monotonic) -> None:
        self._take_chunk = take_chunk
        self._clock = clock
        self._held: deque[list] = deque()
        self._lock = threading.Lock()  # chunks in and out (not messages)
        self._idle = threading.Condition(self._lock)
        self._size = 1  # of the last take
        self._took_at = -HOLD - 1.0
        self._taking = 0  # takes from the ready queue in progress (their rest not kept yet)
        #: Set by :meth:`put_back` (closing): where what comes later goes instead of being held.
        self._closed: tuple[PutBack, Refused] | None = None
        #: Calls of :meth:`next`: the taker is alive (``consumer.max_poll_interval``); a bare count.
        self.takes = 0

    def __bool__(self) -> bool:
        """Whether messages are held."""
        return bool(self._held)

    def next(self, timeout: float = 0.0) -> KmqMessage | None:
        """The next message: a held one, else one taken now (waiting up to ``timeout`` seconds
        for one to be ready); None when none came. Raises what the ready queue raises."""
        self.takes += 1
        m = self._pop()
        if m is not None:
            return m
        with self._lock:
            if self._closed is not None:  # closing: what is still ready goes back to the group
                return None
            self._taking += 1
        try:
            now = self._clock()
            # The last take used up within HOLD: the taker keeps up, take twice as many.
            n = self._size = min(2 * self._size, MOST) if now - self._took_at <= HOLD else 1
            msgs, leased_at, gen = self._take_chunk(timeout, n)
            self._took_at = self._clock()
            if msgs and self._closed is not None:  # the close came meanwhile: none of them goes out
                self.keep(msgs, leased_at, gen)
                return None
            if len(msgs) > 1:
                self.keep(msgs[1:], leased_at, gen)  # given back instead if the close comes now
        finally:
            with self._idle:
                self._taking -= 1
                self._idle.notify_all()
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
        """Hold ``messages`` (taken from one ready batch, not handed on) behind the others; once
        :meth:`put_back` has run (closing), give them back the same way instead."""
        if not messages:
            return
        with self._lock:
            closed = self._closed
            if closed is None:
                self._held.append([deque(messages), leased_at, gen])
                return
        put_back, refused = closed
        if not put_back(messages, leased_at, gen):
            refused(messages)

    def put_back(self, put_back: PutBack, refused: Refused) -> None:
        """Closing: give every held message back through ``put_back(messages, leased_at, gen)``
        (:meth:`~kmq.consumer.ready_queue.ReadyQueue.put_back`), the last chunk first so each
        lands at the head in order, and ``refused(messages)`` what it refuses. From now on no
        take starts, and what a take in progress or a later :meth:`keep` brings goes the same
        way (wait for those with :meth:`idle`)."""
        with self._lock:
            self._closed = (put_back, refused)
            chunks = list(self._held)
            self._held.clear()
        for msgs, leased_at, gen in reversed(chunks):
            mine = []
            while True:  # message by message: one the taker popped meanwhile stays the taker's
                try:
                    mine.append(msgs.popleft())
                except IndexError:
                    break
            if mine and not put_back(mine, leased_at, gen):
                refused(mine)

    def idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no take from the ready queue is in progress (after
        :meth:`put_back`, what such a take brings has then been given back); False if one still is."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._taking, timeout)

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
