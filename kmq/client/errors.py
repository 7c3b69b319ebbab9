"""kmq's errors at the client seam: what a client failure is, whichever client failed.

Each adapter translates its client's errors into these (kafka-python's classes in
:mod:`kmq.client.kafka_python.errors`, librdkafka's codes in :mod:`kmq.client.confluent.errors`),
so the code above :mod:`kmq.client` catches kmq's classes only, and the same ``except`` serves
both clients. The client's own error is the ``__cause__``. Pure: no client is imported here.

::

    KmqError
    ├── ClientCommitFailed       a commit the client did not complete (``rebalanced``: the group moved on)  (retriable)
    └── ProduceFailed            a record the producer did not deliver (timed out, broker gone, ...)  (retriable)
        ├── ProducerFatal        the producer sends nothing more (librdkafka's fatal error): replace it
        ├── ProducerFenced       its producer id is no longer accepted (fenced, unknown, out of sequence,
        │                        old epoch): every later send fails so too, replace the producer
        ├── TopicUnknown         the topic or partition does not exist (yet)                         (retriable)
        ├── ProduceDenied        an ACL denies writing the topic
        └── RecordRefused        the record itself is refused for good: sent again, it fails again
            └── RecordTooLarge   larger than the broker or the topic accepts

Connection, login and ACL failures outside a send are :class:`~kmq.core.errors.BrokerUnavailable`
and its subclasses (:func:`kmq.client.factory.client_error`).
"""

from __future__ import annotations

from kmq.config import KafkaConfig
from kmq.core.errors import AuthorizationFailed, KmqError

__all__ = ["ClientCommitFailed", "ProduceFailed", "ProducerFatal", "ProducerFenced", "TopicUnknown", "ProduceDenied",
           "RecordRefused", "RecordTooLarge", "produce_error", "denied", "ACL_CODES"]


class ClientCommitFailed(KmqError):
    """A commit the client did not complete; ``rebalanced`` when the group moved on
    (the partitions now belong to another member). Wrapped by the callers into their own errors."""

    retriable = True

    def __init__(self, message: str, rebalanced: bool = False) -> None:
        super().__init__(message)
        self.rebalanced = rebalanced


class ProduceFailed(KmqError):
    """A record the producer could not deliver (the client's own error is the ``__cause__``)."""

    retriable = True


class ProducerFatal(ProduceFailed):
    """The producer is in a fatal state (librdkafka's fatal error, e.g. an idempotence guarantee it
    can no longer keep): it sends nothing any more, so every later send fails the same way. The
    record may be sent again, on a new producer: its owner closes this one and makes another."""


class ProducerFenced(ProduceFailed):
    """The broker no longer accepts this producer's id (fenced, unknown producer id, out-of-order
    sequence, old epoch): every later send of that producer fails the same way, so its owner
    replaces it; the record may be sent again on the new one."""


class TopicUnknown(ProduceFailed):
    """The topic or partition does not exist (deleted, or not created or grown yet)."""


class ProduceDenied(ProduceFailed):
    """An ACL denies this principal writing the topic (until the ACL is granted)."""


class RecordRefused(ProduceFailed):
    """The record itself is refused (malformed, corrupt): sent again, it fails again."""

    retriable = False


class RecordTooLarge(RecordRefused):
    """The record (or its batch) is larger than the broker or the topic accepts."""


#: Kafka's error codes (the same numbers on both clients) of the failures with a class of their own.
_BY_CODE: dict[int, type[ProduceFailed]] = {
    2: RecordRefused,  # CORRUPT_MESSAGE
    3: TopicUnknown,  # UNKNOWN_TOPIC_OR_PARTITION
    10: RecordTooLarge,  # MESSAGE_TOO_LARGE
    18: RecordTooLarge,  # RECORD_LIST_TOO_LARGE
    29: ProduceDenied,  # TOPIC_AUTHORIZATION_FAILED
    45: ProducerFenced,  # OUT_OF_ORDER_SEQUENCE_NUMBER
    47: ProducerFenced,  # INVALID_PRODUCER_EPOCH
    59: ProducerFenced,  # UNKNOWN_PRODUCER_ID
    87: RecordRefused,  # INVALID_RECORD
    90: ProducerFenced,  # PRODUCER_FENCED
}

#: Kafka's ACL error codes and what they deny.
ACL_CODES = {29: "topic", 30: "group", 31: "cluster", 53: "transactional id", 65: "delegation token"}


def produce_error(code: int | None, message: str) -> ProduceFailed:
    """kmq's error for a send that failed with Kafka error ``code`` (None or no class of its own:
    :class:`ProduceFailed`)."""
    return _BY_CODE.get(code, ProduceFailed)(message)  # type: ignore[arg-type]


def denied(kafka: KafkaConfig, what: str, detail: str) -> AuthorizationFailed:
    """The ACL error: who was denied which kind of operation (``what``: topic, group, cluster...)."""
    who = f"user {kafka.sasl_username!r}" if kafka.sasl_username else "kmq's principal"
    return AuthorizationFailed(
        f"Kafka denied {who} a {what} operation ({detail.strip()}); grant the ACLs listed in docs/deploy.md for this component"
    )
