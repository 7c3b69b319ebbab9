"""Clients for the configured ``kafka.client``: the one place that chooses between
the kafka-python and confluent-kafka adapters.

kafka-python is the base install and is imported here; confluent-kafka is an
optional extra (``kmq[confluent]``), so its adapter is imported
only when it is chosen: an install hint, not an import circle (the adapters
import :mod:`kmq.client.api`, never this module).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from kmq.client.admin import TopicAdmin
from kmq.client.api import (
    AIOKAFKA,
    CONFLUENT,
    ConsumerAdapter,
    FutureBatch,
    GroupConsumerAdapter,
    LogReader,
    OutRecord,
    ProduceFailed,
    SendBatch,
    client_of,
    is_confluent_consumer,
    require_client,
)
from kmq.client.errors import ProduceDenied, ProducerFenced, RecordRefused, RecordTooLarge, TopicUnknown
from kmq.client.overrides import CONSUMER, PRODUCER, native
from kmq.core.errors import KmqError, UnsupportedConsumer

__all__ = ["open_admin", "adapt_consumer", "group_consumer", "client_error", "broker_errors", "producer", "send_many",
           "close_producer", "produce_errors",
           "refused_record_errors", "open_log_reader", "producer_state_errors", "producer_fatal", "SendFailure",
           "send_failure"]


def adapt_consumer(consumer: Any) -> ConsumerAdapter:
    """The :class:`ConsumerAdapter` of a user's consumer: kafka-python's ``KafkaConsumer``,
    confluent-kafka's ``Consumer``, or an adapter already. Anything else raises
    :class:`~kmq.core.errors.UnsupportedConsumer`."""
    if hasattr(consumer, "raw") and hasattr(consumer, "client"):
        return consumer
    if is_confluent_consumer(consumer):
        from kmq.client.confluent.consumer import ConfluentConsumer

        return ConfluentConsumer(consumer)
    if type(consumer).__module__.split(".")[0] == "kafka":
        from kmq.client.kafka_python.consumer import KafkaPythonConsumer

        return KafkaPythonConsumer(consumer)
    raise UnsupportedConsumer(
        f"{type(consumer).__module__}.{type(consumer).__name__} is not a consumer kmq can drive; pass kafka-python's "
        "kafka.KafkaConsumer or confluent-kafka's confluent_kafka.Consumer"
    )


def group_consumer(kafka: Any, group_id: str, assignor: str, max_records: int,
                   **overrides: Any) -> GroupConsumerAdapter:
    """A :class:`GroupConsumerAdapter` on the client ``kafka.client`` names: group ``group_id``,
    auto-commit off, ``assignor`` (``COOPERATIVE-STICKY`` or ``RANGE``, kmq's ``consumer.assignor``)
    and kmq's session timing. Not subscribed yet.

    ``overrides`` are kmq's names (:data:`kmq.client.overrides.CONSUMER`, durations in seconds),
    translated for the chosen client: ``group_instance_id`` (static membership), ``fetch_wait``,
    ``metadata_max_age``, ``max_poll_interval``."""
    name = client_of(kafka)
    require_client(name)
    if name == CONFLUENT:
        from kmq.client.confluent.consumer import consumer as confluent_consumer

        strategy = "cooperative-sticky" if assignor.upper() == "COOPERATIVE-STICKY" else "range,roundrobin"
        return confluent_consumer(kafka, group_id=group_id, **{"partition.assignment.strategy": strategy,
                                                               **native(overrides, CONSUMER, name)})
    from kmq.client.kafka_python import clients
    from kmq.client.kafka_python.consumer import KafkaPythonConsumer

    return KafkaPythonConsumer(clients.consumer(kafka, group_id=group_id, enable_auto_commit=False,
                                                max_poll_records=max_records,
                                                partition_assignment_strategy=clients.assignors(assignor),
                                                **native(overrides, CONSUMER, name)), kafka)


def client_error(kafka: Any, exc: BaseException, what: str) -> KmqError | None:
    """kmq's error for an exception a Kafka client raised while doing ``what``: the refused-login or
    ACL error when it is one, else :class:`~kmq.core.errors.BrokerUnavailable`; ``exc`` itself when it is
    a kmq error already, None when it is no client's error (a bug, to be reported as such)."""
    if isinstance(exc, KmqError):
        return exc
    module = type(exc).__module__.split(".")[0]
    if module in ("confluent_kafka", "cimpl"):
        from kmq.client.confluent import errors as confluent_errors

        return confluent_errors.client_error(kafka, exc, what)
    if module != "kafka":
        return None
    from kmq.client.kafka_python import clients

    return clients.client_error(kafka, exc, what)


@contextlib.contextmanager
def broker_errors(kafka: Any, what: str = "talking to Kafka") -> Iterator[None]:
    """Raise kmq's error (:func:`client_error`) for any Kafka client's failure inside the block, on
    either client: a connection failure diagnosed, a refused login or ACL named. Exceptions that are
    no client's (bugs) pass unchanged."""
    try:
        yield
    except KmqError:
        raise
    except Exception as exc:
        if type(exc).__module__.split(".")[0] == "kafka":
            # kafka-python's (loaded, since it raised; imported only for the clients that use it, its
            # modules being some 17,000 objects every full garbage collection visits): its own
            # mapping first, which diagnoses a connection failure.
            from kmq.client.kafka_python import clients

            try:
                with clients.broker_errors(kafka):
                    raise exc
            except KmqError:
                raise
            except Exception:  # noqa: BLE001 - not one it maps: kmq's general mapping below
                pass
        error = client_error(kafka, exc, what)
        if error is None:
            raise
        raise error from exc


def producer(kafka: Any, timeout_s: float | None = None, settle_on_flush: bool = False, **overrides: Any) -> Any:
    """An idempotent acks=all producer on the client ``kafka.client`` names.

    ``overrides`` are kmq's names (:data:`kmq.client.overrides.PRODUCER`: ``linger``,
    ``delivery_timeout``, ``compression``, ...; durations in seconds), translated for the chosen
    client. ``send(topic, value=, key=, partition=, headers=)``
    returns a future (:class:`Delivery` on confluent). ``settle_on_flush``: the caller reads
    verdicts only after a ``flush``, from the thread that sends; confluent then gives them at the
    flush, without a delivery callback per record (cheaper per record). kafka-python's futures
    complete on its I/O thread either way."""
    name = client_of(kafka)
    require_client(name)
    if name == CONFLUENT:
        from kmq.client.confluent.consumer import producer as confluent_producer

        return confluent_producer(kafka, timeout_s, settle_on_flush, **native(overrides, PRODUCER, name))
    from kmq.client.kafka_python import clients

    return clients.producer(kafka, timeout_s, **native(overrides, PRODUCER, name))


def send_many(prod: Any, records: Sequence[OutRecord]) -> SendBatch:
    """Start producing ``records`` on a producer from :func:`producer`, without waiting; after the
    producer's ``flush``, the batch tells each one's verdict. On confluent-kafka without a future per
    record (the delivery reports fill the batch); on kafka-python, one future each. A record refused
    before it left (too large, unknown partition) has its exception as its verdict."""
    many = getattr(prod, "send_many", None)
    if many is not None:
        return many(records)
    futures: list[Any] = []
    for r in records:
        try:
            futures.append(prod.send(r.topic, value=r.value, key=r.key, partition=r.partition, headers=r.headers))
        except Exception as exc:  # noqa: BLE001 - refused before it left: this record only
            futures.append(exc)
    return FutureBatch(futures)


def close_producer(prod: Any, timeout: float = 5.0) -> None:
    """Close a producer from :func:`producer` within about ``timeout`` seconds, pending records or not."""
    if hasattr(prod, "is_confluent") or hasattr(prod, "is_aiokafka"):
        prod.close(timeout)
        return
    from kmq.client.kafka_python import clients

    clients.close_producer(prod, timeout)


def produce_errors() -> tuple[type[BaseException], ...]:
    """Exception classes a producer's ``send``/``flush`` may raise, for ``except`` clauses: kmq's
    :class:`~kmq.client.errors.ProduceFailed` (and its subclasses) on either client."""
    return (ProduceFailed,)


def producer_state_errors() -> tuple[type[BaseException], ...]:
    """Send failures after which the producer's id is no longer accepted (fenced, unknown, out of
    sequence): every later send of that producer fails the same way, so it must be replaced. Both
    adapters raise :class:`~kmq.client.errors.ProducerFenced` for them."""
    return (ProducerFenced,)


def producer_fatal(prod: Any) -> Exception | None:
    """The fatal error a producer from :func:`producer` reported (a
    :class:`~kmq.client.api.ProducerFatal`: it sends nothing more and must be replaced), or None.
    Only confluent-kafka's producers have such a state (librdkafka's fatal errors)."""
    return getattr(prod, "fatal", None)


@dataclass(frozen=True)
class SendFailure:
    """What a failed send was, whichever client's producer raised it."""

    kind: str  # "too_large", "unknown_topic", "forbidden", "invalid" (the record) or "failed" (anything else)
    permanent: bool  # the same record fails again however often it is sent


#: A record refused for good: kmq's class, and the Python errors kafka-python raises for a record it
#: cannot encode before sending (a null header value, neither key nor value).
_PERMANENT_SENDS = (RecordRefused, TypeError, ValueError, AssertionError)


def send_failure(exc: BaseException) -> SendFailure:
    """Classify an exception from a producer's ``send``, its future or ``flush`` (kmq's classes on
    both clients; a refusal before sending, e.g. kafka-python's tombstone ValueError, too)."""
    permanent = isinstance(exc, _PERMANENT_SENDS)
    if isinstance(exc, RecordTooLarge):
        return SendFailure("too_large", True)
    if isinstance(exc, TopicUnknown):
        return SendFailure("unknown_topic", permanent)
    if isinstance(exc, ProduceDenied):
        return SendFailure("forbidden", permanent)
    return SendFailure("invalid" if permanent else "failed", permanent)


def refused_record_errors() -> tuple[type[BaseException], ...]:
    """Exception classes of a record the producer refuses for good (too large, malformed): sending it
    again fails again. Raised by ``send`` or by the delivery, on either client."""
    return _PERMANENT_SENDS


def open_log_reader(kafka: Any, timeout_s: float = 10.0, fetch_wait_ms: int = 50, **overrides: Any) -> LogReader:
    """A :class:`~kmq.client.api.LogReader` on the client ``kafka.client`` names: partitions read
    without a group, each read ending where a fetch of its own saw the end of the log. ``timeout_s``:
    how long a read waits for an answer from the broker; ``fetch_wait_ms``: how long the broker
    holds a fetch that finds nothing new (what a look-up of an idle log's end waits); ``overrides``:
    kmq's consumer settings (:data:`kmq.client.overrides.CONSUMER`; ``max_poll_records`` is the records
    a confluent reader takes per call too), translated for the chosen client. Close it when done."""
    name = client_of(kafka)
    require_client(name)
    if name == CONFLUENT:
        from kmq.client.confluent.log_reader import ConfluentLogReader

        # Records a consume call takes: librdkafka's batch is the reader's, not a property.
        batch = overrides.pop("max_poll_records", None)
        return ConfluentLogReader(kafka, timeout_s, **({"batch": batch} if batch else {}),
                                  **{"fetch.wait.max.ms": fetch_wait_ms, **native(overrides, CONSUMER, name)})
    from kmq.client.kafka_python.log_reader import LogReader as KafkaPythonLogReader

    return KafkaPythonLogReader(kafka, timeout_s, **{"fetch_max_wait_ms": fetch_wait_ms,
                                                     **native(overrides, CONSUMER, name)})


def open_admin(kafka: Any, timeout_s: float | None = None) -> TopicAdmin:
    """A :class:`~kmq.client.admin.TopicAdmin` on the client ``kafka.client`` names; ``timeout_s``
    (default ``kafka.connect_timeout``) bounds each request. Close it when done."""
    name = client_of(kafka)
    timeout_s = timeout_s or kafka.connect_timeout
    if name == AIOKAFKA:  # its topic checks and ``kmq topics`` too: no kafka-python in its process
        from kmq.client.aiokafka.admin import AioKafkaAdmin

        return AioKafkaAdmin(kafka, timeout_s)
    require_client(name)
    if name == CONFLUENT:
        from kmq.client.confluent.admin import ConfluentAdmin

        return ConfluentAdmin(kafka, timeout_s)
    from kmq.client.kafka_python.admin import KafkaPythonAdmin

    return KafkaPythonAdmin(kafka, timeout_s)
