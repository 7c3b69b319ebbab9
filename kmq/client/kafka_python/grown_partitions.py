"""A kafka-python producer that waits for a partition its metadata does not know yet.

kafka-python's ``send(topic, partition=p)`` raises ``ValueError("Unrecognized partition")`` when
its cached metadata has fewer partitions than ``p + 1``, without asking the cluster: it waits for
metadata only when the whole topic is unknown. After partitions are added to a queue
(``kmq topics create QUEUE --partitions N`` grows the markers topic, then the queue), a worker
handed a new queue partition writes its STARTs to the markers partition of that number, which its
producer has not seen yet: the ValueError stopped the consumer's fetcher for good (reproduced on
Apache Kafka 4.2). :class:`GrowingTopicsProducer` refreshes the metadata and waits for the
partition within ``max_block_ms``, as kafka-python does for an unknown topic, and then fails with
:class:`~kmq.client.errors.TopicUnknown`, a send failure its callers handle (a START not
acknowledged: the batch is fetched again).

Its sends and flushes fail with kmq's errors (:mod:`kmq.client.kafka_python.errors`): ``send``
returns a :class:`~kmq.client.kafka_python.errors.KmqFuture`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError, UnknownTopicOrPartitionError

from kmq.client.kafka_python.errors import KmqFuture, as_kmq_error

__all__ = ["GrowingTopicsProducer", "PRODUCER_ATTRIBUTES"]

log = logging.getLogger(__name__)

#: ``KafkaProducer`` internals this class reads or calls.
PRODUCER_ATTRIBUTES = ("_metadata", "_sender", "config")

#: Longest single wait for one metadata answer before asking again.
_ASK_EVERY = 1.0


class GrowingTopicsProducer(KafkaProducer):
    """``KafkaProducer`` whose ``send`` to a partition not in its metadata waits for the cluster's,
    failing with kmq's errors."""

    def send(self, topic: str, value: Any = None, key: Any = None, headers: Any = None,
             partition: int | None = None, timestamp_ms: int | None = None) -> KmqFuture:
        try:
            if partition is not None:
                known = self._metadata.partitions_for_topic(topic)
                if known is not None and partition not in known:  # an unknown topic: kafka-python waits itself
                    self._await_partition(topic, partition)
            return KmqFuture(super().send(topic, value=value, key=key, headers=headers, partition=partition,
                                          timestamp_ms=timestamp_ms))
        except KafkaError as exc:  # refused before it left (too large, no metadata in time, closed)
            raise as_kmq_error(exc) from exc

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every record sent so far; :class:`~kmq.client.errors.ProduceFailed` when some are not
        decided within ``timeout`` (their own verdicts come with their futures)."""
        try:
            super().flush(timeout)
        except KafkaError as exc:
            raise as_kmq_error(exc) from exc

    def _await_partition(self, topic: str, partition: int) -> None:
        wait = self.config["max_block_ms"] / 1000
        deadline = time.monotonic() + wait
        log.info("partition %d of %s is not in this producer's metadata yet (partitions added?); asking the cluster",
                 partition, topic)
        while True:
            answered = threading.Event()
            self._metadata.request_update().add_both(lambda _result: answered.set())  # noqa: B023 - a late answer wakes a later wait: it looks again
            self._sender.wakeup()
            answered.wait(max(0.0, min(_ASK_EVERY, deadline - time.monotonic())))
            if partition in (self._metadata.partitions_for_topic(topic) or ()):
                return
            if time.monotonic() >= deadline:
                raise UnknownTopicOrPartitionError(
                    f"partition {partition} of {topic} is not in the cluster's metadata after {wait:g} s: the topic "
                    f"has fewer partitions (grow it: kmq topics create QUEUE --partitions N grows the markers "
                    f"topic to match the queue)")
            time.sleep(0.05)  # the answer came but without the partition: the broker may not have it yet
