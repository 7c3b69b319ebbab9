"""The aiokafka adapter: ``kafka.client: aiokafka``, for :mod:`kmq.aio`'s consumer only.

Its clients live on the application's event loop (aiokafka's record decoding is compiled and
runs there, no fetcher thread): :class:`~kmq.client.aiokafka.consumer.AioGroupConsumer` is the
group member, :class:`~kmq.client.aiokafka.producer.AioProducer` the marker producer, and
:class:`~kmq.client.aiokafka.clients.AioKafkaClients` the client factory that builds them.
Topic administration (the topic checks at a start, ``kmq topics``) runs on aiokafka too,
:class:`~kmq.client.aiokafka.admin.AioKafkaAdmin`, on an event loop of its own; only the log
readers of the key-ordered recovery, built when one is needed, stay on kafka-python. Imported
only through :mod:`kmq.client.loop` and :func:`kmq.client.factory.open_admin`, when the client
is chosen.
"""

import importlib.util

from kmq.core.errors import ClientNotInstalled

if importlib.util.find_spec("aiokafka") is None:  # the one clear error when the extra is missing
    raise ClientNotInstalled("kafka.client is aiokafka but aiokafka is not installed; pip install 'kmq[aio]' "
                             "or set kafka.client: kafka-python (KMQ_KAFKA__CLIENT)")
