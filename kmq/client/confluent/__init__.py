"""confluent-kafka adapter (librdkafka): clients built from ``KafkaConfig``, the
consumer adapter, the librdkafka log bridge and the partition log reader.

Importing a module here imports confluent-kafka: install ``kmq[confluent]``."""
