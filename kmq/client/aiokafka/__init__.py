"""The aiokafka adapter: ``kafka.client: aiokafka``, for :mod:`kmq.aio`'s consumer only.

Its clients live on the application's event loop (aiokafka's record decoding is compiled and
runs there, no fetcher thread): :class:`~kmq.client.aiokafka.consumer.AioGroupConsumer` is the
group member, :class:`~kmq.client.aiokafka.producer.AioProducer` the marker producer, and
:class:`~kmq.client.aiokafka.clients.AioKafkaClients` the client factory that builds them.
Everything else (topic checks, log readers, administration) stays on kafka-python. Imported only
through :mod:`kmq.client.loop`, when the client is chosen.
"""
