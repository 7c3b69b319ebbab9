"""An ack that can be awaited: its future resolves once Kafka acknowledged the END marker
covering it, on both clients and from asyncio; the END records stay batched."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kmq import KmqConsumer
from kmq.aio import AsyncKmqConsumer
from kmq.core.markers import End, decode
from kmq.core.ranges import OffsetRange
from tests.helpers.kafka import produce, read_all, wait_until

pytestmark = pytest.mark.integration

N = 20


def _ended(bootstrap: str, topic: str) -> tuple[set[int], int]:
    """Offsets covered by END records in the markers topic, and how many END records there are."""
    ends = [m for m in (decode(r.value) for r in read_all(bootstrap, topic)) if isinstance(m, End)]
    return {o for m in ends for r in m.ranges for o in OffsetRange(*r).offsets()}, len(ends)


def test_ack_with_response_resolves_once_its_end_is_in_the_markers_topic(bootstrap, queue_topics, kafka_client):
    # A long flush interval: the END waits for it (or a flush), so "resolved" cannot mean "buffered".
    cfg, q = queue_topics(1, kafka={"client": kafka_client}, consumer={"ack_flush_interval": "2s"})
    produce(bootstrap, q.name, N)
    got: list = []
    done = threading.Event()
    with KmqConsumer(cfg, queue=q.name) as consumer:
        wait_until(lambda: got.extend(consumer.poll(timeout=0.2)) or len(got) >= N, 30, what=f"{N} messages")
        futures = [m.ack_with_response() for m in got]
        futures[-1].add_done_callback(lambda f: done.set())
        assert not any(f.done() for f in futures)  # buffered, not written yet
        for f in futures:
            assert f.result(timeout=30) is None
        assert done.wait(5)
        ended, end_records = _ended(bootstrap, q.markers_topic)
        assert ended >= set(range(N))  # durable by the time the futures resolved
        assert end_records <= 2  # batched: a flush or two for twenty acks, not one record each


def test_an_awaited_ack_returns_once_its_end_is_written(bootstrap, queue_topics):
    cfg, q = queue_topics(1, consumer={"ack_flush_interval": "1s"})
    produce(bootstrap, q.name, 3)

    async def main() -> list:
        async with AsyncKmqConsumer(cfg, queue=q.name) as consumer:
            msgs = []
            async with asyncio.timeout(30):
                async for m in consumer:
                    msgs.append(m)
                    if len(msgs) == 3:
                        break
            await asyncio.wait_for(asyncio.gather(*(m.ack_with_response() for m in msgs)), 30)
            ended, _ = _ended(bootstrap, q.markers_topic)  # before close: close would flush anyway
            return [m.offset for m in msgs], ended

    offsets, ended = asyncio.run(main())
    assert set(offsets) <= ended
