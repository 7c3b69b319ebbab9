"""An in-memory Kafka for driving the tracker's service loop without a broker.

One :class:`FakeKafka` holds every topic's log; the fakes built on it play the
tracker's clients (the markers group consumer, the queue log reader, the
high-water reader, the producer), so what the tracker writes (copies, dead
letters, CLOSED markers) is what it reads back, as on a real broker. Time is
a :class:`FakeTime` the test moves: a slow read or send advances it instead
of sleeping.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from kmq.client import ClientCommitFailed, LogEnds, Record
from kmq.client.parts import ClientFactory
from kmq.core.errors import BrokerUnavailable, LogReadError
from kmq.core.markers import encode, encode_key
from kmq.core.ranges import OffsetRange


@dataclass
class FakeRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list = field(default_factory=list)
    timestamp: int = 0


class FakeTime:
    """Stands in for the ``time`` module of the code under test: ``monotonic()`` and ``time()``
    return controlled values (``advance`` moves both)."""

    def __init__(self, wall: float = 1_000.0) -> None:
        self.mono = 100.0
        self.wall = wall

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


class FakeKafka:
    """Topic logs: ``(topic, partition) -> [FakeRecord]``."""

    def __init__(self, clock: FakeTime) -> None:
        self.clock = clock
        self.logs: dict[tuple[str, int], list[FakeRecord]] = defaultdict(list)
        self.partitions: dict[str, int] = {}
        self.committed: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) -> offset
        self.log_start: dict[tuple[str, int], int] = {}  # records below it were deleted (retention)

    def create(self, topic: str, partitions: int) -> None:
        self.partitions[topic] = partitions

    def append(self, topic: str, partition: int, key, value, headers=None, timestamp: int | None = None) -> int:
        log = self.logs[(topic, partition)]
        ts = int(self.clock.wall * 1000) if timestamp is None else timestamp
        log.append(FakeRecord(topic, partition, len(log), key, value, list(headers or []), ts))
        return len(log) - 1

    def marker(self, topic: str, partition: int, marker, ts_ms: int) -> int:
        return self.append(topic, partition, encode_key(partition), encode(marker), timestamp=ts_ms)

    def records(self, topic: str, partition: int) -> list[FakeRecord]:
        return self.logs[(topic, partition)]


class FakeGroupConsumer:
    """The markers group consumer: the methods of :class:`kmq.client.GroupConsumerAdapter` the
    tracker calls, with ``(topic, partition)`` keys. ``assign(partitions)`` plays a rebalance:
    the revoke (with its commit) and assignment callbacks the tracker subscribed with run."""

    def __init__(self, kafka: FakeKafka) -> None:
        self.kafka = kafka
        self.assigned: list[tuple[str, int]] = []
        self.pos: dict[tuple[str, int], int] = {}
        self.commits: dict[tuple[str, int], int] = {}
        self.refuse_commits: ClientCommitFailed | None = None  # raised by commit() while set
        self.offsets_unavailable = False  # committed() raises BrokerUnavailable while set
        self._callbacks: tuple | None = None

    def subscribe(self, topics, on_assigned, on_revoked, commit_on_revoke=None, on_commit_failed=None) -> None:
        self._callbacks = (on_assigned, on_revoked, commit_on_revoke, on_commit_failed)

    def assign(self, partitions) -> None:
        """An eager rebalance: every partition is revoked (after its commit), then ``partitions`` assigned."""
        on_assigned, on_revoked, commit_on_revoke, on_commit_failed = self._callbacks
        gone = set(self.assigned)
        if gone:
            offsets = commit_on_revoke(gone) if commit_on_revoke is not None else {}
            if offsets:
                try:
                    self.commit(offsets)
                except ClientCommitFailed as exc:
                    on_commit_failed(exc)
            on_revoked(gone)
        self.assigned = list(partitions)
        on_assigned(set(self.assigned))

    def fetch(self, timeout: float, max_records: int, build: Callable = Record, wake=None) -> list:
        out = []
        for tp in self.assigned:
            p = self.pos.get(tp)
            if p is None:
                continue
            recs = self.kafka.records(*tp)[p:p + max_records - len(out)]
            out.extend(build(r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp) for r in recs)
            self.pos[tp] = p + len(recs)
        return out

    def assignment(self) -> set[tuple[str, int]]:
        return set(self.assigned)

    def committed(self, partitions) -> dict[tuple[str, int], int | None]:
        if self.offsets_unavailable:
            raise BrokerUnavailable("committed offsets not read: the group coordinator is not available")
        return {tp: self.commits.get(tp) for tp in partitions}

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self.pos[(topic, partition)] = offset

    def seek_to_beginning(self, partitions) -> None:
        for tp in partitions:
            self.pos[tp] = 0

    def position(self, topic: str, partition: int) -> int | None:
        return self.pos.get((topic, partition))

    def highwater(self, topic: str, partition: int) -> int:
        return len(self.kafka.records(topic, partition))

    def commit(self, offsets) -> None:
        if self.refuse_commits is not None:
            raise self.refuse_commits
        self.commits.update(offsets)

    def close(self) -> None:
        pass


class FakeFuture:
    def __init__(self, error: BaseException | None = None, done: bool = True) -> None:
        self.error = error
        self.done = done

    @property
    def is_done(self) -> bool:
        return self.done

    def get(self, timeout=None):
        if not self.done:
            raise TimeoutError("not delivered yet")
        if self.error is not None:
            raise self.error
        return None


class FakeProducer:
    """Appends to the fake logs; ``refuse(topic, value, key, headers)`` may return an exception to fail a send."""

    def __init__(self, kafka: FakeKafka, refuse: Callable | None = None) -> None:
        self.kafka = kafka
        self.refuse = refuse
        self.closed = False

    def send(self, topic, value=None, key=None, headers=None, partition=None):
        error = self.refuse(topic, value, key, headers) if self.refuse else None
        if error is None:
            self.kafka.append(topic, partition, key, value, headers)
        return FakeFuture(error)

    def flush(self, timeout=None) -> None:
        pass

    def close(self, timeout=None) -> None:
        self.closed = True


@dataclass
class FakeReadResult:
    records: dict
    missing: list
    log_end: int | None = None


class FakeLogReader:
    """Reads queue records back; ``on_read(partition)`` runs first (to be slow or fail)."""

    def __init__(self, kafka: FakeKafka, on_read: Callable[[int], None] | None = None,
                 timeout_s: float = 10.0) -> None:
        self.kafka = kafka
        self.on_read = on_read
        self.reads: list[int] = []
        self.timeout_s = timeout_s
        self.unreachable: set[tuple[str, int]] = set()  # partitions whose look-ups get no answer
        self.lookups: list[list[tuple[str, int]]] = []  # the partitions of each look-up

    def read(self, topic: str, partition: int, ranges) -> FakeReadResult:
        self.reads.append(partition)
        if self.on_read is not None:
            self.on_read(partition)
        log = self.kafka.records(topic, partition)
        start = self.kafka.log_start.get((topic, partition), 0)
        found, missing, log_end = {}, [], None
        for first, count in ranges:
            for o in range(first, first + count):
                if o < start:
                    missing.append(OffsetRange(o, 1))  # deleted (retention)
                elif o < len(log):
                    found[o] = log[o]
                else:
                    log_end = len(log)  # as the readers do: past the end is neither found nor missing
        return FakeReadResult(found, missing, log_end)

    def high_waters(self, starts) -> dict:
        """All or nothing, as :meth:`kmq.client.api.LogReader.high_waters`: a partition in
        :attr:`unreachable` makes the call wait out the timeout and fail."""
        got = self.log_ends(starts)
        if got.failed:
            raise LogReadError(next(iter(got.failed.values())))
        return got.ends

    def log_ends(self, starts) -> LogEnds:
        """Partition by partition: those in :attr:`unreachable` (their leader does not answer) cost
        the call the reader's timeout and are reported failed; the others are answered."""
        self.lookups.append(sorted(starts))
        stuck = [tp for tp in starts if tp in self.unreachable]
        if stuck:
            self.kafka.clock.advance(self.timeout_s)
        return LogEnds({tp: len(self.kafka.records(*tp)) for tp in starts if tp not in stuck},
                       {tp: f"no answer from the broker for {self.timeout_s:g}s reading {tp[0]}[{tp[1]}]"
                        for tp in stuck})

    def committed(self, group: str, partitions) -> dict:
        """``kafka.committed[(group, topic, partition)]`` (None: nothing committed)."""
        return {tp: self.kafka.committed.get((group, *tp)) for tp in partitions}

    def scan(self, starts):
        for tp, start in starts.items():
            log = self.kafka.records(*tp)
            if start is None or start < len(log):
                yield tp, list(log[start or 0:])

    def partition_count(self, topic: str) -> int:
        return self.kafka.partitions.get(topic, 0)

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeClients(ClientFactory):
    """The :class:`~kmq.client.parts.ClientFactory` of a :class:`FakeKafka`, for
    :class:`tracker.service.Tracker` (``clients=``): what its ``open`` builds is kept here.
    The two log readers it opens come in its order: the queue reader (given ``on_read``), then
    the markers look-up reader. Topics are aligned, their ``max.message.bytes`` unknown."""

    def __init__(self, kafka: FakeKafka, on_read: Callable[[int], None] | None = None,
                 refuse: Callable | None = None) -> None:
        self.kafka = kafka
        self.on_read = on_read
        self.refuse = refuse
        self.consumer: FakeGroupConsumer | None = None
        self.producers: list[FakeProducer] = []
        self.readers: list[FakeLogReader] = []

    def group_consumer(self, kafka, group_id, assignor, max_records, **overrides) -> FakeGroupConsumer:
        self.consumer = FakeGroupConsumer(self.kafka)
        return self.consumer

    def producer(self, kafka, timeout_s=None, settle_on_flush=False, **overrides) -> FakeProducer:
        self.producers.append(FakeProducer(self.kafka, self.refuse))
        return self.producers[-1]

    def open_log_reader(self, kafka, timeout_s: float = 10.0, fetch_wait_ms: int = 50, **overrides) -> FakeLogReader:
        self.readers.append(FakeLogReader(self.kafka, None if self.readers else self.on_read, timeout_s=timeout_s))
        return self.readers[-1]

    def require_aligned(self, kafka, queue) -> dict:
        return dict(self.kafka.partitions)

    def max_message_bytes(self, kafka, names) -> dict:
        return dict.fromkeys(names)
