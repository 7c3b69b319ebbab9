"""The simulated Kafka cluster: topics, produce with acknowledgements, groups, faults, history.

Pure Python, one thread, no wall clock. A :class:`SimCluster` owns

* the :class:`~kmq.dev.sim.clock.VirtualClock` every participant reads;
* a seeded ``random.Random`` (request latencies): the same seed and the same
  calls give the same history, byte for byte;
* the partition logs (:mod:`kmq.dev.sim.log`; records may be written in a
  transaction, committed or aborted later) and the group coordinator
  (:mod:`kmq.dev.sim.groups`);
* the :class:`~kmq.dev.sim.faults.FaultPlan`, whose one-off faults it
  schedules on the clock;
* the history: one line per thing that happened (appends, acknowledgements,
  fetches, commits, rebalances, retention), for determinism checks and for
  reading a failing run.

Its clients look like Kafka clients to kmq through the client seam:
:class:`~kmq.dev.sim.consumer.SimConsumer` (a :class:`~kmq.client.api.GroupConsumerAdapter`),
:class:`~kmq.dev.sim.producer.SimProducer` (``send`` returns a :class:`~kmq.client.api.Delivery`)
and :class:`~kmq.dev.sim.reader.SimLogReader` (the tracker's log reader contract).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Callable, Sequence

from kmq.client.api import ProduceFailed
from kmq.core.markers import End, encode, encode_key
from kmq.core.ranges import OffsetRange
from kmq.dev.sim.assignors import COOPERATIVE_STICKY
from kmq.dev.sim.clock import EPOCH_S, VirtualClock
from kmq.dev.sim.errors import SimulationError
from kmq.dev.sim.faults import (
    BAD_KMQ_HEADERS, DELAYED, HUGE_VALUE, HUNG, NULL_HEADER, NULL_RECORD, TOMBSTONE, BrokerPause, ClockSkew, FaultPlan,
    LeaderChange, MemberJoinsAndLeaves, MemberPause, OpenTransaction, Retention, SlowFetch, SlowRead,
    UnexpectedRecord,
)
from kmq.dev.sim.groups import GroupCoordinator
from kmq.dev.sim.log import PartitionLog

__all__ = ["SimCluster", "RecordMetadata", "UNEXPECTED_VALUES", "FOREIGN_MARKER_TYPE", "foreign_marker"]

#: (key, value, headers) of each unexpected record kind.
UNEXPECTED_VALUES: dict[str, tuple[bytes | None, bytes | None, tuple]] = {
    NULL_HEADER: (b"null-header", b"v", (("trace", None), ("app", b"1"))),
    TOMBSTONE: (b"tombstone", None, ()),
    NULL_RECORD: (None, None, ()),
    HUGE_VALUE: (b"huge", b"x" * (2 * 1024 * 1024), ()),
    BAD_KMQ_HEADERS: (b"bad-headers", b"v", (("kmq-delivery-count", b"\xff\xfe"), ("kmq-origin", None))),
}


#: The type code of :data:`~kmq.dev.sim.faults.FOREIGN_MARKER` records (kmq's are 1..6).
FOREIGN_MARKER_TYPE = 0x7F


def foreign_marker(partition: int) -> tuple[bytes, bytes, tuple]:
    """(key, value, headers) of a foreign marker for queue ``partition``: an END's bytes, naming every
    offset, with the type code :data:`FOREIGN_MARKER_TYPE`."""
    value = bytearray(encode(End((OffsetRange(0, 1 << 31),))))
    value[1] = FOREIGN_MARKER_TYPE
    return encode_key(partition), bytes(value), ()


class RecordMetadata(tuple):
    """A produce acknowledgement: ``(topic, partition, offset)`` like confluent's, with kafka-python's
    attribute names (``.topic``, ``.partition``, ``.offset``)."""

    __slots__ = ()

    def __new__(cls, topic: str, partition: int, offset: int) -> "RecordMetadata":
        return super().__new__(cls, (topic, partition, offset))

    topic = property(lambda self: self[0])
    partition = property(lambda self: self[1])
    offset = property(lambda self: self[2])


class SimCluster:
    """One simulated Kafka cluster (a single broker with ``acks=all`` semantics).

    :param seed: seeds the latencies (and nothing else is random).
    :param faults: the fault plan (none by default).
    :param session_timeout: of every group member (seconds), as ``kafka.session_timeout``.
    :param latency: ``(low, high)`` seconds a produce request takes to be written, drawn per request.
    :param segment_records: records per log segment (the unit retention deletes).
    """

    def __init__(self, seed: int = 0, faults: FaultPlan | None = None, *, session_timeout: float = 10.0,
                 max_poll_interval: float = 300.0, latency: tuple[float, float] = (0.0, 0.0),
                 segment_records: int = 100, start_s: float = EPOCH_S) -> None:
        self.seed = seed
        self.clock = VirtualClock(start_s)
        self.rng = random.Random(seed)
        self.faults = faults or FaultPlan()
        self.latency = latency
        self.segment_records = segment_records
        self.history: list[str] = []
        self._logs: dict[str, list[PartitionLog]] = {}
        self._last_append: dict[tuple, float] = {}
        self._last_ack: dict[tuple, float] = {}
        self._txn_ids = itertools.count(1)
        self._txns: dict[int, set[tuple[str, int]]] = {}  # open transaction -> the partitions it wrote to
        #: (consumer, topic, partition, offset) -> the longest time between the fetch that returned the
        #: record and the consumer's fetch before it (seconds): how old "written since my last fetch" can be.
        #: Kept only when a clock is skewed (the lease checks ask then).
        self.fetch_gaps: dict[tuple[str, str, int, int], float] = {}
        self.groups = GroupCoordinator(self.partition_counts, self.record, self.faults.frozen_spans,
                                       lambda t: self.faults.broker_paused_until(t) is not None,
                                       session_timeout, max_poll_interval)
        self._schedule_faults()

    # ------------------------------------------------------------ time and history
    def t(self) -> float:
        """Seconds since the simulation began (the time faults are given in)."""
        return self.clock.monotonic()

    def record(self, line: str) -> None:
        self.history.append(f"{self.t():.6f} {line}")

    def history_bytes(self) -> bytes:
        return ("\n".join(self.history) + "\n").encode("utf-8")

    def digest(self) -> str:
        """SHA-256 of the history: equal for equal runs."""
        return hashlib.sha256(self.history_bytes()).hexdigest()

    def wall_ms(self, client: str) -> int:
        """The wall clock of ``client``'s host in milliseconds (:class:`~kmq.dev.sim.faults.ClockSkew`)."""
        return self.clock.now_ms() + round(self.faults.skew_s(client, self.t()) * 1000)

    def served_at(self, t: float) -> float:
        """When a request made at ``t`` is served: at once, or when the broker pause(s) around it end."""
        while (end := self.faults.broker_paused_until(t)) is not None:
            t = end
        return t

    def wait_for_broker(self) -> None:
        """A request waits out a broker pause (the clock moves to its end)."""
        served = self.served_at(self.t())
        if served > self.t():
            self.clock.run_until(self.clock.now() + (served - self.t()))

    # ------------------------------------------------------------ topics and logs
    def create_topic(self, name: str, partitions: int = 1) -> None:
        if partitions < 1:
            raise SimulationError(f"a topic needs at least one partition, not {partitions}")
        if name in self._logs:
            raise SimulationError(f"topic {name} exists already")
        self._logs[name] = [PartitionLog(self.segment_records) for _ in range(partitions)]
        self.record(f"topic {name} created with {partitions} partition(s)")
        self.groups.topics_changed(self.t())

    def partition_counts(self) -> dict[str, int]:
        return {t: len(ps) for t, ps in self._logs.items()}

    def has(self, topic: str, partition: int) -> bool:
        return topic in self._logs and 0 <= partition < len(self._logs[topic])

    def log(self, topic: str, partition: int) -> PartitionLog:
        if not self.has(topic, partition):
            raise SimulationError(f"{topic}[{partition}] does not exist; create the topic first (create_topic)")
        return self._logs[topic][partition]

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               headers: Sequence[tuple[str, bytes | None]] = (), timestamp_ms: int | None = None,
               source: str = "admin", skew_ms: int = 0, txn: int | None = None) -> int:
        """Write one record at once, past any producer (another application, a test's setup);
        ``skew_ms``: how far the clock that stamped it read off; ``txn``: the open transaction
        (:meth:`begin_transaction`) it is written in."""
        ts = self.clock.now_ms() if timestamp_ms is None else timestamp_ms
        if txn is not None and txn not in self._txns:
            raise SimulationError(f"transaction {txn} is not open: begin one with begin_transaction")
        offset = self.log(topic, partition).append(key, value, headers, ts, skew_ms, txn)
        if txn is not None:
            self._txns[txn].add((topic, partition))
        self.record(f"append {topic}[{partition}]@{offset} by {source} key={_show(key)} "
                    f"value={_size(value)} headers={len(headers)}" + ("" if txn is None else f" txn={txn}"))
        return offset

    # ------------------------------------------------------------ transactions
    def begin_transaction(self, producer: str) -> int:
        """A transaction of ``producer`` begins; returns its id (records join it with ``append(txn=)``)."""
        txn = next(self._txn_ids)
        self._txns[txn] = set()
        self.record(f"transaction {txn} begins ({producer})")
        return txn

    def end_transaction(self, txn: int, commit: bool) -> dict[tuple[str, int], int]:
        """Commit or abort ``txn``: a commit or abort marker (a control record, taking an offset) on
        each partition it wrote to; returns their offsets."""
        parts = self._txns.pop(txn, None)
        if parts is None:
            raise SimulationError(f"transaction {txn} is not open")
        what = "commit" if commit else "abort"
        out = {}
        for topic, partition in sorted(parts):
            offset = self.log(topic, partition).end_transaction(txn, commit, self.clock.now_ms())
            if offset is not None:
                out[(topic, partition)] = offset
                self.record(f"{what} marker {topic}[{partition}]@{offset} of transaction {txn}")
        self.record(f"transaction {txn} {'committed' if commit else 'aborted'}")
        return out

    def last_stable(self, topic: str, partition: int) -> int:
        """The partition's last stable offset (:attr:`PartitionLog.last_stable`)."""
        return self.log(topic, partition).last_stable

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        """The admin DeleteRecords call; returns the new log start."""
        start = self.log(topic, partition).delete_records(before)
        self.record(f"delete-records {topic}[{partition}] log start now {start}")
        return start

    def retention(self, topic: str, partition: int, segments: int = 1) -> int:
        """Delete the oldest ``segments`` segment(s) (never the active one); returns the log start."""
        plog = self.log(topic, partition)
        for _ in range(segments):
            if plog.delete_oldest_segment() is None:
                break
        self.record(f"retention {topic}[{partition}] log start now {plog.log_start}")
        return plog.log_start

    def fetched(self, consumer: str, tp: tuple[str, int], first: int, end: int, gap: float) -> None:
        """``consumer`` fetched offsets ``first`` to ``end`` of ``tp``, ``gap`` seconds after its previous fetch."""
        if not self.faults.of(ClockSkew):
            return  # only the lease checks under clock skew ask
        for off in range(first, end):
            key = (consumer, tp[0], tp[1], off)
            self.fetch_gaps[key] = max(gap, self.fetch_gaps.get(key, 0.0))

    # ------------------------------------------------------------ producing
    def produce(self, producer: str, topic: str, partition: int, key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes | None]], timestamp_ms: int, delivery_timeout: float,
                on_written: Callable[[int], None], on_acked: Callable[[RecordMetadata], None],
                on_failed: Callable[[BaseException], None], skew_ms: int = 0) -> Callable[[], None]:
        """A produce request (``skew_ms``: how far the clock that stamped ``timestamp_ms`` read off):
        the record is appended when the broker serves it (after latency and any broker pause), and
        acknowledged, acknowledged late, or reported failed as the fault plan says.
        Records of one producer and partition are written and acknowledged in send order.

        Returns a cancel function (a producer closed before the write happened: it never happens)."""
        now = self.t()
        fault = self.faults.produce_fault(topic, partition, now, producer)
        hung = fault is not None and fault.ack == HUNG
        lane = (producer, topic, partition)
        append_at = max(self.served_at(now) + self.rng.uniform(*self.latency), self._last_append.get(lane, now))
        deadline = now + delivery_timeout
        written = (fault is None or fault.written) and append_at <= deadline
        ack_at = max(append_at + (fault.ack_delay if fault else 0.0), self._last_ack.get(lane, now))
        acked = written and (fault is None or fault.ack == DELAYED) and ack_at <= deadline
        cancelled = [False]

        def fail() -> None:
            why = "written, but its acknowledgement was lost" if written else "not written"
            self.record(f"produce-timeout {topic}[{partition}] by {producer} ({why})")
            on_failed(ProduceFailed(f"{topic}[{partition}]: no acknowledgement within the delivery timeout "
                                    f"({delivery_timeout:g}s)"))

        def write() -> None:
            if cancelled[0]:
                return
            offset = self.append(topic, partition, key, value, headers, timestamp_ms, source=producer,
                                 skew_ms=skew_ms)
            on_written(offset)
            if acked:
                self._at(ack_at, lambda: self._ack(producer, topic, partition, offset, on_acked))

        if written:
            self._last_append[lane] = append_at
            if acked:
                self._last_ack[lane] = ack_at
            if append_at <= now:
                write()
            else:
                self._at(append_at, write)
        if not acked and not hung:  # hung: no answer until the producer is closed (it cancels, failing the send)
            self._at(deadline, fail)

        def cancel() -> None:
            cancelled[0] = True

        return cancel

    def _ack(self, producer: str, topic: str, partition: int, offset: int,
             on_acked: Callable[[RecordMetadata], None]) -> None:
        self.record(f"ack {topic}[{partition}]@{offset} to {producer}")
        on_acked(RecordMetadata(topic, partition, offset))

    def _at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at simulation time ``t`` (seconds since the start)."""
        self.clock.call_at(self.clock.now() + (t - self.t()), fn)

    # ------------------------------------------------------------ faults on the clock
    def _schedule_faults(self) -> None:
        for f in self.faults.faults:
            if isinstance(f, (Retention, UnexpectedRecord)):
                self._at(f.at, lambda f=f: self._log_fault(f))  # type: ignore[misc]  # f bound per fault
            elif isinstance(f, MemberJoinsAndLeaves):
                self._at(f.at, lambda f=f: self._phantom_joins(f))  # type: ignore[misc]
            elif isinstance(f, ClockSkew):
                self._at(f.at, lambda f=f: self.record(f"clock of {f.host} set {f.offset_s:+g}s"))  # type: ignore[misc]
            elif isinstance(f, (SlowFetch, SlowRead, LeaderChange, BrokerPause, MemberPause, OpenTransaction)):
                # Nothing happens then, but a wait re-checks: a fetch returns as soon as the fault ends.
                self._at(f.until, lambda: None)
                if isinstance(f, MemberPause) and f.until - f.at > self.groups.session_timeout:
                    self.session_ends(f.at)

    def session_ends(self, silent_since: float) -> None:
        """A member went silent at ``silent_since``: let the coordinator expire it when its session ends."""
        self._at(silent_since + self.groups.session_timeout, lambda: self.groups.tick(self.t()))

    def frozen(self, name: str) -> bool:
        """Whether the process of client ``name`` is frozen now (a driver does not call it then: its
        calls would wait until it thaws, and hold up every other participant of this one thread)."""
        return self.faults.frozen_until(name, self.t()) is not None

    def _log_fault(self, f: Retention | UnexpectedRecord) -> None:
        if not self.has(f.topic, f.partition):
            self.record(f"fault skipped: {f.topic}[{f.partition}] does not exist")
        elif isinstance(f, Retention):
            self.retention(f.topic, f.partition, f.segments)
        else:
            key, value, headers = UNEXPECTED_VALUES[f.kind] if f.kind in UNEXPECTED_VALUES else foreign_marker(f.partition)
            self.append(f.topic, f.partition, key, value, headers, source=f"unexpected-{f.kind}")

    def _phantom_joins(self, f: MemberJoinsAndLeaves) -> None:
        g = self.groups.group(f.group)
        topics = frozenset(t for m in g.members.values() for t in m.topics) or frozenset(self._logs)
        member = self.groups.join(f.group, "phantom", topics, g.assignor or COOPERATIVE_STICKY, self.t(), phantom=True)
        self._at(f.until, lambda: self.groups.leave(f.group, member, self.t()))

    # ------------------------------------------------------------ offsets
    def committed(self, group_id: str, topic: str) -> dict[int, int]:
        """Committed offsets of ``group_id`` on ``topic`` (partition -> next offset)."""
        n = len(self._logs.get(topic, ()))
        return {p: off for p in range(n) if (off := self.groups.committed(group_id, (topic, p))) is not None}

    def __repr__(self) -> str:
        return f"SimCluster(seed={self.seed}, t={self.t():.3f}s, topics={sorted(self._logs)})"


def _show(key: bytes | None) -> str:
    return "null" if key is None else key[:32].hex()


def _size(value: bytes | None) -> str:
    return "null" if value is None else f"{len(value)}B"

