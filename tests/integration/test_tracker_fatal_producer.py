"""The tracker's copy producer in a fatal state, made fatal for real by the broker (Apache Kafka).

librdkafka raises a fatal error when its idempotent producer can no longer keep a
guarantee. The one such error a test can provoke on demand with a real broker and
no fault injection: with ``enable.gapless.guarantee`` (a librdkafka setting; the
tracker's own producer does not set it), a batch the broker refuses for good (a
copy larger than the queue's ``max.message.bytes``, refused with MESSAGE_TOO_LARGE)
is fatal (``_GAPLESS_GUARANTEE``). From then on the producer sends nothing: every
``produce`` fails with ``_FATAL``. confluent-kafka offers no other way (no
``rd_kafka_test_fatal_error``, no mock-cluster error injection).

The redeliverer (the tracker's I/O shell: reads the queue log, produces copies and
dead letters, writes CLOSED markers) runs on the real log reader and real producers
against the broker; only the service loop around it is left out, so the test picks
which offsets are due when.
"""

from __future__ import annotations

import time

import pytest

from kmq import client as client_api
from kmq.core.lease_state import PartitionState
from kmq.core.markers import Closed, Outcome, Start, decode
from kmq.telemetry.metrics import TrackerMetrics
from tests.helpers.kafka import produce_records, read_all, set_max_message_bytes, wait_until
from tracker.redeliver import Redeliverer, copy_producer, delivery_timeout_s, send_wait_s

pytestmark = pytest.mark.integration

pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")

QUEUE = {"lease": "1s", "max_deliveries": 3, "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0}}
QUEUE_LIMIT = 20_000  # the queue's max.message.bytes, lowered after the originals were written
PRODUCER_LIMIT = 1_048_576  # so the large copy reaches the broker, which refuses it


def gapless_copy_producer(kafka):
    """The tracker's copy producer (:func:`copy_producer`'s settings) with librdkafka's
    ``enable.gapless.guarantee``: a record the broker refuses for good turns it fatal."""
    from dataclasses import replace

    # librdkafka's own property goes where a user's would: the kafka.confluent pass-through.
    gapless = replace(kafka, confluent={**kafka.confluent, "enable.gapless.guarantee": True})
    return client_api.producer(gapless, settle_on_flush=True, max_request_size=PRODUCER_LIMIT,
                               request_timeout=kafka.connect_timeout, delivery_timeout=delivery_timeout_s(kafka))


def test_a_copy_producer_in_a_fatal_state_is_replaced_and_nothing_it_did_not_acknowledge_is_closed(
        bootstrap, queue_topics, skip_on_tansu, caplog):
    skip_on_tansu("no max.message.bytes: tansu refuses no record, so no producer turns fatal")
    cfg, q = queue_topics(1, queue=QUEUE, kafka={"client": "confluent"})
    originals = [{"key": b"big", "value": b"x" * (3 * QUEUE_LIMIT)}] + \
                [{"key": b"k%d" % i, "value": b"v%d" % i} for i in range(1, 4)]
    assert produce_records(bootstrap, q.name, originals) == [0, 1, 2, 3]
    set_max_message_bytes(bootstrap, QUEUE_LIMIT, q.name)

    kafka, metrics = cfg.kafka, TrackerMetrics()
    first, made = gapless_copy_producer(cfg.kafka), []

    def new_producer(codec):
        made.append(copy_producer(kafka, PRODUCER_LIMIT, codec))
        return made[-1]

    reader = client_api.open_log_reader(kafka)
    red = Redeliverer(first, reader, metrics, send_timeout_s=send_wait_s(kafka), max_request_size=PRODUCER_LIMIT,
                      new_producer=new_producer, smallest_limit=QUEUE_LIMIT)  # the limit a tracker reads at start
    st = PartitionState(q.backoff.delay, q.max_deliveries)
    started = int(time.time() * 1000) - 10_000
    st.apply(Start([(0, 1)], lease_ms=1000, owner="w"), 0, started)  # the large record's lease ran out first
    st.apply(Start([(1, 3)], lease_ms=1000, owner="w"), 1, started + 1)
    try:
        # The large record's copy alone: the broker refuses it, and the producer turns fatal.
        red.process(q, 0, st, st.due(int(time.time() * 1000), limit=1))
        wait_until(lambda: first.fatal is not None, 10, what="the producer's fatal error")
        assert "_GAPLESS_GUARANTEE" in str(first.fatal)

        def served() -> bool:
            items = st.due(int(time.time() * 1000))
            if items:
                red.process(q, 0, st, items)
            return st.in_flight == 0

        wait_until(served, 60, interval=0.1, what="every message closed after the producer was replaced")
        assert metrics.registry.get_sample_value("kmq_tracker_producer_replacements_total", {"reason": "fatal"}) == 1
        assert len(made) == 1 and "replacing the tracker's producer: it reported a fatal error" in caplog.text

        # The ordinary messages were copied once each on the new producer; the large one, which no
        # copy of the queue can hold, went to the DLQ with its payload.
        copies = read_all(bootstrap, q.name, expect=7)[4:]
        assert sorted(c.key for c in copies) == [b"k1", b"k2", b"k3"]
        dead = read_all(bootstrap, q.dlq_topic, expect=1)
        assert [(d.key, len(d.value)) for d in dead] == [(b"big", 3 * QUEUE_LIMIT)]
        closed = [decode(r.value) for r in read_all(bootstrap, q.markers_topic)]
        assert sorted((m.ranges[0].first, m.outcome) for m in closed if isinstance(m, Closed)) == \
            [(0, Outcome.DEAD_LETTERED), (1, Outcome.REDELIVERED)]
        assert [m.ranges for m in closed if isinstance(m, Closed) and m.outcome is Outcome.REDELIVERED] == \
            [Closed([(1, 3)], Outcome.REDELIVERED).ranges]
    finally:
        red.close()
        client_api.close_producer(first)  # closed already by the replacement: a no-op then
        reader.close()
