"""kafka-python adapter: clients built from ``KafkaConfig``, the consumer adapter,
the fetch watchdog and the partition log reader."""
