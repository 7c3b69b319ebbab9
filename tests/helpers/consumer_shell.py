"""A KmqConsumer over fake parts: a fake group consumer, marker writer and client factory, so its
shell (fetcher, hand-over, close) runs without a broker."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from kmq.client.api import ClientCommitFailed, Delivery
from kmq.client.parts import ClientFactory
from kmq.config import Config
from kmq.consumer.ack_buffer import AckBuffer
from kmq.consumer.consumer import KmqConsumer
from kmq.telemetry.metrics import ConsumerMetrics

TOPIC = "orders"


def _done() -> Delivery:
    d = Delivery()
    d.success(None)
    return d


class FakeWriter:
    """What KmqConsumer uses of MarkerWriter; STARTs are acknowledged at once."""

    def __init__(self, cfg: Config, queue: str | None = None, metrics: ConsumerMetrics | None = None,
                 clients: object = None, group: str | None = None) -> None:
        self.queue = cfg.queue(queue or TOPIC, group)
        self.metrics = metrics or ConsumerMetrics()
        self.lock = threading.Lock()
        self.buffer = AckBuffer()
        self.flush_interval = 0.05
        self.owner = "test"
        self.flushed: list = []
        self.handed_off: list[dict[int, list[int]]] = []

    def count_received(self, n: int) -> None:
        self.metrics.messages.labels(self.queue.name, "received").inc(n)

    def send_starts(self, offsets: dict) -> list:
        return [(p, list(o), _done()) for p, o in offsets.items()]

    def wait_starts(self, futures: list, timeout: float | None = None) -> None:
        pass

    def flush_buffer(self) -> int:
        with self.lock:
            drained = self.buffer.drain()
        self.flushed.extend(m for _, m in drained.markers)
        return len(drained.markers)

    def replace_producer(self, why: str) -> bool:
        return True

    def hand_off(self, offsets: dict, timeout: float) -> set[int]:
        self.flush_buffer()
        self.handed_off.append({p: sorted(o) for p, o in offsets.items()})
        return set(offsets)

    def close(self, timeout: float | None = None) -> None:
        self.flush_buffer()


class FakeKafka:
    """A GroupConsumerAdapter over one partition holding ``records`` records."""

    client = "fake"

    def __init__(self, records: int) -> None:
        self.raw = None
        self._records = list(range(records))
        self.position_at = 0  # the next offset fetch() returns
        self._assigned: set[tuple[str, int]] = set()
        self._on_assigned: Callable[[set], None] | None = None
        self._idle = threading.Event()
        self.commits: list[dict] = []
        self.fail_commit = False
        self.hang_commits = False  # commit_async is never answered
        self.fail_pause = False
        self.closed = threading.Event()

    # the group side
    def subscribe(self, topics, on_assigned, on_revoked, commit_on_revoke=None, on_commit_failed=None) -> None:
        self._on_assigned = on_assigned

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = None, wake=None) -> list:
        if self._on_assigned is not None:  # the first poll joins the group (callbacks run inside polls)
            self._assigned = {(TOPIC, 0)}
            self._on_assigned(set(self._assigned))
            self._on_assigned = None
        batch = self._records[self.position_at:self.position_at + max_records]
        self.position_at += len(batch)
        if not batch:
            self._idle.wait(timeout)
        return [build(TOPIC, 0, o, None, b"v%d" % o, [], 0) for o in batch]

    def commit_async(self, offsets) -> Delivery:
        if self.hang_commits:
            return Delivery()
        self.commits.append(dict(offsets))
        return _done()

    def commit(self, offsets) -> None:
        if self.fail_commit:
            raise ClientCommitFailed("rebalance in progress", rebalanced=True)
        self.commits.append(dict(offsets))

    def member_id(self) -> str | None:
        return "member-1"

    def watch(self, stall_timeout, on_fatal, name) -> None:
        pass

    def unwatch(self) -> None:
        pass

    def recover_starved(self) -> None:
        pass

    # the plain consumer side
    def assignment(self) -> set[tuple[str, int]]:
        return set(self._assigned)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self.position_at = offset

    def pause(self, partitions) -> None:
        if self.fail_pause:
            raise RuntimeError("the client is failing")

    def resume(self, partitions) -> None:
        pass

    def highwater(self, topic: str, partition: int) -> int | None:
        return len(self._records)

    def close(self) -> None:
        self.closed.set()


class FakeClients(ClientFactory):
    """Hands KmqConsumer the test's group consumer and, for ``consumer.ordering: key``, log readers
    made by ``reader()``."""

    def __init__(self, kafka: Any, reader: Callable[[], Any] | None = None) -> None:
        self.kafka = kafka
        self.reader = reader

    def group_consumer(self, kafka, group_id, assignor, max_records, **overrides) -> Any:
        return self.kafka

    def open_log_reader(self, kafka, timeout_s=10.0, fetch_wait_ms=50, **overrides) -> Any:
        assert self.reader is not None, "this test gives the consumer no log reader"
        return self.reader()


@pytest.fixture
def consumer_on():
    made: list[KmqConsumer] = []

    def make(kafka: FakeKafka, hand_over: str = "committed", writer: type = FakeWriter, **kw) -> KmqConsumer:
        cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:9", "session_timeout": "1s"},
                                "queues": [{"name": TOPIC}], "consumer": {"group_id": "g", "hand_over": hand_over}})
        c = KmqConsumer(cfg, writer=writer(cfg, metrics=kw.pop("metrics", None)), clients=FakeClients(kafka), **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close(timeout=5)
