"""Acks awaited until their END marker is durable (``msg.ack_with_response()``).

An ack with a response is buffered like any ack; its future waits here,
keyed by queue partition and offset, from the flush that drained it until
Kafka acknowledged an END marker covering the offset
(:meth:`AckWaiters.written`, called by the marker sender once per marker,
after retries too: a resent END is a coalesced one, so the match is by
offset, not by marker), or until the writer gave that marker up or closed
(:meth:`AckWaiters.failed`, the future fails with
:class:`~kmq.core.errors.MarkerWriteError`). No I/O of its own and nothing
per message on the ack path: futures are resolved per marker, when its
produce is acknowledged.

Callbacks added with ``add_done_callback`` run on the producer's I/O thread
(or the flusher's): they must not block.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Iterable

from kmq.core.errors import MarkerWriteError
from kmq.core.markers import End, Marker
from kmq.core.ranges import OffsetRange

__all__ = ["AckWaiters"]


def _covered(offset: int, ranges: Iterable[OffsetRange]) -> bool:
    return any(r.first <= offset < r.first + r.count for r in ranges)


class AckWaiters:
    """Futures of acks waiting for their END marker: partition -> offset -> future."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_partition: dict[int, dict[int, Future]] = {}

    def __len__(self) -> int:
        with self._lock:
            return sum(map(len, self._by_partition.values()))

    def add(self, waiting: Iterable[tuple[int, int, Future]]) -> None:
        """Futures of acks whose END was just drained for sending (before it is sent)."""
        with self._lock:
            for partition, offset, fut in waiting:
                self._by_partition.setdefault(partition, {})[offset] = fut

    def _take(self, partition: int, ranges: Iterable[OffsetRange]) -> list[Future]:
        with self._lock:
            waiting = self._by_partition.get(partition)
            if not waiting:
                return []
            ranges = list(ranges)
            done = [o for o in waiting if _covered(o, ranges)]
            futs = [waiting.pop(o) for o in done]
            if not waiting:
                del self._by_partition[partition]
            return futs

    def written(self, partition: int, marker: Marker) -> None:
        """Kafka acknowledged ``marker``: the acks an END covers are durable."""
        if not self._by_partition or not isinstance(marker, End):
            return
        for fut in self._take(partition, marker.ranges):
            if not fut.done():
                fut.set_result(None)

    def failed(self, pending: Iterable[tuple[int, Marker, float]], why: str) -> None:
        """These markers were given up: their acks' futures fail with a ``MarkerWriteError``."""
        if not self._by_partition:
            return
        for partition, marker, _ in pending:
            if not isinstance(marker, End):
                continue
            for fut in self._take(partition, marker.ranges):
                if not fut.done():
                    fut.set_exception(MarkerWriteError(
                        f"the END marker of this ack was not written ({why}); the tracker redelivers the "
                        f"message when its lease ends"))

    def fail_all(self, why: str) -> None:
        """The writer closed: every future still waiting fails."""
        with self._lock:
            futs = [f for waiting in self._by_partition.values() for f in waiting.values()]
            self._by_partition.clear()
        for fut in futs:
            if not fut.done():
                fut.set_exception(MarkerWriteError(f"the END marker of this ack was not acknowledged ({why})"))
