"""The hand-over between a consumer's fetcher thread and the application.

Batches whose START was acknowledged and whose offsets were committed wait
here until user code takes them, each with the time its lease was last
(re)started (so held messages can be renewed before their lease ends) and
the fetch pipeline's revocation generation when it was fetched (what closing
needs to know whether it may commit the partition back). What user code
took, and when its lease started, is recorded for the fetcher
(:meth:`ReadyQueue.taken`): a message whose lease ends in user code
unsettled leaves flow control. The fetcher's fatal error is delivered
through the same queue: raised to the application once the ready messages
are used up.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from itertools import islice
from typing import Callable

from kmq.core.message import KmqMessage

__all__ = ["ReadyQueue"]

# A ready entry is a mutable list (cheap, and updated in place by takes and renewals):
_MSGS, _POS, _LEASED_AT, _GEN = range(4)  # [messages, next to take, lease (re)started at, generation]


class ReadyQueue:
    """Ready batches (fetcher -> application), thread-safe."""

    def __init__(self) -> None:
        # Takers hold the bare lock (the condition's own): entering it costs no Python call.
        self._lock = threading.Lock()
        self.cond = threading.Condition(self._lock)
        self._batches: deque[list] = deque()
        #: ``[messages, first, end, leased_at]``: ``messages[first:end]`` taken by user code since
        #: the fetcher last looked, their lease (re)started at ``leased_at``.
        self._taken: list[list] = []
        self.error: BaseException | None = None
        self._drained = False  # closing took everything out: nothing can be given back from here on

    def put(self, messages: list[KmqMessage], leased_at: float, gen: int = 0) -> None:
        with self.cond:
            self._batches.append([messages, 0, leased_at, gen])
            self.cond.notify_all()

    def _wait(self, timeout: float, stopped: Callable[[], bool]) -> list | None:
        """The head entry once there is one (with ``self.cond`` held); None after ``timeout``
        or once ``stopped()``; raises :attr:`error` once nothing is ready."""
        deadline = time.monotonic() + timeout
        while not self._batches:
            if self.error is not None:
                raise self.error
            remaining = deadline - time.monotonic()
            if remaining <= 0 or stopped():
                return None
            self.cond.wait(remaining)
        return self._batches[0]

    def _took(self, entry: list, end: int) -> None:
        """User code took ``entry``'s messages up to ``end`` (with ``self.cond`` held)."""
        msgs, first, leased_at = entry[_MSGS], entry[_POS], entry[_LEASED_AT]
        last = self._taken[-1] if self._taken else None
        if last is not None and last[0] is msgs and last[2] == first and last[3] == leased_at:
            last[2] = end  # consecutive takes of one batch (iteration): one record per batch, not per take
        else:
            self._taken.append([msgs, first, end, leased_at])
        if end == len(msgs):
            self._batches.popleft()
        else:
            entry[_POS] = end

    def take(self, timeout: float, max_records: int, stopped: Callable[[], bool]) -> list[KmqMessage]:
        """Up to ``max_records`` (0: a whole batch) ready messages; ``[]`` after ``timeout`` seconds
        without any or once ``stopped()``; raises :attr:`error` once nothing is ready."""
        return self.take_chunk(timeout, max_records, stopped)[0]

    def take_chunk(self, timeout: float, max_records: int,
                   stopped: Callable[[], bool]) -> tuple[list[KmqMessage], float, int]:
        """As :meth:`take` (messages of one batch at most), with that batch's lease start and
        generation: what :meth:`put_back` needs."""
        with self._lock:
            entry = self._wait(timeout, stopped)
            if entry is None:
                return [], 0.0, 0
            msgs, pos = entry[_MSGS], entry[_POS]
            end = len(msgs) if max_records <= 0 else min(len(msgs), pos + max_records)
            batch = msgs if pos == 0 and end == len(msgs) else msgs[pos:end]
            self._took(entry, end)
            return batch, entry[_LEASED_AT], entry[_GEN]

    def put_back(self, messages: list[KmqMessage], leased_at: float, gen: int) -> bool:
        """Messages a taker took (:meth:`take_chunk`) and never gave to user code, ready again at
        the head, as they were. For a taker that is closing: :meth:`drain` then finds them, and
        closing gives them back to the group with the rest (no copy, same delivery count).
        Returns True; False once :meth:`drain` has run (the close plan is made: kept here they
        would be given back by nobody)."""
        if messages:
            with self.cond:
                if self._drained:
                    return False
                self._batches.appendleft([messages, 0, leased_at, gen])
                self.cond.notify_all()
        return True

    def taken(self) -> list[list]:
        """What user code took since the last call: ``[messages, first, end, leased_at]`` records."""
        if not self._taken:  # read without the lock: a record appended meanwhile is seen next time
            return []
        with self.cond:
            out, self._taken = self._taken, []
        return out

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            self.error = exc
            self.cond.notify_all()

    def raise_error(self) -> None:
        """Raise :attr:`error` if nothing is ready any more."""
        with self.cond:
            if self.error is not None and not self._batches:
                raise self.error

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    @property
    def ready(self) -> bool:
        """Whether messages wait to be taken (read without the lock: a glance for the fetcher)."""
        return bool(self._batches)

    def drain(self, final: bool = True) -> list[tuple[list[KmqMessage], int]]:
        """Take every ready message out (closing): ``(messages, generation)`` per batch. Not
        ``final``: the consumer gives its partitions up for a while (the application stopped
        taking) and fills the queue again when it rejoins; :meth:`put_back` still works."""
        with self.cond:
            out = [(e[_MSGS][e[_POS]:], e[_GEN]) for e in self._batches]
            self._batches.clear()
            self._drained = final
            self.cond.notify_all()
        return out

    def take_out(self, partitions: set[int], may: Callable[[int, int], bool]) -> list[tuple[list[KmqMessage], float, int]]:
        """Take the ready messages of ``partitions`` out (a revocation gives them back to the group),
        where ``may(partition, generation)``: ``(messages, leased_at, generation)`` per batch, which
        :meth:`put` takes back as they were. Each batch keeps the rest in its place."""
        out: list[tuple[list[KmqMessage], float, int]] = []
        with self.cond:
            kept: deque[list] = deque()
            for e in self._batches:
                rest = e[_MSGS][e[_POS]:]
                going = {p for p in partitions if may(p, e[_GEN])}
                gone = [m for m in rest if m.partition in going]
                if not gone:
                    kept.append(e)
                    continue
                out.append((gone, e[_LEASED_AT], e[_GEN]))
                if len(gone) < len(rest):
                    # A new list: the records of what user code took from the old one stay valid.
                    kept.append([[m for m in rest if m.partition not in going], 0, e[_LEASED_AT], e[_GEN]])
            self._batches = kept
        return out

    def due_for_renewal(self, older_than: float, now: float) -> list[KmqMessage]:
        """Messages of batches whose lease (re)started before ``older_than``; their time is reset to ``now``."""
        due: list[KmqMessage] = []
        with self.cond:
            for e in self._batches:
                if e[_LEASED_AT] <= older_than:
                    e[_LEASED_AT] = now
                    due.extend(islice(e[_MSGS], e[_POS], None))
        return due
