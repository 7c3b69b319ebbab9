"""The one table of librdkafka properties that kmq.yaml's keys stand for.

A kmq client on confluent-kafka takes each of these properties from the kmq key named
(:mod:`kmq.client.confluent.settings` renders them); ``kafka.confluent`` may not set them
(:data:`kmq.config.client_settings.CONFLUENT_REFUSED` names the key to set instead), and a
share-consumer dict's property is read as that key (:mod:`kmq.share.settings`). Pure.
"""

from __future__ import annotations

__all__ = ["KMQ_KEY_OF"]

#: librdkafka property -> the kmq.yaml key it comes from.
KMQ_KEY_OF: dict[str, str] = {
    "bootstrap.servers": "kafka.bootstrap_servers",
    "metadata.broker.list": "kafka.bootstrap_servers",
    "client.id": "kafka.client_id",
    "security.protocol": "kafka.security_protocol",
    "sasl.mechanism": "kafka.sasl_mechanism",
    "sasl.mechanisms": "kafka.sasl_mechanism",
    "sasl.username": "kafka.sasl_username",
    "sasl.password": "kafka.sasl_password",
    "ssl.ca.location": "kafka.ssl_cafile",
    "ssl.certificate.location": "kafka.ssl_certfile",
    "ssl.key.location": "kafka.ssl_keyfile",
    "ssl.key.password": "kafka.ssl_password",
    "ssl.endpoint.identification.algorithm": "kafka.ssl_check_hostname",
    "socket.connection.setup.timeout.ms": "kafka.connect_timeout",
    "request.timeout.ms": "kafka.connect_timeout",
    "debug": "kafka.librdkafka_debug",
    "session.timeout.ms": "kafka.session_timeout",
    "heartbeat.interval.ms": "kafka.heartbeat_interval",
    "topic.metadata.refresh.interval.ms": "kafka.metadata_max_age",
    "group.instance.id": "tracker.instance_id",
    "max.poll.interval.ms": "consumer.max_poll_interval",
    "compression.type": "queues[].compression",
    "compression.codec": "queues[].compression",
    "message.max.bytes": "tracker.max_request_size",
}
