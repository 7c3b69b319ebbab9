"""The client layer: kmq's one seam to a Kafka client.

* :mod:`kmq.client.api`: what kmq needs from a client (records, consumer and
  producer adapters, deliveries), pure; :mod:`kmq.client.errors`: kmq's errors
  for a client's failures, which each adapter translates its client's into;
  :mod:`kmq.client.admin`: what topic administration needs, pure;
* :mod:`kmq.client.factory`: clients for the configured ``kafka.client``;
* :mod:`kmq.client.kafka_python` and :mod:`kmq.client.confluent`: one folder per
  client with the same shape (settings, consumer adapter, log reader: the one
  "read a partition to its end", walked by :mod:`kmq.core.scan_cursor`);
* security (:mod:`kmq.client.tls`, :mod:`kmq.client.oauth`), connection
  diagnosis (:mod:`kmq.client.diagnose`) and topic administration
  (:mod:`kmq.client.topics`).

Everything above this layer (consumer, tracker, operations, Spark job) talks to
Kafka through the names exported here, so the choice of client never leaks into
the core.
"""

from __future__ import annotations

from kmq.client.errors import ProduceDenied, ProducerFenced, RecordRefused, RecordTooLarge, TopicUnknown
from kmq.client.api import (
    CONFLUENT,
    KAFKA_PYTHON,
    ClientCommitFailed,
    ConsumerAdapter,
    Deleted,
    Delivery,
    GroupConsumerAdapter,
    LogReader,
    OutRecord,
    Partition,
    ProduceFailed,
    ProducerFatal,
    LogEnds,
    ReadResult,
    Record,
    SendBatch,
    UNDECIDED,
    client_of,
    coordinates,
    delivered_at,
    headers_of,
    is_confluent_consumer,
    record_of,
    require_client,
)
from kmq.client.factory import (
    adapt_consumer,
    broker_errors,
    open_admin,
    client_error,
    close_producer,
    group_consumer,
    open_log_reader,
    produce_errors,
    producer,
    refused_record_errors,
    producer_state_errors,
    producer_fatal,
    SendFailure,
    send_failure,
    send_many,
)
from kmq.core.errors import LogReadError

__all__ = [
    "KAFKA_PYTHON", "CONFLUENT", "Record", "record_of", "coordinates", "headers_of", "ConsumerAdapter",
    "GroupConsumerAdapter", "Delivery", "ClientCommitFailed", "ProduceFailed", "ProducerFatal",
    "ProducerFenced", "TopicUnknown", "ProduceDenied", "RecordRefused", "RecordTooLarge", "client_of", "require_client",
    "is_confluent_consumer", "adapt_consumer", "group_consumer", "client_error", "broker_errors", "open_admin", "producer", "close_producer",
    "produce_errors", "Partition", "ReadResult", "LogEnds", "Deleted", "LogReader", "LogReadError", "delivered_at", "open_log_reader",
    "refused_record_errors",
    "produce_errors", "producer_state_errors", "producer_fatal", "SendFailure", "send_failure",
    "OutRecord", "SendBatch", "UNDECIDED", "send_many",
]
