"""A batch between its Kafka poll and its hand-over to user code (the consumer's fetcher thread).

Pure: no Kafka import (the futures are kafka-python's, but only their
``is_done`` / ``failed()`` are used, by the consumer).
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from kmq.core.message import KmqMessage

__all__ = ["FetchBatch", "first_offsets"]


def first_offsets(messages: Iterable[KmqMessage]) -> dict[int, int]:
    """Smallest offset per partition: where to seek (or commit) back to give them all back."""
    first: dict[int, int] = {}
    for m in messages:
        if m.offset < first.get(m.partition, m.offset + 1):
            first[m.partition] = m.offset
    return first


class FetchBatch:
    """A polled batch between START and hand-over (fetcher thread only)."""

    __slots__ = ("messages", "offsets", "spans", "t0", "sent_at", "leased_at", "futures", "commit", "commit_at",
                 "commit_tries")

    def __init__(self, messages: list[KmqMessage], offsets: dict[int, list[int]], spans: dict, t0: float) -> None:
        self.messages = messages
        self.offsets = offsets
        self.spans = spans
        self.t0 = t0
        self.sent_at = time.monotonic()  # START marker time, for the lease schedule
        self.leased_at = self.sent_at  # when its lease was last started or renewed
        self.futures: list = []
        self.commit: Any = None
        self.commit_at = 0.0  # when the commit in flight was sent
        self.commit_tries = 0

    def started(self) -> bool:
        """Every START of this batch got an answer (success or failure)."""
        return all(f.is_done for _, _, f in self.futures)

    def absorb(self, later: "FetchBatch") -> None:
        """Take in the next batch (fetched after this one, START answered, nothing committed) so that
        one commit covers both: commits are synchronous round trips, one per batch was the fetcher's
        pacing step when the application keeps up."""
        self.messages.extend(later.messages)
        for p, offs in later.offsets.items():
            self.offsets.setdefault(p, []).extend(offs)
        for p, (first, last) in later.spans.items():
            mine = self.spans.get(p)
            self.spans[p] = (min(first, mine[0]), max(last, mine[1])) if mine else (first, last)
        self.futures.extend(later.futures)
        self.leased_at = min(self.leased_at, later.leased_at)
