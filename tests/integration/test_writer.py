"""MarkerWriter and @kmq.marked around a user's own kafka-python loop."""

from __future__ import annotations

import textwrap

import pytest

import kmq
from kmq.client.kafka_python import clients
from kmq.core.errors import MessageAlreadySettled
from kmq.core.markers import End, Nack, Reject, Renew
from tests.helpers.kafka import produce, wait_for_assignment
from tests.helpers.workers import check_adoption, markers_by_partition

pytestmark = pytest.mark.integration

ORIGINAL = textwrap.dedent('''
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=1000)

    def handle(record):
        handled.append((record.partition, record.offset))

    while len(handled) < n:
        batch = consumer.poll(timeout_ms=500)
        for tp, records in batch.items():
            for record in records:
                handle(record)
        consumer.commit()
    consumer.close()
''')

WITH_KMQ = textwrap.dedent('''
    from kafka import KafkaConsumer
    import kmq
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=1000)
    writer = kmq.MarkerWriter(cfg, queue=topic, consumer=consumer)

    @kmq.marked(writer)
    def handle(record):
        handled.append((record.partition, record.offset))

    while len(handled) < n:
        batch = consumer.poll(timeout_ms=500)
        writer.start(batch)
        for tp, records in batch.items():
            for record in records:
                handle(record)
        consumer.commit()
    consumer.close()
    writer.close()
''')


# kafka_client: of the marker producer under the user's kafka-python loop (tests/integration/test_writer_confluent.py
# has the confluent-kafka loop).
def test_an_existing_loop_adopts_kmq_with_at_most_five_changed_lines(queue_topics, bootstrap, kafka_client):
    cfg, q = queue_topics(partitions=2, kafka={"client": kafka_client})
    check_adoption(cfg, q, ORIGINAL, WITH_KMQ)


def test_marked_acks_nacks_with_backoff_and_rejects_by_exception_class(queue_topics, bootstrap, kafka_client):
    cfg, q = queue_topics(partitions=1, queue={"backoff": {"initial": "3s"}}, kafka={"client": kafka_client})
    produce(cfg, q.name, 6, values=b"v%d", partitions=1)
    consumer = clients.consumer(cfg.kafka, q.name, group_id=cfg.consumer.group_id)  # kafka-python, either producer

    class Poison(Exception):
        pass

    writer = kmq.MarkerWriter(cfg, queue=q.name, consumer=consumer)

    @kmq.marked(writer, reject_on=Poison)
    def handle(record):
        if record.offset in (1, 2):
            raise RuntimeError("transient")
        if record.offset == 3:
            raise Poison("unparseable")
        if record.offset == 4:
            writer.renew(record, lease=45.0)
            writer.flush_buffer()  # written before the ack, so it is not folded into it
        return record.offset

    try:
        wait_for_assignment(consumer)
        results = []
        while len(results) < 6:
            for rec in writer.start(consumer.poll(timeout_ms=500)):
                results.append(handle(rec))
        assert results == [0, None, None, None, 4, 5]
        with pytest.raises(MessageAlreadySettled):
            writer.ack(rec)  # offset 5 was acked by the decorator
    finally:
        consumer.close()
        writer.close()
    markers = markers_by_partition(bootstrap, q.markers_topic)[0]
    assert [(tuple(r), m.delay_ms) for m in markers if isinstance(m, Nack) for r in m.ranges] == [((1, 2), 3000)]
    rejects = [m for m in markers if isinstance(m, Reject)]
    assert len(rejects) == 1 and rejects[0].ranges[0] == (3, 1) and rejects[0].reason == "Poison: unparseable"
    assert {o for m in markers if isinstance(m, End) for r in m.ranges for o in r.offsets()} == {0, 4, 5}
    assert any(isinstance(m, Renew) and m.lease_ms == 45000 for m in markers)
