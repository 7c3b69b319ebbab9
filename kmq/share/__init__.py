"""The share-consumer API (confluent-kafka's ``ShareConsumer``, KIP-932) on any Kafka.

::

    from kmq.share import ShareConsumer, AcknowledgeType   # native: from confluent_kafka import ...

Same constructor dict, methods, acknowledgement modes, exception names and
message interface as ``confluent_kafka.ShareConsumer``, backed by
:class:`kmq.KmqConsumer` (markers, the tracker, the DLQ). docs/share-consumer.md
is the guide: the API, where kmq differs, moving a queue between kmq and native
share groups. This package does not import confluent_kafka.
"""

from __future__ import annotations

from kmq.core.errors import ConcurrentModificationException, IllegalStateException, KafkaException
from kmq.share.consumer import CommitCallback, ShareConsumer
from kmq.share.types import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    AcknowledgeType,
    KafkaError,
    Message,
    Messages,
    TopicPartition,
)

__all__ = [
    "ShareConsumer",
    "AcknowledgeType",
    "CommitCallback",
    # values
    "Message",
    "Messages",
    "TopicPartition",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    # errors (confluent_kafka's names)
    "KafkaException",
    "KafkaError",
    "IllegalStateException",
    "ConcurrentModificationException",
]
