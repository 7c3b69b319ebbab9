"""Errors raised by kmq.

Every expected failure is a :class:`KmqError` whose message names the cause
and the fix; the CLI prints it as one line and exits 1.

::

    KmqError
    ├── ConfigError               bad or unknown configuration key (names the key path)
    ├── MarkerDecodeError         a marker record that is not valid wire format v1
    ├── BrokerUnavailable         Kafka not reachable within the timeout      (retriable)
    ├── TopicError
    │   ├── TopicMissing          a queue, markers or DLQ topic does not exist
    │   ├── TopicMisaligned       markers topic has fewer partitions than the queue
    │   └── UnsupportedByBroker   e.g. CreatePartitions on a broker without it
    ├── MarkerWriteError          a marker was not acknowledged by Kafka      (retriable)
    ├── MessageAlreadySettled     second ack/nack/reject on one message
    ├── DevBrokerError            the embedded broker could not start
    └── FetcherStalled            the consumer's Kafka poll stopped returning (retriable)
"""

from __future__ import annotations

__all__ = [
    "KmqError",
    "ConfigError",
    "MarkerDecodeError",
    "BrokerUnavailable",
    "TopicError",
    "TopicMissing",
    "TopicMisaligned",
    "UnsupportedByBroker",
    "MarkerWriteError",
    "MessageAlreadySettled",
    "DevBrokerError",
    "FetcherStalled",
]


class KmqError(Exception):
    """Base class of every kmq error."""

    retriable: bool = False


class ConfigError(KmqError):
    """Invalid configuration; ``path`` is the key path, e.g. ``queues[0].lease``."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


class MarkerDecodeError(KmqError):
    """A marker value or key that is not valid wire format version 1."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class BrokerUnavailable(KmqError):
    retriable = True


class TopicError(KmqError):
    pass


class TopicMissing(TopicError):
    pass


class TopicMisaligned(TopicError):
    pass


class UnsupportedByBroker(TopicError):
    pass


class MarkerWriteError(KmqError):
    retriable = True


class MessageAlreadySettled(KmqError):
    pass


class DevBrokerError(KmqError):
    pass


class FetcherStalled(KmqError):
    """The consumer's Kafka poll stopped returning and could not be unblocked:
    restart the process (its unsettled messages are redelivered by the tracker)."""

    retriable = True
