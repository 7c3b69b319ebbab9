"""Errors raised by kmq.

Every expected failure is a :class:`KmqError` whose message names the cause
and the fix; the CLI prints it as one line and exits 1.

::

    KmqError
    ├── ConfigError               bad or unknown configuration key (names the key path)
    ├── MarkerDecodeError         a marker record that is not valid wire format v1
    │   └── NewerMarkerVersion    a marker of a newer wire version this build cannot read by its v1 fields
    ├── BrokerUnavailable         Kafka not reachable within the timeout      (retriable)
    │   └── LogReadError          a partition could not be read to its end in time    (retriable)
    │   ├── TlsHandshakeFailed    TLS could not be set up (TLS to a plaintext port, plaintext to a TLS port)
    │   ├── CertificateRejected   broker certificate untrusted/expired/wrong host, or our client certificate refused
    │   ├── AuthenticationFailed  SASL login refused, or no OAUTHBEARER token could be obtained
    │   └── AuthorizationFailed   authenticated, but an ACL denies a topic, group or cluster operation
    ├── TopicError
    │   ├── TopicMissing          a queue, markers or DLQ topic does not exist
    │   ├── TopicMisaligned       markers topic has fewer partitions than the queue
    │   ├── UnsupportedByBroker   e.g. CreatePartitions on a broker without it
    │   └── DeadLetterTopicUnavailable  DLQ topic missing or not writable      (retriable)
    ├── MarkerWriteError          a marker was not acknowledged by Kafka      (retriable)
    ├── MessageAlreadySettled     second ack/nack/reject on one message
    ├── InvalidSettlement         nack/renew/reject argument out of the wire's range (also a ValueError)
    ├── UnsupportedConsumer       e.g. an aiokafka consumer given to MarkerWriter (also a TypeError)
    ├── ClientNotInstalled        kafka.client names a client that is not installed (confluent without kmq[confluent])
    ├── DevBrokerError            the embedded broker could not start
    ├── TraceError                a ``kmq trace`` selector that names no message
    ├── UiConfigError             ``kmq ui`` bound beyond loopback without a token
    ├── CannotListen              an HTTP port (``kmq ui``, the tracker's, ``kmq work --metrics-port``) is taken
    ├── FetcherStalled            the consumer's Kafka poll stopped returning (retriable)
    ├── KafkaException            kmq.share: a call or an acknowledgement commit failed (confluent's name)
    ├── IllegalStateException     kmq.share: a call in the wrong state (closed, not subscribed, ...; also a RuntimeError)
    └── ConcurrentModificationException  kmq.share: one consumer used from two threads at once (also a RuntimeError)
"""

from __future__ import annotations

__all__ = [
    "KmqError",
    "ConfigError",
    "MarkerDecodeError",
    "NewerMarkerVersion",
    "BrokerUnavailable",
    "TlsHandshakeFailed",
    "CertificateRejected",
    "AuthenticationFailed",
    "AuthorizationFailed",
    "TopicError",
    "TopicMissing",
    "TopicMisaligned",
    "UnsupportedByBroker",
    "MarkerWriteError",
    "MessageAlreadySettled",
    "InvalidSettlement",
    "UnsupportedConsumer",
    "DevBrokerError",
    "TraceError",
    "UiConfigError",
    "CannotListen",
    "DeadLetterTopicUnavailable",
    "FetcherStalled",
    "ClientNotInstalled",
    "LogReadError",
    "KafkaException",
    "IllegalStateException",
    "ConcurrentModificationException",
    "install_extra",
]


def install_extra(extra: str) -> str:
    """How to install kmq with one of its extras, for the errors that need one: kmq is on no
    package index, so from a checkout or the release wheel (docs/deploy.md, "Release")."""
    return f"install kmq with its {extra} extra (pip install '.[{extra}]' in a checkout of kmq, or the release wheel with [{extra}])"


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


class NewerMarkerVersion(MarkerDecodeError):
    """A marker of a wire version newer than this build reads (``version``), whose header and ranges
    are a marker's but whose type (``type_code``) or body this build cannot read by its version-1
    fields. Unlike other bad markers it must not be skipped: it may open or keep a lease. Upgrading
    the reader is the fix (docs/protocol.md, "Rolling upgrades")."""

    def __init__(self, reason: str, version: int, type_code: int) -> None:
        super().__init__(reason)
        self.version = version
        self.type_code = type_code


class BrokerUnavailable(KmqError):
    retriable = True


class LogReadError(BrokerUnavailable):
    """A partition could not be read: no answer from the broker for the reader's timeout, or the
    client failed. Nothing was concluded from it (no offset is taken for missing); try again later."""

    retriable = True


# The subclasses below are misconfigurations, not outages: retrying does not
# help until someone changes a certificate, a credential or an ACL.
class TlsHandshakeFailed(BrokerUnavailable):
    """The TLS layer could not be set up (one side speaks TLS and the other does not, or no common protocol)."""

    retriable = False


class CertificateRejected(BrokerUnavailable):
    """A certificate was refused: the broker's by us (untrusted, expired, wrong host) or ours by the broker."""

    retriable = False


class AuthenticationFailed(BrokerUnavailable):
    """SASL authentication was refused, or no OAUTHBEARER token could be obtained."""

    retriable = False


class AuthorizationFailed(BrokerUnavailable):
    """Authenticated, but the broker's ACLs deny an operation kmq needs."""

    retriable = False


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


class TraceError(KmqError):
    """A ``kmq trace`` selector that is malformed or names no message."""


class UiConfigError(KmqError):
    """``kmq ui`` would start unsafely (bound beyond loopback without a token)."""


class CannotListen(KmqError):
    """An HTTP server could not bind its address (the port is taken, the address is not this
    machine's, ...). The CLI exits with ``kmq.cli.EXIT_CANNOT_LISTEN`` (3)."""

    def __init__(self, what: str, host: str, port: int, exc: OSError, fix: str) -> None:
        self.host, self.port = host, port
        super().__init__(f"{what} cannot listen on {host}:{port}: {exc.strerror or exc}; {fix}")


class InvalidSettlement(KmqError, ValueError):
    """A settlement argument the marker wire cannot carry (NaN, negative, over the
    u32 ms range, a reason over 65,535 utf-8 bytes...). Raised before anything is
    recorded: the message stays unsettled and can still be settled correctly.
    Also a :class:`ValueError`, so ``except ValueError`` keeps working."""


class UnsupportedConsumer(KmqError, TypeError):
    """A consumer :class:`~kmq.consumer.writer.MarkerWriter` cannot drive, e.g. an asyncio
    one (aiokafka) whose ``commit`` is a coroutine: the writer's blocking calls
    would never await it, so nothing would be committed. Also a :class:`TypeError`."""


class DeadLetterTopicUnavailable(TopicError):
    """The DLQ topic is missing or this client may not see or write it; dead letters wait."""

    retriable = True


class FetcherStalled(KmqError):
    """The consumer's Kafka poll stopped returning and could not be unblocked:
    restart the process (its unsettled messages are redelivered by the tracker)."""

    retriable = True


class ClientNotInstalled(KmqError):
    """``kafka.client`` names a Kafka client that is not installed (``confluent`` needs
    the ``confluent`` extra)."""


# The share-consumer API (kmq.share) raises these; their names are confluent_kafka's, so code
# written against confluent_kafka.ShareConsumer catches the same names from kmq.share.
class KafkaException(KmqError):
    """A share-consumer call, or the commit of acknowledgements, failed. ``args[0]`` is a
    :class:`kmq.share.KafkaError` (``code()``, ``str()``, ``retriable()``), as in confluent-kafka."""

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        err = self.args[0] if self.args else None
        return bool(getattr(err, "retriable", lambda: False)())


class IllegalStateException(KmqError, RuntimeError):
    """A share-consumer call made in a state that forbids it: the consumer is closed, not
    subscribed, records of the last poll are unacknowledged in explicit mode, a record is not
    in flight, or a call came from inside the acknowledgement-commit callback."""


class ConcurrentModificationException(KmqError, RuntimeError):
    """A share consumer was called from a second thread while a call was running (it is not
    thread-safe, like confluent-kafka's: use one consumer per thread)."""
