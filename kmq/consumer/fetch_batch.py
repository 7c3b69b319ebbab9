"""A batch between its Kafka poll and its hand-over to user code (the consumer's fetch pipeline).

Pure: no Kafka import, no clock (times are passed in). The batch's state is
moved only by :class:`~kmq.consumer.fetch_pipeline.FetchPipeline`.
"""

from __future__ import annotations

from typing import Any, Iterable

from kmq.core.message import KmqMessage, for_group, offsets_by_partition
from kmq.core.schedule import HEADER_NOT_BEFORE

__all__ = ["FetchBatch", "classify", "first_offsets", "first_last", "STARTING", "STARTED", "START_FAILED", "GIVEN_BACK"]

#: START sent, no answer yet.
STARTING = "starting"
#: Kafka acknowledged every START of the batch.
STARTED = "started"
#: A START was refused (or not answered in time): the batch goes back.
START_FAILED = "start-failed"
#: Out of the pipeline: given back, nothing of it is committed by this batch.
GIVEN_BACK = "given-back"


def first_offsets(messages: Iterable[KmqMessage]) -> dict[int, int]:
    """Smallest offset per partition: where to seek (or commit) back to give them all back."""
    first: dict[int, int] = {}
    for m in messages:
        if m.offset < first.get(m.partition, m.offset + 1):
            first[m.partition] = m.offset
    return first


def first_last(messages: Iterable[KmqMessage]) -> dict[int, list[int]]:
    """Partition -> [first offset, last offset] of ``messages``."""
    out: dict[int, list[int]] = {}
    for m in messages:
        span = out.get(m.partition)
        if span is None:
            out[m.partition] = [m.offset, m.offset]
        else:
            span[0], span[1] = min(span[0], m.offset), max(span[1], m.offset)
    return out


def classify(messages: list[KmqMessage], group: str | None) -> tuple[list[KmqMessage], list[KmqMessage],
                                                                    list[KmqMessage]]:
    """One look at the headers of a poll's ``messages``: those ``group`` (None: the default group)
    delivers, the copies of another group (``kmq-group``, :func:`~kmq.core.message.for_group`),
    and of the first the scheduled ones (a ``kmq-not-before`` header), each in fetch order."""
    if not any([m._headers for m in messages]):  # no header, no copy, nothing scheduled: the common case
        return messages, [], []
    mine: list[KmqMessage] = []
    foreign: list[KmqMessage] = []
    scheduled: list[KmqMessage] = []
    for m in messages:
        headers = m._headers
        if not headers:
            mine.append(m)
        elif for_group(headers, group, m.topic, m.partition, m.offset):
            mine.append(m)
            if any(k == HEADER_NOT_BEFORE for k, _ in headers):
                scheduled.append(m)
        else:
            foreign.append(m)
    return mine, foreign, scheduled


class FetchBatch:
    """The records of one Kafka poll, in fetch order, on their way to user code.

    ``offsets`` (partition -> offsets, for the START markers) describe ``messages``; ``spans``
    (partition -> (first, last), what a commit passes) cover the poll's skipped records too;
    ``gen`` is the pipeline's revocation generation when the batch was fetched (a partition revoked later is stale for it). ``handle`` is the I/O
    shell's own (its START futures); the pipeline never reads it. ``scheduled``: the messages with a
    ``kmq-not-before`` header (:class:`~kmq.consumer.fetch_pipeline.HandOver` names them)."""

    __slots__ = ("messages", "offsets", "spans", "nbytes", "fetched_at", "leased_at", "gen", "state", "error",
                 "handle", "handed", "scheduled")

    def __init__(self, messages: list[KmqMessage], offsets: dict[int, list[int]], now: float, gen: int,
                 nbytes: int = 0, skipped: dict[int, list[int]] | None = None,
                 scheduled: list[KmqMessage] | None = None) -> None:
        self.messages = messages
        self.scheduled = scheduled or []
        self.offsets = offsets
        self.nbytes = nbytes  # payload bytes, what flow control counts
        self.spans = {p: (o[0], o[-1]) for p, o in offsets.items()}
        for p, offs in (skipped or {}).items():  # committed past like the others, never STARTed
            lo, hi = self.spans.get(p, (offs[0], offs[-1]))
            self.spans[p] = (min(lo, offs[0]), max(hi, offs[-1]))
        self.fetched_at = now  # START sent: its answer is awaited from here
        self.leased_at = now  # when its lease was last started or renewed
        self.gen = gen
        self.state = STARTING
        self.error: Any = None
        self.handle: Any = None
        #: Handed over before its commit (``consumer.hand_over: started``): ``messages`` went to user
        #: code and is empty here; ``offsets`` and ``spans`` stay until the commit covering them.
        self.handed = False

    @classmethod
    def of(cls, messages: list[KmqMessage], now: float, gen: int,
           skipped: list[KmqMessage] | None = None, scheduled: list[KmqMessage] | None = None) -> "FetchBatch":
        """The batch of ``messages`` as one poll returned them (in fetch order per partition);
        ``skipped``: records of the same poll that are not delivered (another consumer group's
        copies), whose offsets the batch's commit passes without a START; ``scheduled``: those of
        ``messages`` with a ``kmq-not-before`` header."""
        offsets = offsets_by_partition(messages)
        nbytes = sum([m._nbytes for m in messages])
        return cls(messages, offsets, now, gen, nbytes, first_last(skipped) if skipped else None, scheduled)

    def drop(self, partitions: set[int]) -> list[KmqMessage]:
        """Take the messages of ``partitions`` out of the batch; returns them."""
        out = [m for m in self.messages if m.partition in partitions]
        self.messages = [m for m in self.messages if m.partition not in partitions]
        if self.scheduled:
            self.scheduled = [m for m in self.scheduled if m.partition not in partitions]
        for p in partitions:
            self.offsets.pop(p, None)
            self.spans.pop(p, None)
        return out

    def __repr__(self) -> str:
        return f"FetchBatch({self.spans}, {self.state}{', handed' if self.handed else ''})"
