"""The implementations of the client seam that one contract suite runs against, behind one interface.

* :class:`SimSeam`: the simulated cluster (:mod:`kmq.dev.sim`), in simulated time: waits
  advance its clock, so the whole suite runs in milliseconds, without a broker.
* :class:`KafkaSeam`: kafka-python or confluent-kafka, through kmq's own factory
  (:func:`kmq.client.group_consumer`, :func:`kmq.client.producer`), on the test broker.

A test asks the seam for topics, a producer, readers (assigned, no group) and
group members, and waits through :meth:`drive`, which polls members until a
condition holds: round-robin on one thread for the simulation, one thread per
member on a real broker (kafka-python completes a cooperative rebalance only
while every member polls, as workers do).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable, Iterable

from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import NewTopic

from kmq.client import Record, adapt_consumer, close_producer, group_consumer, producer
from kmq.client.kafka_python import clients
from kmq.dev.sim import SimCluster, SimConsumer, SimProducer
from tests.helpers.workers import committed

__all__ = ["SimSeam", "KafkaSeam", "TP", "offset_of"]

TP = tuple[str, int]
COOPERATIVE = "COOPERATIVE-STICKY"
SIM_DEADLINE_S = 300.0  # simulated seconds a drive may take
REAL_DEADLINE_S = 60.0


def offset_of(metadata: Any) -> int:
    """The offset in a send's metadata: kafka-python's ``RecordMetadata.offset`` or confluent's
    ``(topic, partition, offset)`` tuple (the simulator's is both)."""
    offset = getattr(metadata, "offset", None)
    return offset if isinstance(offset, int) else metadata[2]


class Member:
    """A group member under test with what its rebalance callbacks reported (non-empty sets only)."""

    def __init__(self, name: str, adapter: Any) -> None:
        self.name = name
        self.adapter = adapter
        self.events: list[tuple[str, frozenset]] = []  # ("+", assigned) or ("-", revoked)

    def assigned(self, parts: set) -> None:
        if parts:
            self.events.append(("+", frozenset(parts)))

    def revoked(self, parts: set) -> None:
        if parts:
            self.events.append(("-", frozenset(parts)))

    def revoked_all(self) -> set:
        return {tp for kind, parts in self.events if kind == "-" for tp in parts}


class _Seam:
    kind = ""
    is_tansu = False

    def __init__(self) -> None:
        self._clients: list[Any] = []

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    def member(self, group: str, topic: str, name: str) -> Member:
        m = Member(name, self._group_consumer(group, name))
        m.adapter.subscribe([topic], m.assigned, m.revoked)
        return m

    def drive(self, adapters: Iterable[Any], until: Callable[[], bool], what: str) -> dict[Any, list[Record]]:
        raise NotImplementedError

    def fetch_until(self, adapter: Any, count: int, what: str = "records") -> list[Record]:
        """Records of ``adapter`` until ``count`` arrived (fails past the deadline)."""
        got = self.drive([adapter], lambda: False, what, stop_at={adapter: count})
        return got[adapter]

    def close_client(self, client: Any) -> None:
        if client in self._clients:
            self._clients.remove(client)
        self._close(client)

    def close(self) -> None:
        for c in reversed(self._clients):
            try:
                self._close(c)
            except Exception:  # noqa: BLE001 - closing what a failed test left behind
                pass
        self._clients.clear()

    def _close(self, client: Any) -> None:
        client.close()


class SimSeam(_Seam):
    """The simulated cluster."""

    kind = "sim"

    def __init__(self) -> None:
        super().__init__()
        self.cluster = SimCluster(seed=1, session_timeout=6.0)

    def topic(self, partitions: int) -> str:
        name = self.unique("t")
        self.cluster.create_topic(name, partitions)
        return name

    def producer(self) -> Any:
        p = SimProducer(self.cluster)
        self._clients.append(p)
        return p

    def produce_any(self, topic: str, records: list[dict]) -> None:
        """Records Kafka accepts whatever kafka-python's producer refuses (as librdkafka sends them)."""
        p = SimProducer(self.cluster, "any", refuses_like="confluent", max_request_size=5_000_000)
        futures = [p.send(topic, partition=0, **r) for r in records]
        p.flush(10)
        assert [offset_of(f.get(0)) for f in futures] == list(range(len(records)))
        p.close()

    def reader(self, partitions: list[TP]) -> Any:
        c = SimConsumer(self.cluster, self.unique("reader"))
        c.assign(partitions)
        self._clients.append(c)
        return c

    def _group_consumer(self, group: str, name: str) -> Any:
        c = SimConsumer(self.cluster, name, group_id=group, assignor=COOPERATIVE)
        self._clients.append(c)
        return c

    def committed(self, group: str, topic: str) -> dict[int, int]:
        return self.cluster.committed(group, topic)

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        self.cluster.delete_records(topic, partition, before)

    def drive(self, adapters, until, what, stop_at=None):
        adapters = list(adapters)
        got: dict[Any, list[Record]] = {a: [] for a in adapters}
        deadline = self.cluster.t() + SIM_DEADLINE_S

        def done() -> bool:
            return until() or bool(stop_at) and all(len(got[a]) >= n for a, n in stop_at.items())

        while not done():
            if self.cluster.t() > deadline:
                raise AssertionError(f"simulated {SIM_DEADLINE_S:g}s passed waiting for {what}")
            for a in adapters:
                got[a].extend(a.fetch(0.2, 100, Record))
        return got


class KafkaSeam(_Seam):
    """kafka-python or confluent-kafka on the test broker, built by kmq's client factory."""

    def __init__(self, kind: str, make_config: Callable[..., Any], broker: Any) -> None:
        super().__init__()
        self.kind = kind
        self.is_tansu = broker.is_tansu
        self.bootstrap = broker.bootstrap
        self.cfg = make_config(kafka={"client": kind})

    def topic(self, partitions: int) -> str:
        name = self.unique("t")
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            # Records up to 5 MB, as the producers below send: Kafka refuses above 1 MiB by default.
            admin.create_topics([NewTopic(name, partitions, 1, topic_configs={"max.message.bytes": "5000000"})])
        finally:
            admin.close()
        return name

    def producer(self) -> Any:
        p = producer(self.cfg.kafka)
        self._clients.append(p)
        return p

    def produce_any(self, topic: str, records: list[dict]) -> None:
        import confluent_kafka

        p = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "message.max.bytes": 5_000_000,
                                      "enable.idempotence": True})
        offsets: list[int] = []

        def done(err, msg):
            assert err is None, err
            offsets.append(msg.offset())

        for r in records:
            p.produce(topic, partition=0, on_delivery=done, **r)
        assert p.flush(30) == 0
        assert offsets == list(range(len(records)))

    def reader(self, partitions: list[TP]) -> Any:
        if self.kind == "confluent":
            from kmq.client.confluent.consumer import consumer

            c = consumer(self.cfg.kafka)
            c.assign(partitions)
        else:
            raw = clients.consumer(self.cfg.kafka)
            raw.assign([TopicPartition(t, p) for t, p in partitions])
            c = adapt_consumer(raw)
        self._clients.append(c)
        return c

    def _group_consumer(self, group: str, name: str) -> Any:
        c = group_consumer(self.cfg.kafka, group, COOPERATIVE, 100)
        self._clients.append(c)
        return c

    def _close(self, client: Any) -> None:
        if hasattr(client, "send"):
            close_producer(client, timeout=5)
        else:
            client.close()

    def committed(self, group: str, topic: str) -> dict[int, int]:
        return committed(self.bootstrap, group, topic)

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.delete_records({TopicPartition(topic, partition): before})
        finally:
            admin.close()

    def drive(self, adapters, until, what, stop_at=None):
        """One polling thread per adapter until ``until()`` (or each ``stop_at`` count) holds.

        Neither client may be used from two threads at once (a confluent consumer asked for its
        high-water mark while it consumes on another thread was seen to hang), so each adapter's
        fetch holds its lock, and the condition is checked holding them all."""
        adapters = list(adapters)
        got: dict[Any, list[Record]] = {a: [] for a in adapters}
        locks = [threading.Lock() for _ in adapters]
        stop = threading.Event()
        errors: list[BaseException] = []

        def poll(a: Any, lock: threading.Lock) -> None:
            try:
                while not stop.is_set():
                    with lock:
                        got[a].extend(a.fetch(0.2, 100, Record))
            except BaseException as exc:  # noqa: BLE001 - re-raised by the test's thread
                errors.append(exc)

        def done() -> bool:
            for lock in locks:
                lock.acquire()
            try:
                return until() or bool(stop_at) and all(len(got[a]) >= n for a, n in stop_at.items())
            finally:
                for lock in locks:
                    lock.release()

        threads = [threading.Thread(target=poll, args=(a, lock), daemon=True) for a, lock in zip(adapters, locks)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + REAL_DEADLINE_S
            while not done() and not errors:
                if time.monotonic() > deadline:
                    raise AssertionError(f"timed out after {REAL_DEADLINE_S:g}s waiting for {what}")
                time.sleep(0.05)
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        if errors:
            raise errors[0]
        return got
