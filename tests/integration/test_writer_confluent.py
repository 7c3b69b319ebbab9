"""MarkerWriter and @kmq.marked around a user's own confluent-kafka loop, and the
marker producer on either client (``kafka.client``)."""

from __future__ import annotations

import textwrap

import pytest

import kmq
from kmq.core.errors import MarkerWriteError, MessageAlreadySettled
from kmq.core.markers import End, Nack, Reject
from tests.helpers.kafka import produce, wait_until
from tests.helpers.workers import check_adoption, committed, markers_by_partition

confluent_kafka = pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")

pytestmark = pytest.mark.integration

# session.timeout.ms 6000: librdkafka's default 45 s holds a join on tansu for ~23 s (valid on real Kafka too).
ORIGINAL = textwrap.dedent('''
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])

    def handle(msg):
        handled.append((msg.partition(), msg.offset()))

    while len(handled) < n:
        msgs = consumer.consume(500, timeout=0.5)
        for msg in msgs:
            handle(msg)
        consumer.commit(asynchronous=True)
    consumer.close()
''')

WITH_KMQ = textwrap.dedent('''
    from confluent_kafka import Consumer
    import kmq
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    writer = kmq.MarkerWriter(cfg, queue=topic, consumer=consumer)

    @kmq.marked(writer)
    def handle(msg):
        handled.append((msg.partition(), msg.offset()))

    while len(handled) < n:
        msgs = consumer.consume(500, timeout=0.5)
        writer.start(msgs)
        for msg in msgs:
            handle(msg)
        consumer.commit(asynchronous=True)
    consumer.close()
    writer.close()
''')


def test_a_confluent_loop_adopts_kmq_with_at_most_five_changed_lines(queue_topics, bootstrap, kafka_client):
    cfg, q = queue_topics(partitions=2, kafka={"client": kafka_client})  # client of the marker producer
    check_adoption(cfg, q, ORIGINAL, WITH_KMQ)


def _confluent_consumer(cfg, topic):
    c = confluent_kafka.Consumer({
        "bootstrap.servers": cfg.kafka.bootstrap_servers, "group.id": cfg.consumer.group_id,
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
    })
    c.subscribe([topic])
    return c


def test_marked_on_confluent_messages_acks_nacks_rejects_and_commits_before_handing_over(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, queue={"backoff": {"initial": "3s"}}, kafka={"client": "confluent"})
    produce(cfg, q.name, 6, values=b"v%d", partitions=1)
    consumer = _confluent_consumer(cfg, q.name)

    class Poison(Exception):
        pass

    writer = kmq.MarkerWriter(cfg, queue=q.name, consumer=consumer)
    seen_committed: list = []

    @kmq.marked(writer, reject_on=Poison)
    def handle(msg):
        seen_committed.append(committed(bootstrap, cfg.consumer.group_id, q.name).get(0, 0))
        if msg.offset() in (1, 2):
            raise RuntimeError("transient")
        if msg.offset() == 3:
            raise Poison("unparseable")
        return msg.offset()

    try:
        results = []
        while len(results) < 6:
            # poll() hands one Message (or None): start() takes that as well.
            for msg in writer.start(consumer.poll(0.5)):
                results.append(handle(msg))
        assert results == [0, None, None, None, 4, 5]
        # Each message was handed over only after its offset was committed.
        assert seen_committed == [1, 2, 3, 4, 5, 6]
        with pytest.raises(MessageAlreadySettled):
            writer.ack(msg)
        writer.flush()
    finally:
        consumer.close()
        writer.close()
    markers = markers_by_partition(bootstrap, q.markers_topic)[0]
    nacked = {(o, m.delay_ms) for m in markers if isinstance(m, Nack) for r in m.ranges for o in r.offsets()}
    assert nacked == {(1, 3000), (2, 3000)}
    rejects = [m for m in markers if isinstance(m, Reject)]
    assert len(rejects) == 1 and rejects[0].ranges[0] == (3, 1) and rejects[0].reason == "Poison: unparseable"
    assert {o for m in markers if isinstance(m, End) for r in m.ranges for o in r.offsets()} == {0, 4, 5}


def test_a_failed_start_rewinds_the_confluent_consumer_to_the_batch(queue_topics, bootstrap):
    """START not written -> nothing committed, and the next consume() returns the same batch."""
    cfg, q = queue_topics(partitions=1, kafka={"client": "confluent"})
    produce(cfg, q.name, 5, values=b"v%d", partitions=1)
    consumer = _confluent_consumer(cfg, q.name)
    writer = kmq.MarkerWriter(cfg, queue=q.name, consumer=consumer)
    try:
        first = wait_until(lambda: consumer.consume(100, timeout=0.5), 30, what="first batch")
        real_write = writer.write_starts

        def failing(offsets):
            raise MarkerWriteError("START not acknowledged (test)")

        writer.write_starts = failing
        with pytest.raises(MarkerWriteError):
            writer.start(first)
        writer.write_starts = real_write
        again = wait_until(lambda: writer.start(consumer.consume(100, timeout=0.5)), 30, what="batch again")
        assert [m.offset() for m in again][0] == first[0].offset()
        assert committed(bootstrap, cfg.consumer.group_id, q.name) == {0: again[-1].offset() + 1}
    finally:
        consumer.close()
        writer.close()
