"""The client factory of ``kafka.client: aiokafka``: the group member and the marker producer on
the event loop, topic administration (the topic checks) on aiokafka too, on a loop of its own
(:mod:`kmq.client.aiokafka.admin`); the log readers of the key-ordered recovery, built only when
one is needed, on kafka-python."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from kmq.client.aiokafka.bridge import LoopBridge
from kmq.client.aiokafka.consumer import AioGroupConsumer
from kmq.client.aiokafka.producer import AioProducer
from kmq.client.aiokafka.settings import consumer_settings, producer_settings
from kmq.client import topics
from kmq.client.admin import TopicAdmin
from kmq.client.api import AIOKAFKA, KAFKA_PYTHON
from kmq.client.factory import open_admin
from kmq.client.parts import ClientFactory
from kmq.config import KafkaConfig, QueueConfig

__all__ = ["AioKafkaClients", "kafka_python"]


def kafka_python(kafka: KafkaConfig) -> KafkaConfig:
    """``kafka`` for the clients that stay on kafka-python (the log readers)."""
    return replace(kafka, client=KAFKA_PYTHON)


def _aiokafka(kafka: KafkaConfig) -> KafkaConfig:
    return replace(kafka, client=AIOKAFKA)


class AioKafkaClients(ClientFactory):
    """Clients on the event loop ``loop`` (running): :class:`~kmq.client.aiokafka.consumer.AioGroupConsumer`
    and :class:`~kmq.client.aiokafka.producer.AioProducer`, topic administration on
    :class:`~kmq.client.aiokafka.admin.AioKafkaAdmin`; the rest (log readers) from
    :class:`~kmq.client.parts.ClientFactory`, on the client ``kafka`` names (kafka-python:
    :func:`kmq.client.loop.loop_clients`)."""

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

    def open_admin(self, kafka: KafkaConfig, timeout_s: float | None = None) -> TopicAdmin:
        return open_admin(_aiokafka(kafka), timeout_s)

    def require_aligned(self, kafka: KafkaConfig, queue: QueueConfig) -> Any:
        return topics.require_aligned(_aiokafka(kafka), queue)

    def max_message_bytes(self, kafka: KafkaConfig, names: list[str]) -> dict[str, int | None]:
        return topics.max_message_bytes(_aiokafka(kafka), names)
