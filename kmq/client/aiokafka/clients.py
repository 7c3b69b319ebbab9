"""The client factory of ``kafka.client: aiokafka``: the group member and the marker producer on
the event loop, everything else (topic checks, log readers, administration) on kafka-python."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from kmq.client.aiokafka.bridge import LoopBridge
from kmq.client.aiokafka.consumer import AioGroupConsumer
from kmq.client.aiokafka.producer import AioProducer
from kmq.client.aiokafka.settings import consumer_settings, producer_settings
from kmq.client.api import KAFKA_PYTHON
from kmq.client.parts import ClientFactory
from kmq.config import KafkaConfig

__all__ = ["AioKafkaClients", "kafka_python"]


def kafka_python(kafka: KafkaConfig) -> KafkaConfig:
    """``kafka`` for the clients that stay on kafka-python (``kafka.client`` names only the consumer's)."""
    return replace(kafka, client=KAFKA_PYTHON)


class AioKafkaClients(ClientFactory):
    """Clients on the event loop ``loop`` (running): :class:`~kmq.client.aiokafka.consumer.AioGroupConsumer`
    and :class:`~kmq.client.aiokafka.producer.AioProducer`; the rest from :class:`~kmq.client.parts.ClientFactory`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.bridge = LoopBridge(loop)

    def group_consumer(self, kafka: KafkaConfig, group_id: str, assignor: str, max_records: int,
                       **overrides: Any) -> Any:
        """An aiokafka group member, not started (aiokafka's eager assignors: ``consumer.assignor`` is not used)."""
        return AioGroupConsumer(consumer_settings(kafka, group_id, max_records, overrides), self.bridge,
                                kafka.connect_timeout + kafka.session_timeout)

    def producer(self, kafka: KafkaConfig, timeout_s: float | None = None, settle_on_flush: bool = False,
                 **overrides: Any) -> Any:
        return AioProducer(producer_settings(kafka, timeout_s, overrides), self.bridge,
                           timeout_s or kafka.connect_timeout)
