"""MarkerWriter refuses an asyncio consumer (aiokafka) instead of never awaiting its commit."""

from __future__ import annotations

import asyncio

import pytest

import kmq
from kmq.core.errors import UnsupportedConsumer

aiokafka = pytest.importorskip("aiokafka", reason="aiokafka is in the dev extra; install kmq[dev]")

pytestmark = pytest.mark.integration


def test_an_aiokafka_consumer_is_refused_at_construction(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1)

    async def build():
        consumer = aiokafka.AIOKafkaConsumer(q.name, bootstrap_servers=bootstrap, group_id=cfg.consumer.group_id,
                                             enable_auto_commit=False)
        try:
            with pytest.raises(UnsupportedConsumer, match="asyncio consumer.*never await the commit") as err:
                kmq.MarkerWriter(cfg, queue=q.name, consumer=consumer)
            assert isinstance(err.value, TypeError)
            assert "kmq.aio.AsyncKmqConsumer" in str(err.value)  # the way out is named
            with kmq.MarkerWriter(cfg, queue=q.name) as writer:  # and not smuggled in through start()
                with pytest.raises(UnsupportedConsumer):
                    writer.start([], consumer=consumer)
        finally:
            await consumer.stop()

    asyncio.run(build())
