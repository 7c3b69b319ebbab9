"""``KmqConsumer.run(handler, reject_on=...)`` on the real broker with a real tracker: an exception
of ``reject_on`` dead-letters the message (reason ``"Type: text"``), any other exception nacks it
with the queue's backoff and it comes again, a return acks (kmq.core.outcome, as the asyncio
run() and ``@kmq.marked``)."""

from __future__ import annotations

import threading

import pytest

from kmq.consumer.consumer import KmqConsumer
from kmq.core.markers import End, Nack, Reject
from kmq.core.message import HEADER_DLQ_ERROR, HEADER_DLQ_REASON
from tests.helpers.kafka import produce, read_all, wait_until
from tests.helpers.workers import markers_by_partition
from tests.integration.tracker_util import running_tracker

pytestmark = pytest.mark.integration

QUEUE = {"lease": "5s", "max_deliveries": 3, "backoff": {"initial": "300ms", "max": "2s", "multiplier": 2.0}}


class Poison(ValueError):
    pass


def covered(markers: list, kind: type) -> dict[int, object]:
    return {o: m for m in markers if isinstance(m, kind) for r in m.ranges for o in r.offsets()}


def test_run_dead_letters_reject_on_exceptions_and_nacks_the_others(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, queue=QUEUE, consumer={"ack_flush_interval": "50ms"})
    produce(cfg, q.name, 4, partition=None)
    seen: list[tuple[bytes, int]] = []
    errors: list[BaseException] = []

    def handle(msg) -> None:
        seen.append((msg.value, msg.delivery_count))
        if msg.value == b"m1" and msg.delivery_count == 1:
            raise RuntimeError("db down")
        if msg.value == b"m2":
            raise Poison("no schema")

    def run(consumer: KmqConsumer) -> None:
        try:
            consumer.run(handle, workers=2, reject_on=Poison)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    def no_error(cond):
        if errors:
            raise errors[0]
        return cond()

    with running_tracker(cfg), KmqConsumer(cfg, queue=q.name) as consumer:
        runner = threading.Thread(target=run, args=(consumer,), daemon=True)
        runner.start()
        try:
            dlq = wait_until(lambda: no_error(lambda: read_all(bootstrap, q.dlq_topic, timeout=2)), 30,
                             what="the rejected message in the DLQ")
            wait_until(lambda: no_error(lambda: (b"m1", 2) in seen), 30, what="m1 again after its nack")
        finally:
            consumer.stop()
            runner.join(30)
    assert not errors and not runner.is_alive()
    assert [r.value for r in dlq] == [b"m2"]
    headers = dict(dlq[0].headers)
    assert (headers[HEADER_DLQ_REASON], headers[HEADER_DLQ_ERROR]) == (b"rejected", b"Poison: no schema")
    markers = markers_by_partition(bootstrap, q.markers_topic)[0]
    assert covered(markers, Reject)[2].reason == "Poison: no schema"
    assert covered(markers, Nack)[1].delay_ms == 300  # backoff.delay(1)
    assert {0, 3} <= set(covered(markers, End))
