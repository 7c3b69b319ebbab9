"""The values of the share-consumer API: what ``confluent_kafka`` names them, kmq's own.

Pure: no Kafka import (``kmq.share`` must not import confluent_kafka). Names,
values and methods follow confluent-kafka 2.16's share consumer, so code
written against it reads these unchanged:

* :class:`AcknowledgeType` -- ``ACCEPT`` (1), ``RELEASE`` (2), ``REJECT`` (3);
* :class:`Message` -- ``topic()``, ``partition()``, ``offset()``, ``key()``,
  ``value()``, ``headers()``, ``timestamp()``, ``error()``, ``delivery_count()``
  ... over a :class:`~kmq.core.message.KmqMessage`;
* :class:`Messages` -- the batch ``poll()`` returns;
* :class:`TopicPartition` -- the key of ``commit_sync()`` results and of the
  commit callback's offsets;
* :class:`KafkaError` -- what a :class:`~kmq.core.errors.KafkaException` carries.
"""

from __future__ import annotations

from enum import IntEnum
import builtins
from typing import Any, Iterable, Iterator, Union

from kmq.core.message import KmqMessage

__all__ = ["AcknowledgeType", "TopicPartition", "KafkaError", "Message", "Messages",
           "TIMESTAMP_NOT_AVAILABLE", "TIMESTAMP_CREATE_TIME"]

#: ``Message.timestamp()`` types, confluent-kafka's values.
TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1


class AcknowledgeType(IntEnum):
    """How a polled record is settled (confluent-kafka's names and values).

    kmq: ``ACCEPT`` writes an END marker (done), ``RELEASE`` a NACK with no
    delay (the tracker redelivers it at once, its delivery count one higher),
    ``REJECT`` a REJECT marker (the tracker dead-letters it; never redelivered)."""

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


class TopicPartition:
    """A topic and a partition (``.topic``, ``.partition``), hashable, as confluent-kafka's
    ``TopicPartition`` is used in share-consumer results (its offset fields are unused there)."""

    __slots__ = ("topic", "partition", "offset", "error")

    def __init__(self, topic: str, partition: int = -1, offset: int = -1001) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.error = None

    def _key(self) -> tuple[str, int]:
        return self.topic, self.partition

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: "TopicPartition") -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"TopicPartition{{topic={self.topic},partition={self.partition}}}"


class KafkaError:
    """The error inside a :class:`~kmq.core.errors.KafkaException` and the argument of ``error_cb``:
    ``code()``, ``name()``, ``str()``, ``retriable()``, ``fatal()`` (the subset of confluent-kafka's
    a share consumer reads; its codes have librdkafka's names and numbers)."""

    #: kmq's codes: librdkafka's local errors, the same names and numbers.
    _STATE = -172
    _FAIL = -196
    _TIMED_OUT = -185
    _TRANSPORT = -195
    _ALL_BROKERS_DOWN = -187
    _AUTHENTICATION = -169
    _SSL = -181
    _NAMES = {_STATE: "_STATE", _FAIL: "_FAIL", _TIMED_OUT: "_TIMED_OUT", _TRANSPORT: "_TRANSPORT",
              _ALL_BROKERS_DOWN: "_ALL_BROKERS_DOWN", _AUTHENTICATION: "_AUTHENTICATION", _SSL: "_SSL"}

    def __init__(self, code: int, reason: str | None = None, retriable: bool = False, fatal: bool = False) -> None:
        self._code = code
        self._reason = reason if reason is not None else self._NAMES.get(code, str(code))
        self._retriable = retriable
        self._fatal = fatal

    def code(self) -> int:
        return self._code

    def name(self) -> str:
        return self._NAMES.get(self._code, str(self._code))

    def str(self) -> str:
        return self._reason

    def retriable(self) -> bool:
        return self._retriable

    def fatal(self) -> bool:
        return self._fatal

    def __eq__(self, other: object) -> bool:
        """Equal to another KafkaError or to an int with its code, as confluent-kafka's."""
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int) and not isinstance(other, bool):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)

    def __str__(self) -> builtins.str:  # builtins: the method str() above shadows the type here
        return self._reason

    def __repr__(self) -> builtins.str:
        return f"KafkaError{{code={self.name()},val={self._code},str=\"{self._reason}\"}}"


class Message:
    """One polled record, read like a confluent-kafka ``Message``.

    ``delivery_count()`` is 1 on the first delivery and one more on each redelivery (kmq's
    ``kmq-delivery-count`` header). A redelivered record is the tracker's copy: same key, value
    and headers (plus kmq's), a new offset. ``kmq_message`` is the underlying
    :class:`~kmq.core.message.KmqMessage` (kmq extra)."""

    __slots__ = ("kmq_message", "_ack", "_applied", "_poll")

    def __init__(self, kmq_message: KmqMessage, poll: object = None) -> None:
        self.kmq_message = kmq_message
        #: The poll that returned it (a token of the consumer's): acknowledgements name their batch.
        self._poll = poll
        #: (AcknowledgeType, kmq argument) recorded by acknowledge(), not applied yet.
        self._ack: tuple[AcknowledgeType, Any] | None = None
        self._applied = False

    def _note(self, ack: tuple[AcknowledgeType, Any]) -> None:
        """Record an acknowledgement (the consumer's ``acknowledge()``), applied by the next poll or commit."""
        self._ack = ack

    def _applying(self) -> KmqMessage:
        """Its acknowledgement is being applied (the consumer's, once): its kmq message, which settles it."""
        self._applied = True
        return self.kmq_message

    def topic(self) -> str:
        return self.kmq_message.topic

    def partition(self) -> int:
        return self.kmq_message.partition

    def offset(self) -> int:
        return self.kmq_message.offset

    def key(self) -> bytes | None:
        return self.kmq_message.key

    def value(self) -> bytes | None:
        return self.kmq_message.value

    def headers(self) -> list[tuple[str, bytes]] | None:
        """``[(name, bytes)]``, or None for a record without headers (as confluent-kafka)."""
        return list(self.kmq_message.headers) or None

    def timestamp(self) -> tuple[int, int]:
        """``(TIMESTAMP_CREATE_TIME, ms)``, or ``(TIMESTAMP_NOT_AVAILABLE, -1)``."""
        ts = self.kmq_message.timestamp
        return (TIMESTAMP_NOT_AVAILABLE, -1) if ts is None else (TIMESTAMP_CREATE_TIME, ts)

    def error(self) -> None:
        """Always None: kmq hands over records only (a fetch error is raised by ``poll()``)."""
        return None

    def delivery_count(self) -> int:
        return self.kmq_message.delivery_count

    def latency(self) -> None:
        return None

    def leader_epoch(self) -> None:
        return None

    def __len__(self) -> int:
        value = self.kmq_message.value
        return len(value) if value else 0

    def __repr__(self) -> str:
        m = self.kmq_message
        return f"Message({m.topic}/{m.partition}/{m.offset}, delivery {m.delivery_count})"


class Messages:
    """The batch :meth:`~kmq.share.ShareConsumer.poll` returns: a read-only sequence (iteration,
    ``len()``, indexing, slices) with ``count()``, ``is_empty()`` and ``records()``."""

    __slots__ = ("_records",)

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self._records = list(messages)

    def records(self) -> list[Message]:
        """A copy of the messages of the batch."""
        return list(self._records)

    def count(self) -> int:
        return len(self._records)

    def is_empty(self) -> bool:
        return not self._records

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[Message]:
        return iter(self._records)

    def __getitem__(self, index: Union[int, slice]) -> Union[Message, "Messages"]:
        if isinstance(index, slice):
            return Messages(self._records[index])
        return self._records[index]

    def __repr__(self) -> str:
        return f"Messages({self._records!r})"
