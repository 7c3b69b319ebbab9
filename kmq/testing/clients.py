"""The simulated cluster's clients for kmq's threads: one lock, time that moves only when told.

:class:`~kmq.dev.sim.SimCluster` lives in one thread and moves its virtual clock inside
blocking calls (a fetch waits in simulated time). :class:`KmqConsumer` calls its clients
from several threads (the fetcher, the marker flusher, a hand-off sender) and waits in
real time. :class:`SharedCluster` puts the two together:

* every call into the cluster holds one lock, and afterwards runs what is due at the
  current simulated time (a produce acknowledgement, an asynchronous commit's answer):
  with no latency and no faults, every request is answered at once;
* no client call moves the clock: an empty fetch waits in real time (a few
  milliseconds, until another call changed the cluster) and returns what there is;
  only :class:`~kmq.testing.queue.TestQueue` moves the clock (``advance``);
* rebalance callbacks run with the lock set aside, as a client's callbacks run
  while its other threads go on (kmq's revoke callback waits for a hand-off RENEW
  sent from another thread).

:class:`SimClients` is the :class:`~kmq.client.parts.ClientFactory` that builds them.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

from kmq.client.api import ClientCommitFailed, GroupConsumerAdapter, LogReader, Partition, Record
from kmq.client.parts import ClientFactory
from kmq.config import KafkaConfig, QueueConfig
from kmq.core.errors import TopicMissing
from kmq.dev.sim import SimCluster, SimConsumer, SimLogReader, SimProducer

__all__ = ["SharedCluster", "SimClients"]

#: What the simulated topics report as ``max.message.bytes`` (Kafka's default).
_MAX_MESSAGE_BYTES = 1_048_588

#: Longest real-time wait of an empty fetch before it looks again (a change wakes it sooner).
_FETCH_SLICE_S = 0.05


class _SetAsideLock:
    """A re-entrant lock its holder can set aside for a while (around a callback) and take back."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            while self._owner is not None:
                self._cond.wait()
            self._owner, self._depth = me, 1

    def release(self) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify()

    def set_aside(self) -> int:
        """Release it entirely (it must be held); returns the depth to take back."""
        with self._cond:
            depth, self._owner, self._depth = self._depth, None, 0
            self._cond.notify()
            return depth

    def take_back(self, depth: int) -> None:
        self.acquire()
        with self._cond:
            self._depth = depth


class SharedCluster:
    """A :class:`SimCluster` several threads use: see the module docstring."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self._lock = _SetAsideLock()
        self._news = threading.Condition()
        self._changes = 0

    @contextmanager
    def use(self) -> Iterator[SimCluster]:
        """Hold the cluster for one call; what became due at the current time runs before it is let go."""
        self._lock.acquire()
        try:
            yield self.cluster
            clock = self.cluster.clock
            clock.run_until_us(clock.now_us())
        finally:
            self._lock.release()
            with self._news:
                self._changes += 1
                self._news.notify_all()

    def outside(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` (a rebalance callback) with the cluster let go, then take it back."""
        depth = self._lock.set_aside()
        try:
            return fn(*args)
        finally:
            self._lock.take_back(depth)

    def changes(self) -> int:
        """How many calls were made so far (for :meth:`wait_for_change`)."""
        with self._news:
            return self._changes

    def wait_for_change(self, seen: int, timeout: float) -> None:
        """Wait in real time, at most ``timeout`` seconds, for a call after the ``seen``-th."""
        with self._news:
            self._news.wait_for(lambda: self._changes != seen, timeout)


class SharedConsumer(GroupConsumerAdapter):
    """A :class:`SimConsumer` behind a :class:`SharedCluster`: the :class:`GroupConsumerAdapter`
    kmq's consumer and tracker drive. Fetches never move the simulated clock."""

    client = "sim"

    def __init__(self, shared: SharedCluster, name: str, group_id: str, assignor: str) -> None:
        self.raw = self
        self.shared = shared
        self.group_id = group_id
        self.open = True  # until close()
        with shared.use() as cluster:
            self.sim = SimConsumer(cluster, name, group_id=group_id, assignor=assignor)
        self.fetches = 0  # fetches made (the test queue waits for one after moving the clock)

    def subscribe(self, topics: Iterable[str], on_assigned: Callable[[set[Partition]], None],
                  on_revoked: Callable[[set[Partition]], None],
                  commit_on_revoke: Callable[[set[Partition]], Mapping[Partition, int]] | None = None,
                  on_commit_failed: Callable[[ClientCommitFailed], None] | None = None) -> None:
        shared = self.shared

        def revoked(parts: set[Partition]) -> None:
            if commit_on_revoke is not None:
                offsets = shared.outside(commit_on_revoke, parts)
                if offsets:
                    try:
                        self.sim.commit(dict(offsets))
                    except ClientCommitFailed as exc:
                        if on_commit_failed is not None:
                            shared.outside(on_commit_failed, exc)
            shared.outside(on_revoked, parts)

        with shared.use():
            self.sim.subscribe(topics, lambda parts: shared.outside(on_assigned, parts), revoked)

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = Record,
              wake: threading.Event | None = None) -> list[Any]:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            seen = self.shared.changes()
            with self.shared.use():
                out = self.sim.fetch(0.0, max_records, build)
                self.fetches += 1
            left = deadline - time.monotonic()
            if out or left <= 0 or (wake is not None and wake.is_set()):
                return out
            self.shared.wait_for_change(seen + 1, min(left, _FETCH_SLICE_S))

    def poll(self, timeout: float, max_records: int) -> list[Record]:
        return self.fetch(timeout, max_records, Record)

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        with self.shared.use():
            self.sim.commit(offsets)

    def commit_async(self, offsets: Mapping[Partition, int]) -> Any:
        with self.shared.use():
            return self.sim.commit_async(offsets)

    def committed(self, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        with self.shared.use() as cluster:
            return {tp: cluster.groups.committed(self.sim.group_id, tp) for tp in partitions}  # type: ignore[arg-type]  # a group's

    def assignment(self) -> set[Partition]:
        with self.shared.use():
            return self.sim.assignment()

    def member_id(self) -> str | None:
        with self.shared.use():
            return self.sim.member_id()

    def seek(self, topic: str, partition: int, offset: int) -> None:
        with self.shared.use():
            self.sim.seek(topic, partition, offset)

    def seek_to_beginning(self, partitions: Iterable[Partition]) -> None:
        with self.shared.use() as cluster:
            for topic, partition in partitions:
                self.sim.seek(topic, partition, cluster.log(topic, partition).log_start)

    def position(self, topic: str, partition: int) -> int | None:
        with self.shared.use():
            return self.sim.position(topic, partition)

    def highwater(self, topic: str, partition: int) -> int | None:
        with self.shared.use():
            return self.sim.highwater(topic, partition)

    def pause(self, partitions: Iterable[Partition]) -> None:
        with self.shared.use():
            self.sim.pause(partitions)

    def resume(self, partitions: Iterable[Partition]) -> None:
        with self.shared.use():
            self.sim.resume(partitions)

    def watch(self, stall_timeout: float, on_fatal: Callable[[str], None], name: str) -> None:
        """Nothing to watch: a fetch here always returns within its timeout."""

    def unwatch(self) -> None:
        """See :meth:`watch`."""

    def recover_starved(self) -> None:
        """Nothing to recover: no fetch response is lost."""

    def close(self) -> None:
        self.open = False
        with self.shared.use():
            self.sim.close()


class SharedProducer:
    """A :class:`SimProducer` behind a :class:`SharedCluster`: every send is written and
    acknowledged at the current simulated time."""

    def __init__(self, shared: SharedCluster, name: str, max_request_size: int) -> None:
        self.shared = shared
        with shared.use() as cluster:
            self.sim = SimProducer(cluster, name, max_request_size=max_request_size)

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
             headers: Any = None, timestamp_ms: int | None = None) -> Any:
        with self.shared.use():
            return self.sim.send(topic, value=value, key=key, partition=partition, headers=headers,
                                 timestamp_ms=timestamp_ms)

    def flush(self, timeout: float | None = None) -> None:
        with self.shared.use():
            self.sim.flush(0.0)  # answered at once, or not in simulated time that stands still

    def close(self, timeout: float = 5.0) -> None:
        with self.shared.use():
            self.sim.close(0.0)


class SharedLogReader(LogReader):
    """A :class:`SimLogReader` behind a :class:`SharedCluster` (the tracker's reads)."""

    def __init__(self, shared: SharedCluster, name: str, timeout_s: float) -> None:
        self.shared = shared
        self.sim = SimLogReader(shared.cluster, name, timeout_s)

    def read(self, topic: str, partition: int, ranges: Iterable[tuple[int, int]]) -> Any:
        with self.shared.use():
            return self.sim.read(topic, partition, ranges)

    def high_waters(self, starts: Mapping[Any, int | None]) -> dict[Any, int]:
        with self.shared.use():
            return self.sim.high_waters(starts)

    def log_ends(self, starts: Mapping[Any, int | None]) -> Any:
        with self.shared.use():
            return self.sim.log_ends(starts)

    def partition_count(self, topic: str) -> int:
        with self.shared.use():
            return self.sim.partition_count(topic)

    def scan(self, starts: Mapping[Partition, int | None]) -> Iterator[tuple[Partition, list[Any]]]:
        """Each partition from its start (None: the log start) to its end now, in one batch."""
        for (topic, partition), start in starts.items():
            with self.shared.use() as cluster:
                plog = cluster.log(topic, partition)
                begin = plog.log_start if start is None else max(start, plog.log_start)
                stored = plog.read(begin, plog.high_water - begin)
            batch = [Record(topic, partition, r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in stored]
            if batch:
                yield (topic, partition), batch

    def bounds(self, partitions: Iterable[Partition]) -> dict[Partition, tuple[int, int]]:
        with self.shared.use() as cluster:
            return {(t, p): (cluster.log(t, p).log_start, cluster.log(t, p).high_water) for t, p in partitions}

    def committed(self, group: str, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        with self.shared.use() as cluster:
            return {tp: cluster.groups.committed(group, tp) for tp in partitions}

    def release(self) -> None:
        """Nothing is kept between reads."""

    def close(self) -> None:
        """Nothing to release."""


class SimClients(ClientFactory):
    """The :class:`~kmq.client.parts.ClientFactory` of a :class:`SharedCluster`: what
    :class:`~kmq.consumer.consumer.KmqConsumer` and :class:`tracker.service.Tracker` are given
    by :class:`~kmq.testing.queue.TestQueue`. It keeps the consumers it built (``consumers``)."""

    def __init__(self, shared: SharedCluster) -> None:
        self.shared = shared
        self.consumers: list[SharedConsumer] = []
        self._names = itertools.count(1)  # clients are built on several threads (kmq.aio builds on one of its own)

    def _name(self, kind: str) -> str:
        return f"{kind}-{next(self._names)}"

    def group_consumer(self, kafka: KafkaConfig, group_id: str, assignor: str, max_records: int,
                       **overrides: Any) -> GroupConsumerAdapter:
        c = SharedConsumer(self.shared, self._name(group_id), group_id, assignor.upper())
        self.consumers.append(c)
        return c

    def producer(self, kafka: KafkaConfig, timeout_s: float | None = None, settle_on_flush: bool = False,
                 **overrides: Any) -> Any:
        return SharedProducer(self.shared, self._name("producer"), overrides.get("max_request_size", 1_048_576))

    def open_log_reader(self, kafka: KafkaConfig, timeout_s: float = 10.0, fetch_wait_ms: int = 50,
                        **overrides: Any) -> LogReader:
        return SharedLogReader(self.shared, self._name("reader"), timeout_s)  # type: ignore[abstract]  # the tracker's reads only

    def require_aligned(self, kafka: KafkaConfig, queue: QueueConfig) -> Any:
        with self.shared.use() as cluster:
            counts = cluster.partition_counts()
        missing = [t for t in (queue.name, queue.markers_topic, queue.dlq_topic) if t not in counts]
        if missing:
            raise TopicMissing(f"the test queue has no topic {', '.join(missing)}: a TestQueue creates the topics "
                               f"of its own queue ({queue.name!r} is not it); pass this queue's name to TestQueue")
        return counts

    def max_message_bytes(self, kafka: KafkaConfig, names: list[str]) -> dict[str, int | None]:
        return dict.fromkeys(names, _MAX_MESSAGE_BYTES)
