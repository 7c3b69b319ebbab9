"""The clients of an asyncio consumer: ``kafka.client: aiokafka`` on the running event loop.

:class:`~kmq.consumer.aio.AsyncKmqConsumer` asks here (packages above the seam import no adapter);
the aiokafka adapter (:mod:`kmq.client.aiokafka`) is imported only when that client is chosen.
"""

from __future__ import annotations

import asyncio

from kmq.client.api import AIOKAFKA
from kmq.client.parts import ClientFactory
from kmq.config import Config

__all__ = ["on_loop", "loop_clients"]


def on_loop(cfg: Config) -> bool:
    """Whether ``cfg`` names the client that runs on the event loop (``kafka.client: aiokafka``)."""
    return getattr(getattr(cfg, "kafka", None), "client", None) == AIOKAFKA


def loop_clients(cfg: Config, loop: asyncio.AbstractEventLoop) -> tuple[Config, ClientFactory]:
    """The configuration and client factory of a consumer on ``loop``: the factory builds the group
    member and the marker producer on aiokafka, and administers topics (the topic checks) on aiokafka
    on a loop of its own; ``cfg`` comes back with kafka-python named for the rest (the log readers of
    the key-ordered recovery, built when one is needed: only then is kafka-python imported).
    :class:`~kmq.core.errors.ClientNotInstalled` without aiokafka."""
    from dataclasses import replace

    from kmq.client.aiokafka.clients import AioKafkaClients, kafka_python

    return replace(cfg, kafka=kafka_python(cfg.kafka)), AioKafkaClients(loop)
