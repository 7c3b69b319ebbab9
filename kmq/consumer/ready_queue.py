"""The hand-over between a consumer's fetcher thread and the application.

Batches whose START was acknowledged and whose offsets were committed wait
here until user code polls them, each with the time its lease was last
(re)started (so held messages can be renewed before their lease ends). The
fetcher's fatal error is delivered through the same queue: raised to the
application once the ready messages are used up.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from kmq.core.message import KmqMessage

__all__ = ["ReadyQueue"]


class ReadyQueue:
    """Ready batches (fetcher -> application), thread-safe."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self._batches: deque[list[KmqMessage]] = deque()
        self._leased_at: deque[float] = deque()  # per batch: when its lease was last (re)started
        self.error: BaseException | None = None

    def put(self, messages: list[KmqMessage], leased_at: float) -> None:
        with self.cond:
            self._batches.append(messages)
            self._leased_at.append(leased_at)
            self.cond.notify_all()

    def take(self, timeout: float, max_records: int, stopped: Callable[[], bool]) -> list[KmqMessage]:
        """Up to ``max_records`` (0: a whole batch) ready messages; ``[]`` after ``timeout`` seconds
        without any or once ``stopped()``; raises :attr:`error` once nothing is ready."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self._batches:
                if self.error is not None:
                    raise self.error
                remaining = deadline - time.monotonic()
                if remaining <= 0 or stopped():
                    return []
                self.cond.wait(remaining)
            batch = self._batches.popleft()
            leased_at = self._leased_at.popleft()
            if 0 < max_records < len(batch):
                self._batches.appendleft(batch[max_records:])
                self._leased_at.appendleft(leased_at)
                batch = batch[:max_records]
            self.cond.notify_all()  # room for the fetcher
        return batch

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

    def drain(self) -> list[KmqMessage]:
        """Take every ready message out (closing)."""
        with self.cond:
            out = [m for batch in self._batches for m in batch]
            self._batches.clear()
            self._leased_at.clear()
            self.cond.notify_all()
        return out

    def due_for_renewal(self, older_than: float, now: float) -> list[KmqMessage]:
        """Messages of batches whose lease (re)started before ``older_than``; their time is reset to ``now``."""
        due: list[KmqMessage] = []
        with self.cond:
            for i, at in enumerate(self._leased_at):
                if at <= older_than:
                    self._leased_at[i] = now
                    due.extend(self._batches[i])
        return due
