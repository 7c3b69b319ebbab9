"""The simulated log reader: the tracker's "read these offsets back" contract over a :class:`SimCluster`.

The same contract as :class:`kmq.client.api.LogReader`, which both real readers keep: each
requested offset comes back with its record or is reported missing (deleted by retention), never a neighbour in its place;
``log_end`` is where the log ended for the read (the high-water mark) when the request reached past it (offsets
at or past it are neither found nor missing). It waits out a broker pause or a slow fetch
(:class:`~kmq.dev.sim.faults.SlowFetch` naming the reader) for at most its
timeout, in simulated time, then raises
:class:`~kmq.core.errors.LogReadError` as the real readers do.

It reads at the real readers' isolation level,
:data:`kmq.client.api.LOG_READER_ISOLATION` (``read_uncommitted``: every
record up to the high-water mark, those of open and aborted transactions
too), unless given another: ``read_committed``, its log ends at the last
stable offset and an aborted transaction's records are not found (the read
passes them, as a gap in the log).
"""

from __future__ import annotations

from typing import Iterable, Mapping, TypeVar

from kmq.client.api import LOG_READER_ISOLATION, LogEnds, ReadResult, Record
from kmq.core.errors import LogReadError
from kmq.core.ranges import RangeSet, missing
from kmq.dev.sim.clock import EPOCH_S
from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.log import check_isolation

__all__ = ["SimLogReader"]

K = TypeVar("K")

#: The real readers' poll slice (kafka-python's reader polls 200 ms at a time).
POLL_S = 0.2


class SimLogReader:
    """Reads given offsets of one partition at a time, straight from the simulated logs
    (``isolation_level``: see the module docstring)."""

    def __init__(self, cluster: SimCluster, name: str = "log-reader", timeout_s: float = 10.0, *,
                 isolation_level: str = LOG_READER_ISOLATION) -> None:
        self.cluster = cluster
        self.name = name
        self._timeout_s = timeout_s
        self.isolation_level = check_isolation(isolation_level)

    def close(self) -> None:
        """Nothing to release."""

    def release(self) -> None:
        """Nothing is kept between reads."""

    def _wait_until_answered(self, what: str, tp: tuple[str, int] | None = None) -> None:
        c = self.cluster

        def answered() -> bool:
            t = c.t()
            return (c.faults.broker_paused_until(t) is None and c.faults.fetch_blocked_until(self.name, t) is None
                    and (tp is None or c.faults.read_blocked_until(self.name, tp[0], tp[1], t) is None))

        given_up = c.clock.now() + self._timeout_s + POLL_S  # the end of the first poll past the timeout
        if not c.clock.run_until(given_up, answered):
            raise LogReadError(f"timed out reading {what} (simulated {self._timeout_s:g}s, "
                               f"given up at t={c.t():g}s)")

    def read(self, topic: str, partition: int, ranges: Iterable[tuple[int, int]]) -> ReadResult:
        """Records at exactly these offsets (``(first, count)`` ranges); raises ``LogReadError`` on timeout."""
        wanted = RangeSet(ranges)
        found: dict[int, Record] = {}
        if not wanted:
            return ReadResult(found, [])
        self._wait_until_answered(f"{topic}[{partition}]", (topic, partition))
        plog = self.cluster.log(topic, partition)
        end = self._end(topic, partition)
        for r in wanted.ranges():
            lo, hi = max(r.first, plog.log_start), min(r.end, end)
            for rec in plog.read(lo, hi - lo, self.isolation_level):
                found[rec.offset] = Record(topic, partition, rec.offset, rec.key, rec.value, list(rec.headers),
                                           rec.timestamp)
        last = wanted.ranges()[-1].last
        log_end = end if last >= end else None
        self.cluster.record(f"read {self.name} {topic}[{partition}] {len(found)} found, log end {log_end}")
        below = wanted.ranges() if log_end is None else wanted.intersection(0, log_end)
        return ReadResult(found, missing(below, found), log_end)

    def _end(self, topic: str, partition: int) -> int:
        """Where a read of the partition now finds its log ending: the high-water mark (the last
        stable offset, ``read_committed``), or under a :class:`~kmq.dev.sim.faults.LaggingRead` the
        first record written since the fault began, if that is lower."""
        c = self.cluster
        plog = c.log(topic, partition)
        end = plog.end(self.isolation_level)
        lag = c.faults.read_lag(self.name, topic, partition, c.t())
        if lag is None:
            return end
        cut_ms = int((EPOCH_S + lag.at) * 1000)
        return min(end, next((rec.offset for rec in plog.read(plog.log_start, plog.high_water - plog.log_start)
                              if rec.timestamp - rec.skew_ms >= cut_ms), plog.high_water))

    def high_waters(self, starts: Mapping[K, int | None]) -> dict[K, int]:
        """High-water marks now, keyed as given (``(topic, partition)`` tuples or kafka-python's
        ``TopicPartition``, which is one)."""
        if not starts:
            return {}
        self._wait_until_answered(f"the high-water marks of {len(starts)} partition(s)")
        return {tp: self.cluster.log(tp[0], tp[1]).end(self.isolation_level) for tp in starts}  # type: ignore[index]

    def log_ends(self, starts: Mapping[K, int | None]) -> LogEnds:
        """As :meth:`high_waters`, partition by partition: a partition whose reads are stalled
        (:class:`~kmq.dev.sim.faults.SlowRead` naming this reader) past the timeout is listed as
        failed and the others are answered; a broker that answers nothing raises, as there."""
        if not starts:
            return LogEnds({}, {})
        c = self.cluster
        given_up = c.clock.now() + self._timeout_s + POLL_S

        def blocked() -> list:
            return [tp for tp in starts if c.faults.read_blocked_until(self.name, tp[0], tp[1], c.t()) is not None]  # type: ignore[index]

        c.clock.run_until(given_up, lambda: not blocked())
        failed = {tp: f"timed out reading {tp[0]}[{tp[1]}] (simulated {self._timeout_s:g}s)" for tp in blocked()}
        rest = [tp for tp in starts if tp not in failed]
        if rest:
            self._wait_until_answered(f"the high-water marks of {len(rest)} partition(s)")
        return LogEnds({tp: c.log(tp[0], tp[1]).end(self.isolation_level) for tp in rest}, failed)  # type: ignore[index]

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic``; 0 when it does not exist."""
        return self.cluster.partition_counts().get(topic, 0)

    def __repr__(self) -> str:
        return f"SimLogReader({self.name!r})"
