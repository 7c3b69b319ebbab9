"""The Kafka clients of kmq's consumer and tracker, as one object passed in.

:class:`ClientFactory` builds every client :class:`~kmq.consumer.consumer.KmqConsumer`,
:class:`~kmq.consumer.writer.MarkerWriter` and :class:`tracker.service.Tracker` use,
from the configuration's ``kafka`` section: the group consumer, the producers,
the log readers, topic administration, and the two topic look-ups (the queue's topics exist and are
aligned; ``max.message.bytes``). Its methods are :mod:`kmq.client.factory`'s and
:mod:`kmq.client.topics`' functions, so the default object builds what those
always built.

Each of those classes takes ``clients=`` (default :data:`KAFKA_CLIENTS`). A
subclass hands in other parts through the same door, and the code under it is
the code that ships: :mod:`kmq.testing` passes clients of the simulated cluster.
"""

from __future__ import annotations

from typing import Any

from kmq import client as client_api
from kmq.client import topics
from kmq.client.admin import TopicAdmin
from kmq.client.factory import open_admin
from kmq.client.api import GroupConsumerAdapter, LogReader
from kmq.config import KafkaConfig, QueueConfig

__all__ = ["ClientFactory", "KAFKA_CLIENTS"]


class ClientFactory:
    """Builds kmq's Kafka clients from ``kafka`` settings (the client ``kafka.client`` names).

    Override a method to give kmq other clients; each returns what the same-named function of
    :mod:`kmq.client.factory` returns, and keeps its signature."""

    def group_consumer(self, kafka: KafkaConfig, group_id: str, assignor: str, max_records: int,
                       **overrides: Any) -> GroupConsumerAdapter:
        """A group member, not subscribed yet (:func:`kmq.client.factory.group_consumer`)."""
        return client_api.group_consumer(kafka, group_id, assignor, max_records, **overrides)

    def producer(self, kafka: KafkaConfig, timeout_s: float | None = None, settle_on_flush: bool = False,
                 **overrides: Any) -> Any:
        """An idempotent acks=all producer (:func:`kmq.client.factory.producer`)."""
        return client_api.producer(kafka, timeout_s, settle_on_flush, **overrides)

    def open_log_reader(self, kafka: KafkaConfig, timeout_s: float = 10.0, fetch_wait_ms: int = 50,
                        **overrides: Any) -> LogReader:
        """A reader of partitions without a group (:func:`kmq.client.factory.open_log_reader`)."""
        return client_api.open_log_reader(kafka, timeout_s, fetch_wait_ms, **overrides)

    def open_admin(self, kafka: KafkaConfig, timeout_s: float | None = None) -> TopicAdmin:
        """Topic administration (:func:`kmq.client.factory.open_admin`)."""
        return open_admin(kafka, timeout_s)

    def require_aligned(self, kafka: KafkaConfig, queue: QueueConfig) -> Any:
        """Raise :class:`~kmq.core.errors.TopicMissing` or :class:`~kmq.core.errors.TopicMisaligned`
        unless the queue's topics exist with matching partitions (:func:`kmq.client.topics.require_aligned`)."""
        return topics.require_aligned(kafka, queue)

    def max_message_bytes(self, kafka: KafkaConfig, names: list[str]) -> dict[str, int | None]:
        """Each topic's ``max.message.bytes`` (None: not reported; :func:`kmq.client.topics.max_message_bytes`)."""
        return topics.max_message_bytes(kafka, names)


#: The clients of a real cluster: what kmq builds when no ``clients=`` is passed.
KAFKA_CLIENTS = ClientFactory()
