"""A transactional producer on the queue topic, end to end: committed, aborted, and open past a
lease end; written by kafka-python and by confluent-kafka; worked by a ``KmqConsumer`` on either
client (kafka-python reads ``read_uncommitted``, librdkafka ``read_committed``) beside a real tracker.

What each case must show (docs/protocol.md, "Transactions on the queue topic"): every committed
record is acked, none is lost or dead-lettered, no copy is made of a record acked in time, and
the records of an aborted transaction reach a worker only if it reads uncommitted; a record of an
open transaction left unsettled past its lease is copied (the tracker reads uncommitted)."""

from __future__ import annotations

import time
import uuid

import pytest

from kmq import KmqConsumer
from tests.conftest import KAFKA_CLIENTS
from tests.helpers.kafka import APP_RECORD, produce, wait_until
from tests.integration.tracker_util import metric, running_tracker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUEUE = {"lease": "2s", "max_deliveries": 3, "backoff": {"initial": "200ms", "max": "1s", "multiplier": 2.0}}
TX = 5  # records in the transaction


class TransactionalProducer:
    """One transaction on ``topic`` partition 0 by either client's transactional producer."""

    def __init__(self, client: str, bootstrap: str) -> None:
        self.client = client
        tid = f"kmq-test-{uuid.uuid4().hex[:8]}"
        if client == "confluent":
            from confluent_kafka import Producer

            self._p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
            self._p.init_transactions(30)
        else:
            from kafka import KafkaProducer

            self._p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
            self._p.init_transactions()
        self._p.begin_transaction()

    def send(self, topic: str, keys: list[bytes]) -> None:
        for k in keys:
            if self.client == "confluent":
                self._p.produce(topic, key=k, value=b"tx-" + k, partition=0)
            else:
                self._p.send(topic, key=k, value=b"tx-" + k, partition=0)
        self._p.flush()  # in the log, the transaction still open

    def commit(self) -> None:
        self._p.commit_transaction()

    def abort(self) -> None:
        self._p.abort_transaction()

    def close(self) -> None:
        if self.client == "kafka-python":
            self._p.close(timeout=5)


def _work(consumer: KmqConsumer, acked: dict[bytes, int], until, stuck: bytes | None = None) -> None:
    """Ack everything the consumer hands over until ``until()`` holds (30 s at most), except the
    first delivery of ``stuck``: left unsettled, as by a handler that hangs, for its lease to end."""
    deadline = time.monotonic() + 30
    while not until():
        assert time.monotonic() < deadline, f"timed out; acked so far: {sorted(acked)}"
        for msg in consumer.poll(timeout=0.2):
            if msg.key == stuck and msg.delivery_count == 1:
                continue
            acked[msg.key] = acked.get(msg.key, 0) + 1
            msg.ack()


@pytest.mark.parametrize("outcome", ["committed", "aborted", "open past a lease"])
@pytest.mark.parametrize("producer_client", KAFKA_CLIENTS)
def test_a_transaction_on_the_queue_topic_loses_nothing(bootstrap, queue_topics, kafka_client, producer_client,
                                                         outcome):
    cfg, q = queue_topics(1, queue=QUEUE, tracker={"tick": "50ms"}, kafka={"client": kafka_client},
                          consumer={"ack_flush_interval": "50ms", "auto_renew": False})
    reads_uncommitted = kafka_client == "kafka-python"
    produce(bootstrap, q.name, 3, **APP_RECORD)  # k0..k2, before the transaction
    tx_keys = [b"t%d" % i for i in range(TX)]
    tx = TransactionalProducer(producer_client, bootstrap)
    try:
        tx.send(q.name, tx_keys)
        if outcome == "committed":
            tx.commit()
        elif outcome == "aborted":
            tx.abort()
        after = [b"a%d" % i for i in range(3)]
        from kafka import KafkaProducer

        plain = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        for k in after:
            plain.send(q.name, key=k, value=b"v", partition=0).get(10)
        plain.close()
        before = [b"k%d" % i for i in range(3)]
        acked: dict[bytes, int] = {}
        with running_tracker(cfg) as t:
            consumer = KmqConsumer(cfg, queue=q.name, batch_size=50)
            try:
                stuck = None
                if outcome == "open past a lease":
                    # A read_committed worker stops at the last stable offset: the open transaction and
                    # everything after it wait; an uncommitted reader is handed all of it at once, and
                    # one record of the open transaction hangs past its lease: the tracker, which must
                    # read it although it is not committed, copies it.
                    stuck = tx_keys[0] if reads_uncommitted else None
                    seen = set(before) | (set(tx_keys) | set(after) if reads_uncommitted else set())
                    _work(consumer, acked, lambda: seen <= set(acked), stuck)
                    lease_end = time.monotonic() + 2 * 2.0
                    _work(consumer, acked, lambda: time.monotonic() > lease_end, stuck)
                    if not reads_uncommitted:
                        assert set(acked) == set(before), "a read_committed worker was handed records past the LSO"
                    tx.commit()
                expect = set(before) | set(after) | (set(tx_keys) if outcome != "aborted" or reads_uncommitted
                                                     else set())
                _work(consumer, acked, lambda: expect <= set(acked), stuck)
                wait_until(lambda: metric(t.http_port, "kmq_tracker_in_flight", queue=q.name) == 0, 15,
                           what="every START ended")
                if outcome == "aborted" and not reads_uncommitted:
                    assert not set(acked) & set(tx_keys), "a read_committed worker was handed aborted records"
                assert set(acked) == expect
                assert metric(t.http_port, "kmq_tracker_dead_lettered_total", queue=q.name) == 0
                assert metric(t.http_port, "kmq_tracker_missing_offsets_total", queue=q.name) == 0
                assert metric(t.http_port, "kmq_tracker_redelivered_total", queue=q.name) == (1 if stuck else 0)
                assert all(n == 1 for n in acked.values()), acked
            finally:
                consumer.close()
    finally:
        tx.close()
