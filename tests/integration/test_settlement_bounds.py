"""Settlement and header bounds on a live consumer (real broker, real Redis).

Bad nack/renew/reject arguments raise before anything is recorded and never
cost another message its ack; a delivery count of 10**6 goes through run()
and @kmq.marked without overflowing the backoff; a kmq-origin naming another
topic does not make IdempotencyGuard skip a record.
"""

from __future__ import annotations

import math
import time

import pytest
from kafka import KafkaConsumer

import kmq
from kmq.consumer.consumer import KmqConsumer
from kmq.core.errors import InvalidSettlement
from kmq.consumer.guard import IdempotencyGuard
from kmq.core.markers import End, Nack
from tests.conftest import unique
from tests.helpers.kafka import produce, wait_until
from tests.helpers.workers import markers_by_partition

pytestmark = pytest.mark.integration


def settled_offsets(bootstrap, topic, kind):
    ms = markers_by_partition(bootstrap, topic).get(0, [])
    return {o: m for m in ms if isinstance(m, kind) for r in m.ranges for o in r.offsets()}


def poll_n(consumer, n, timeout=30):
    got: list = []
    wait_until(lambda: got.extend(consumer.poll(timeout=0.5)) or len(got) >= n, timeout, what=f"{n} messages")
    return got


def test_bad_arguments_raise_before_settling_and_never_cost_other_acks(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, consumer={"ack_flush_interval": "50ms"})
    produce(cfg, q.name, 20)
    with KmqConsumer(cfg, queue=q.name) as consumer:
        msgs = poll_n(consumer, 20)
        bad, rest = msgs[0], msgs[1:]
        calls = [
            lambda: bad.nack(math.nan), lambda: bad.nack(math.inf), lambda: bad.nack(-1.0),
            lambda: bad.nack(5e6), lambda: bad.nack(10**400), lambda: bad.renew(math.nan),
            lambda: bad.renew(1e10), lambda: bad.renew(-3), lambda: bad.reject("x" * 70_000),
            lambda: bad.reject("\ud800"),
        ]
        for i, call in enumerate(calls):
            with pytest.raises(InvalidSettlement):
                call()
            rest[i].ack()  # interleaved with the bad calls: same flushes
        for m in rest[len(calls):]:
            m.ack()
        consumer.writer.flush(timeout=10)
        assert not bad.settled and consumer.in_flight() == {0: 1}  # its slot is still held, nothing leaked
        ended = settled_offsets(bootstrap, q.markers_topic, End)
        assert sorted(ended) == [m.offset for m in rest]  # every other ack was written
        bad.nack(0.25)  # and the message still settles correctly
        consumer.writer.flush(timeout=10)
        assert consumer.in_flight() == {}
    nacked = settled_offsets(bootstrap, q.markers_topic, Nack)
    assert list(nacked) == [bad.offset] and nacked[bad.offset].delay_ms == 250
    assert consumer.writer.failed_writes == 0


@pytest.mark.parametrize("count", [b"5000", b"1000000"])
def test_a_huge_delivery_count_goes_through_run_with_the_capped_backoff(queue_topics, bootstrap, count):
    cfg, q = queue_topics(partitions=1, queue={"backoff": {"initial": "1s", "max": "3s"}},
                          consumer={"ack_flush_interval": "50ms"})
    produce(cfg, q.name, values=[b"a", b"b", b"c"], headers=[("kmq-delivery-count", count)])
    consumer = KmqConsumer(cfg, queue=q.name)
    seen: list = []

    def failing(m):
        seen.append(m.delivery_count)
        if len(seen) == 3:
            consumer.stop()
        raise RuntimeError("handler failed")

    consumer.run(failing, workers=2)
    assert consumer.in_flight() == {}  # every message settled: no slot leaked
    consumer.close()
    assert seen == [int(count)] * 3
    nacked = settled_offsets(bootstrap, q.markers_topic, Nack)
    assert sorted(nacked) == [0, 1, 2] and {m.delay_ms for m in nacked.values()} == {3000}


def test_a_huge_delivery_count_goes_through_marked(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, queue={"backoff": {"initial": "1s", "max": "3s"}})
    produce(cfg, q.name, values=[b"a", b"b"], headers=[("kmq-delivery-count", b"1000000")])
    consumer = KafkaConsumer(q.name, bootstrap_servers=bootstrap, group_id=cfg.consumer.group_id,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=6000, heartbeat_interval_ms=1000)
    writer = kmq.MarkerWriter(cfg, queue=q.name, consumer=consumer)

    @kmq.marked(writer, reject_on=KeyError)
    def handle(record):
        raise (KeyError("é" * 40_000) if record.offset == 1 else RuntimeError("boom"))  # 80 kB reason: clipped

    handled = 0
    deadline = time.monotonic() + 30
    while handled < 2 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            writer.start(records)
            for r in records:
                assert handle(r) is None  # nothing escapes into the user's loop
                handled += 1
    writer.close()
    consumer.close()
    assert handled == 2
    ms = markers_by_partition(bootstrap, q.markers_topic)[0]
    nack = [m for m in ms if isinstance(m, Nack)]
    reject = [m for m in ms if type(m).__name__ == "Reject"]
    assert [(m.ranges[0].first, m.delay_ms) for m in nack] == [(0, 3000)]
    assert [m.ranges[0].first for m in reject] == [1] and len(reject[0].reason.encode()) <= 0xFFFF


@pytest.mark.redis
def test_an_origin_naming_another_topic_is_not_skipped_by_the_guard(queue_topics, bootstrap, redis_url):
    cfg, q = queue_topics(partitions=1, consumer={"ack_flush_interval": "50ms"})
    foreign = [("kmq-origin", b"payments/0/0"), ("kmq-delivery-count", b"2")]  # headers copied by Streams/Connect
    # Offsets 0 and 1 (unrelated to each other), then a real copy of offset 0.
    produce(cfg, q.name, values=[b"order 1", b"order 2", b"order 1"],
            headers=[foreign, foreign, [("kmq-origin", f"{q.name}/0/0".encode())]])
    guard = IdempotencyGuard(redis_url, ttl=60, prefix=unique("kmq-test") + ":")
    effects: list[str] = []
    consumer = KmqConsumer(cfg, queue=q.name)
    seen: list = []

    def counted(m):
        seen.append(m.offset)
        guard.wrap(lambda msg: effects.append(msg.origin))(m)
        if len(seen) == 3:
            consumer.stop()

    consumer.run(counted, workers=1)
    consumer.close()
    guard.close()
    assert effects == [f"{q.name}/0/0", f"{q.name}/0/1"]  # both foreign-headed records took effect
    assert guard.skipped == 1  # only the real copy of offset 0 was skipped
