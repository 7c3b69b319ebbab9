"""MarkerWriter around a user's kafka-python loop when the broker goes away.

A real broker (tansu with durable s3 storage on a local moto server) is
SIGKILLed and restarted on the same port:

* a START that fails leaves the user's consumer positioned at the batch, so
  catching ``MarkerWriteError`` and polling again skips nothing;
* acks made while the broker is down are retried (``consumer.marker_retry_budget``)
  and written after it returns, inside their leases, so the tracker has nothing
  to redeliver; the loop never crashes or stalls and nothing is lost.
"""

from __future__ import annotations

import threading
import time

import pytest
from kafka import KafkaConsumer, TopicPartition

import kmq
from kmq.config import Config
from kmq.dev.broker import DevBroker
from kmq.dev.kafka import KafkaCluster
from kmq.core.errors import MarkerWriteError
from kmq.core.markers import End, Start
from kmq.client.topics import ensure_topics
from kmq.consumer.writer import CommitError
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import own_broker, produce, read_all, wait_until
from tests.helpers.workers import committed

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.chaos]


@pytest.fixture
def durable_broker(tmp_path):
    broker = own_broker(tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def config(broker: DevBroker | KafkaCluster, client: str, **consumer) -> Config:
    """``client``: of the writer's marker producer (``kafka.client``); the user's loop stays kafka-python."""
    return Config.from_dict({
        # A short connect timeout: a START fails within seconds while the broker is down.
        "kafka": {"bootstrap_servers": broker.bootstrap, **TEST_GROUP_TIMING, "connect_timeout": "2s",
                  "client": client},
        "queues": [{"name": unique("q"), "lease": "5m"}],
        "consumer": {"group_id": unique("workers"), "ack_flush_interval": "50ms", **consumer},
    })


def user_consumer(cfg: Config) -> KafkaConsumer:
    return KafkaConsumer(
        cfg.queues[0].name, bootstrap_servers=cfg.kafka.bootstrap_servers, group_id=cfg.consumer.group_id,
        enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=1000,
        reconnect_backoff_max_ms=1000,
    )


def marker_offsets(bootstrap: str, topic: str) -> tuple[dict, dict]:
    """(offset -> START marker timestamp, offset -> END marker timestamp) for queue partition 0."""
    from kmq.core.markers import decode

    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for r in read_all(bootstrap, topic, timeout=20):
        m = decode(r.value)
        into = starts if isinstance(m, Start) else ends if isinstance(m, End) else None
        if into is not None:
            for rng in m.ranges:
                for o in rng.offsets():
                    into.setdefault(o, r.timestamp)
    return starts, ends


def test_a_failed_start_leaves_the_consumer_at_the_batch_and_polling_again_skips_nothing(durable_broker, kafka_client):
    cfg = config(durable_broker, kafka_client)
    q = cfg.queues[0]
    ensure_topics(cfg.kafka, q, 1)
    n = 30
    produce(cfg, q.name, values=[b"m%d" % i for i in range(n)])
    consumer = user_consumer(cfg)
    writer = kmq.MarkerWriter(cfg, queue=q.name, consumer=consumer)
    tp = TopicPartition(q.name, 0)
    try:
        first = wait_until(lambda: consumer.poll(timeout_ms=500, max_records=10).get(tp), 30, what="a first batch")
        assert [r.offset for r in first] == list(range(10))
        durable_broker.kill()  # a real START failure: nothing acknowledges the marker
        with pytest.raises(MarkerWriteError, match="START marker"):
            writer.start(first)
        assert consumer.position(tp) == 0  # back at the batch, not past it
        durable_broker.start()

        handled: list[int] = []
        errors: list[str] = []
        deadline = time.monotonic() + 90
        while len(handled) < n and time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500, max_records=10)
            try:
                records = writer.start(batch)
            except (MarkerWriteError, CommitError) as exc:  # retriable: poll again
                errors.append(type(exc).__name__)
                continue
            for r in records:
                handled.append(r.offset)
                writer.ack(r)
        writer.flush(timeout=10)
    finally:
        writer.close()
        consumer.close()
    assert handled[:10] == list(range(10))  # the failed batch came back first
    assert sorted(set(handled)) == list(range(n))
    starts, ends = marker_offsets(durable_broker.bootstrap, q.markers_topic)
    assert set(starts) == set(ends) == set(range(n))  # every record STARTed and acked
    assert committed(durable_broker.bootstrap, cfg.consumer.group_id, q.name) == {0: n}


def test_a_marker_writer_loop_rides_through_a_30s_broker_outage(durable_broker, kafka_client):
    cfg = config(durable_broker, kafka_client)
    q = cfg.queues[0]
    ensure_topics(cfg.kafka, q, 1)
    produce(cfg, q.name, values=[b"A%d" % i for i in range(100)] + [b"B%d" % i for i in range(50)])
    consumer = user_consumer(cfg)
    writer = kmq.MarkerWriter(cfg, queue=q.name, consumer=consumer)
    in_b = threading.Event()
    broker_down = threading.Event()
    stop = threading.Event()
    handled: dict[int, float] = {}
    failures: list[BaseException] = []

    @kmq.marked(writer)
    def handle(record):
        if record.value.startswith(b"B"):
            in_b.set()
            broker_down.wait(60)  # the B messages are acked while the broker is down
        handled[record.offset] = time.monotonic()

    def loop():  # the user's existing kafka-python loop, as in the README
        try:
            while not stop.is_set():
                batch = consumer.poll(timeout_ms=200)
                try:
                    records = writer.start(batch)
                except (MarkerWriteError, CommitError):
                    continue  # retriable: the consumer is back at the batch
                for r in records:
                    handle(r)
        except BaseException as exc:  # noqa: BLE001 - the test asserts there is none
            failures.append(exc)

    t = threading.Thread(target=loop, name="user-loop", daemon=True)
    t.start()
    try:
        wait_until(in_b.is_set, 60, what="the loop to reach the B messages")
        wait_until(lambda: len(handled) == 100, 30, what="the A messages handled")
        writer.flush(timeout=10)  # their ENDs acknowledged by Kafka before the outage
        durable_broker.kill()
        killed_at = time.time()
        broker_down.set()
        wait_until(lambda: len(handled) == 150, 30, what="the B messages handled during the outage")
        wait_until(lambda: writer.retrying >= 50, 30, what="their ENDs failing and kept for a retry")
        wait_until(lambda: time.time() - killed_at >= 30, 35, interval=0.5, what="a 30 s outage")
        assert t.is_alive() and not failures  # no crash
        assert writer.failed_writes == 0  # nothing given up inside the budget
        # "Written late" is measured from the moment the broker is started: it takes writes
        # before start() returns, and a retry sent a few seconds before it can still land.
        starting_at = time.time()
        durable_broker.start()
        restarted_at = time.time()
        produce(cfg, q.name, values=[b"C%d" % i for i in range(50)])
        wait_until(lambda: len(handled) == 200, 30, what="messages produced after the restart consumed")
        consumed_after = time.time() - restarted_at
        writer.flush(timeout=30)  # the outage's ENDs acknowledged
    finally:
        stop.set()
        broker_down.set()
        t.join(15)
        writer.close()
        consumer.close()
    assert not failures and not t.is_alive()
    assert consumed_after < 15, f"work resumed {consumed_after:.1f}s after the broker's return"
    starts, ends = marker_offsets(durable_broker.bootstrap, q.markers_topic)
    assert set(starts) == set(ends) == set(range(200))  # nothing lost, every message acked
    late = [o for o in range(100, 150)]
    # Retried, not the first attempts (those were made ~30 s earlier, just after the kill).
    assert all(ends[o] >= starting_at * 1000 - 5000 for o in late)  # written after the outage...
    lease_ms = int(q.lease * 1000)
    assert all(ends[o] < starts[o] + lease_ms for o in late)  # ...inside the lease: no redelivery for them
    assert writer.failed_writes == 0
    assert committed(durable_broker.bootstrap, cfg.consumer.group_id, q.name) == {0: 200}
    print(f"outage {restarted_at - killed_at:.0f}s: 50 acks written late, 0 given up; "
          f"new messages consumed {consumed_after:.1f}s after the restart")


def test_acks_sent_while_the_broker_dies_are_written_after_it_returns(durable_broker, kafka_client):
    """Acks keep coming while the broker is killed mid-write. kafka-python's idempotent
    producer then often waits forever for a new producer id, answering nothing (seen
    with 3.0.12); the writer notices the unanswered writes, replaces the producer and
    writes every END once the broker is back. On confluent the same kill must cost nothing either."""
    cfg = config(durable_broker, kafka_client)
    q = cfg.queues[0]
    ensure_topics(cfg.kafka, q, 1)
    n = 400
    produce(cfg, q.name, values=[b"m%d" % i for i in range(n)])
    consumer = user_consumer(cfg)
    writer = kmq.MarkerWriter(cfg, queue=q.name, consumer=consumer)
    try:
        records = []
        wait_until(lambda: records.extend(writer.start(consumer.poll(timeout_ms=500))) or len(records) >= n, 30,
                   what="every record started")
        consumer.close()  # the group is not needed any more; only marker writes cross the outage
        for r in records[:50]:
            writer.ack(r)
        writer.flush(timeout=10)
        killed = False
        for i, r in enumerate(records[50:250]):  # acks flowing (one flush every 50 ms) while the broker dies
            writer.ack(r)
            if i == 20:
                durable_broker.kill()
                killed = True
            time.sleep(0.01)  # pacing the simulated handler, not waiting on a condition
        assert killed
        killed_at = time.monotonic()
        wait_until(lambda: time.monotonic() - killed_at >= 10, 15, interval=0.5, what="a 10 s outage")
        durable_broker.start()
        for r in records[250:]:
            writer.ack(r)
        writer.flush(timeout=40)  # every END acknowledged, the outage's included
        assert writer.failed_writes == 0 and writer.retrying == 0
        replaced = writer.producer_replacements
    finally:
        writer.close()
    starts, ends = marker_offsets(durable_broker.bootstrap, q.markers_topic)
    assert set(ends) == set(range(n))
    print(f"acks through a broker kill: {n} ENDs written, 0 given up, producer replaced {replaced} time(s)")
