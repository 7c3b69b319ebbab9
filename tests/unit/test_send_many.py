"""Many sends at once through the client seam: one verdict per record, no future per record on confluent."""

from __future__ import annotations

import pytest

from kmq.client import UNDECIDED, OutRecord, send_many
from kmq.client.api import FutureBatch
from kmq.client.errors import ProduceFailed, RecordTooLarge


class Future:
    def __init__(self, done=True, error=None):
        self.is_done, self.error = done, error

    def get(self, timeout=None):
        if self.error is not None:
            raise self.error
        return "metadata"


class FutureProducer:
    """A producer with futures only (kafka-python's shape): send_many falls back to one future a record."""

    def __init__(self):
        self.sent = []

    def send(self, topic, value=None, key=None, partition=None, headers=None):
        self.sent.append((topic, partition, key, value, headers))
        if value == b"refused":
            raise ValueError("refused before it left")
        return Future(done=value != b"slow", error=RuntimeError("broker said no") if value == b"no" else None)


def test_a_producer_with_futures_gives_each_record_its_own_verdict():
    prod = FutureProducer()
    batch = send_many(prod, [OutRecord("t", 0, b"k", b"ok", [("h", b"1")]), OutRecord("t", 1, None, b"no"),
                             OutRecord("t", 0, None, b"slow"), OutRecord("t", 0, None, b"refused")])
    assert isinstance(batch, FutureBatch) and len(batch) == 4
    assert prod.sent[0] == ("t", 0, b"k", b"ok", [("h", b"1")])
    assert batch.verdict(0) is None
    assert isinstance(batch.verdict(1), RuntimeError)
    assert batch.verdict(2) is UNDECIDED
    assert isinstance(batch.verdict(3), ValueError)


@pytest.fixture
def confluent_producer():
    pytest.importorskip("confluent_kafka", reason="the confluent extra (kmq[confluent]) is not installed")
    from kmq.client.confluent.consumer import ConfluentProducer

    prod = ConfluentProducer({"bootstrap.servers": "127.0.0.1:9", "message.max.bytes": 2000,
                              "log_level": 0, "delivery.timeout.ms": 60_000})
    yield prod
    prod.close(0)


def test_confluent_verdicts_arrive_in_the_batch_and_a_refused_record_is_named_at_once(confluent_producer):
    batch = confluent_producer.send_many([OutRecord("t", 0, b"k", b"v", [("h", b"1")]),
                                          OutRecord("t", 0, None, b"x" * 5000)])
    assert batch.verdict(0) is UNDECIDED  # no broker: queued, not decided
    assert isinstance(batch.verdict(1), RecordTooLarge)
    confluent_producer.close(0)  # closing fails what it holds: every send is decided
    assert isinstance(batch.verdict(0), ProduceFailed)
