"""MarkerWriter.hand_off: the RENEW that hands given-back messages' leases to their next owner.
It returns within its timeout even when the producer blocks (it may run on a Kafka client's I/O
thread, inside a rebalance callback)."""

from __future__ import annotations

import threading

import pytest
from kmq.client.errors import ProduceFailed

from kmq.config import Config
from kmq.consumer import marker_sender
from kmq.consumer.writer import MarkerWriter
from kmq.core.markers import Renew, decode


class Answer:
    """A send's future, answered by the test (the parts of kafka-python's the sender uses)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: Exception | None = None
        self.callbacks: list = []

    def add_both(self, fn, *args) -> None:
        self.callbacks.append((fn, args))

    def add_callback(self, fn, *args) -> None:
        self.callbacks.append((fn, args))

    def add_errback(self, fn, *args) -> None:
        pass

    def get(self, timeout: float | None = None) -> None:
        if not self.done.wait(timeout):
            raise ProduceFailed("no answer")


class Producer:
    def __init__(self, answer: bool, block: threading.Event | None = None) -> None:
        self.answer, self.block, self.sent = answer, block, []

    def send(self, topic, value=None, key=None, partition=None) -> Answer:
        if self.block is not None:
            self.block.wait(10)  # a send waiting for metadata while the broker is away
        fut = Answer()
        self.sent.append((partition, decode(value)))
        if self.answer:
            fut.done.set()
        return fut

    def flush(self, timeout=None) -> None: ...

    def close(self, timeout=None) -> None: ...


@pytest.fixture
def writer_with(monkeypatch):
    made: list[MarkerWriter] = []

    def make(producer: Producer) -> MarkerWriter:
        monkeypatch.setattr(marker_sender.client_api, "producer", lambda *a, **k: producer)
        cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:1"},
                                "queues": [{"name": "orders", "lease": "30s"}],
                                "consumer": {"handoff_lease": "2m"}})
        w = MarkerWriter(cfg, check_topics=False)
        made.append(w)
        return w

    yield make
    for w in made:
        w._stop.set()


def test_one_renew_per_partition_with_the_hand_off_lease_acknowledged(writer_with):
    producer = Producer(answer=True)
    w = writer_with(producer)
    assert w.hand_off({0: [5, 6, 7], 2: [9]}, timeout=5) == {0, 2}
    assert [(p, type(m), [(r.first, r.count) for r in m.ranges], m.lease_ms) for p, m in producer.sent] == [
        (0, Renew, [(5, 3)], 120_000), (2, Renew, [(9, 1)], 120_000)]


def test_a_blocked_producer_does_not_hold_the_caller_past_its_timeout(writer_with):
    block = threading.Event()
    producer = Producer(answer=True, block=block)
    w = writer_with(producer)
    try:
        assert w.hand_off({0: [1]}, timeout=0.2) == set()
        assert producer.sent == []  # it returned while the send was still blocked
    finally:
        block.set()
