"""The client seam: what kmq needs from a Kafka client, whichever one fetched the records.

kmq speaks to two Python clients: kafka-python (the default and the base
install) and confluent-kafka (librdkafka underneath, several times faster;
the ``confluent`` extra, ``kmq[confluent]``), chosen by ``kafka.client`` in kmq.yaml
(``KMQ_KAFKA__CLIENT``). The marker protocol only needs, from either:

* records as :class:`Record` (topic, partition, offset, key, value, headers, timestamp);
* a consumer as a :class:`ConsumerAdapter`: commit of explicit offsets, seek,
  assignment, pause/resume, the high-water mark seen by the last fetch;
* a producer whose ``send`` returns a :class:`Delivery`-like future
  (``add_callback``/``add_errback``/``add_both``/``get``);
* a :class:`LogReader`: partitions read without a group, each scan walked by
  :class:`kmq.core.scan_cursor.ScanCursor` (the one rule for where a read ends).

This module is pure: it imports no Kafka client. The adapters
(:mod:`kmq.client.kafka_python`, :mod:`kmq.client.confluent`) implement it, and
:mod:`kmq.client.factory` chooses between them; private-API use of a client
stays inside its adapter folder.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Protocol, Sequence

from kmq.client.errors import ClientCommitFailed, ProduceFailed, ProducerFatal
from kmq.core.errors import ClientNotInstalled, ConfigError, install_extra
from kmq.core.ranges import OffsetRange

__all__ = [
    "KAFKA_PYTHON", "CONFLUENT", "AIOKAFKA", "Record", "record_of", "coordinates", "headers_of", "ConsumerAdapter",
    "GroupConsumerAdapter", "Delivery", "ClientCommitFailed", "ProduceFailed", "ProducerFatal", "client_of", "require_client",
    "is_confluent_consumer", "Partition", "ReadResult", "LogEnds", "Deleted", "LogReader", "delivered_at",
    "OutRecord", "SendBatch", "FutureBatch", "ReportedBatch", "UNDECIDED", "READ_UNCOMMITTED", "READ_COMMITTED",
    "LOG_READER_ISOLATION",
]

KAFKA_PYTHON = "kafka-python"
CONFLUENT = "confluent"
#: ``kafka.client: aiokafka``: only :mod:`kmq.aio`'s consumer, on its event loop (:mod:`kmq.client.loop`).
AIOKAFKA = "aiokafka"

#: Isolation levels (the same words in both clients' settings).
READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
#: What every :class:`LogReader` reads at, whatever its overrides: it must see every record a worker on
#: either client could have been handed, also those of a transaction still open or aborted later
#: (read committed, it would stop at the last stable offset below them; docs/protocol.md).
LOG_READER_ISOLATION = READ_UNCOMMITTED

Headers = Sequence[tuple[str, "bytes | None"]]
#: A topic partition, ``(topic, partition)`` (kafka-python's ``TopicPartition`` is one too).
Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Record:
    """One fetched record, the same whichever client fetched it.

    ``timestamp`` is in milliseconds since the epoch (-1 when the broker sent none)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int


def coordinates(record: Any) -> tuple[str, int, int]:
    """``(topic, partition, offset)`` of a :class:`Record`, a kafka-python ``ConsumerRecord``
    or a confluent-kafka ``Message`` (whose fields are methods)."""
    topic = record.topic
    if callable(topic):  # confluent_kafka.Message
        return topic(), record.partition(), record.offset()
    return topic, record.partition, record.offset


def record_of(record: Any) -> Record:
    """The :class:`Record` of any client's record (see :func:`coordinates`)."""
    if isinstance(record, Record):
        return record
    if callable(record.topic):  # confluent_kafka.Message
        _kind, ts = record.timestamp()
        return Record(record.topic(), record.partition(), record.offset(), record.key(), record.value(),
                      record.headers() or [], ts)
    return Record(record.topic, record.partition, record.offset, record.key, record.value,
                  list(record.headers or []), record.timestamp)


def headers_of(record: Any) -> Headers:
    """The headers of any client's record (confluent-kafka returns None for no headers)."""
    headers = record.headers
    if callable(headers):
        return headers() or []
    return headers or []


def delivered_at(metadata: Any) -> tuple[str, int, int]:
    """``(topic, partition, offset)`` of a producer's delivery metadata, whichever client sent it
    (kafka-python's ``RecordMetadata``; the confluent adapter's tuple)."""
    if hasattr(metadata, "offset"):
        return metadata.topic, metadata.partition, metadata.offset
    topic, partition, offset = metadata
    return topic, partition, offset


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What :meth:`LogReader.read` found: records by offset, ``missing``: the requested offsets
    the read passed without finding them (deleted below the log start, or a gap in the log), and
    ``log_end``: the high-water mark when the read ran into the end of the log before every
    requested offset was decided (None: it did not). Offsets at or past ``log_end`` are neither
    found nor missing: the read proves nothing about them (a lagging high-water mark)."""

    records: dict[int, Any]
    missing: list[OffsetRange]
    log_end: int | None = None


@dataclass(frozen=True, slots=True)
class LogEnds:
    """What :meth:`LogReader.log_ends` found: the log end per partition that answered, keyed as
    asked, and why each other one did not (no answer from the broker within the reader's timeout)."""

    ends: dict[Any, int]
    failed: dict[Any, str]


@dataclass(frozen=True, slots=True)
class Deleted:
    """Offsets of a partition deleted (retention) before a read reached them."""

    topic: str
    partition: int
    offsets: OffsetRange


class LogReader(Protocol):
    """Partitions read without joining a group: each read is a fresh assignment walked by a
    :class:`~kmq.core.scan_cursor.ScanCursor`, so its end is the high-water mark of its own fetches.
    Both clients implement it (:func:`kmq.client.factory.open_log_reader` builds one); records have
    :class:`Record`'s attributes. Client failures raise kmq errors: :class:`~kmq.core.errors.LogReadError`
    when the broker gives no answer within the reader's timeout."""

    def read(self, topic: str, partition: int, ranges: Iterable[tuple[int, int]]) -> ReadResult:
        """Records at exactly these offsets; each other offset is reported missing, never a neighbour."""
        ...

    def scan(self, starts: Mapping[Partition, int | None]) -> Iterator[tuple[Partition, list]]:
        """Records of each partition from its start (None: the log start) to the end of its log
        as the scan's first fetch saw it, in batches ``(partition, records)``."""
        ...

    def batches(self, topic: str, partition: int, start: int, stop: int,
                on_deleted: Callable[[Deleted], None]) -> Iterator[list]:
        """Records ``start..stop-1`` of one partition as lists of the client's own records (a Spark
        task builds its columns from them). ``on_deleted`` is told of offsets deleted before the read
        reached them (it may raise); a log that ends before ``stop`` raises
        :class:`~kmq.core.errors.LogReadError`."""
        ...

    def bounds(self, partitions: Iterable[Partition]) -> dict[Partition, tuple[int, int]]:
        """``(log start, log end)`` per partition, the end from a fetch made now."""
        ...

    def high_waters(self, starts: Mapping[Any, int | None]) -> dict[Any, int]:
        """The log end per partition from a fetch made now at the given offset (None: log start);
        keys are returned as given."""
        ...

    def log_ends(self, starts: Mapping[Any, int | None]) -> LogEnds:
        """As :meth:`high_waters`, partition by partition: one whose broker does not answer is listed
        in :attr:`LogEnds.failed` and costs the call at most the reader's timeout, never the others'
        answers (:meth:`high_waters` raises for all). Other client failures raise as there."""
        ...

    def committed(self, group: str, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        """The offsets ``group`` committed (None: none), read without joining the group."""
        ...

    def commit(self, group: str, offsets: Mapping[Partition, int]) -> None:
        """Commit ``offsets`` (next offset to read) for ``group`` without joining it."""
        ...

    def offsets_at(self, partitions: Iterable[Partition], timestamp_ms: int) -> dict[Partition, int | None]:
        """The first offset at or after ``timestamp_ms`` per partition (None: no such record)."""
        ...

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic``; 0 when it does not exist or this client may not see it."""
        ...

    def release(self) -> None:
        """Let go of what the last read kept for a read that continues where it stopped (an
        assignment and records fetched ahead); a reader that keeps nothing does nothing."""
        ...

    def close(self) -> None: ...


class ConsumerAdapter(Protocol):
    """What the marker protocol needs from a consumer (either client).

    Partitions are ``(topic, partition)`` tuples; offsets are the next offset to read."""

    raw: Any
    client: str

    def poll(self, timeout: float, max_records: int) -> list[Record]: ...
    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None: ...
    def assignment(self) -> set[tuple[str, int]]: ...
    def seek(self, topic: str, partition: int, offset: int) -> None: ...
    def pause(self, partitions: Iterable[tuple[str, int]]) -> None: ...
    def resume(self, partitions: Iterable[tuple[str, int]]) -> None: ...
    def highwater(self, topic: str, partition: int) -> int | None: ...
    def close(self) -> None: ...


class GroupConsumerAdapter(ConsumerAdapter, Protocol):
    """What the group members need on top of :class:`ConsumerAdapter`: a group subscription with
    rebalance callbacks, fetching straight into kmq's message objects, commits that do not block the
    fetcher, and the client's own stall handling (kafka-python's workarounds live in its adapter),
    for :class:`~kmq.consumer.consumer.KmqConsumer`; for the tracker, a commit before partitions are
    revoked, the group's committed offsets and positions. Both adapters implement it;
    :func:`group_consumer` builds one.

    Errors: a commit the client did not complete raises :class:`ClientCommitFailed` (``rebalanced``
    when the group moved on); a look-up the broker did not answer raises
    :class:`~kmq.core.errors.BrokerUnavailable`."""

    def subscribe(self, topics: Iterable[str], on_assigned: Callable[[set], None],
                  on_revoked: Callable[[set], None],
                  commit_on_revoke: Callable[[set], Mapping[Partition, int]] | None = None,
                  on_commit_failed: Callable[[ClientCommitFailed], None] | None = None) -> None:
        """Join the group for ``topics``. ``on_assigned``/``on_revoked`` get ``(topic, partition)``
        sets and run inside :meth:`fetch` (a lost assignment counts as revoked). With
        ``commit_on_revoke``, revoked partitions first have the offsets it returns committed,
        synchronously and while they are still this member's; a commit that fails is passed to
        ``on_commit_failed``; ``on_revoked`` follows either way."""
        ...

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = ...,
              wake: threading.Event | None = None) -> list:
        """Up to ``max_records`` records, waiting up to ``timeout`` seconds for the first. ``wake``:
        an event another thread sets when the caller has other work (an answer came); an adapter
        may end a wait early on it, and may ignore it when its own wait is cheap."""
        ...

    def commit_async(self, offsets: Mapping[tuple[str, int], int]) -> Any:
        """Send a commit; returns a future with ``is_done``, ``failed()``, ``exception`` and
        ``add_both(fn)`` (``fn`` runs once it is answered, on any thread)."""
        ...

    def member_id(self) -> str | None: ...
    def watch(self, stall_timeout: float, on_fatal: Callable[[str], None], name: str) -> None: ...
    def unwatch(self) -> None: ...
    def recover_starved(self) -> None: ...

    def committed(self, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        """The offsets this group committed for ``partitions`` (None: none), from the broker."""
        ...

    def position(self, topic: str, partition: int) -> int | None:
        """The offset the next fetch of an assigned partition starts at (a seek's target, else the
        committed offset, else the log start); None when it cannot be told yet."""
        ...

    def seek_to_beginning(self, partitions: Iterable[Partition]) -> None:
        """Read assigned ``partitions`` from the start of their logs on the next fetch."""
        ...


class Delivery:
    """A send's outcome, with the future API kmq uses from kafka-python's ``FutureRecordMetadata``:
    ``add_callback(fn, *args)`` (``fn(*args, metadata)``), ``add_errback(fn, *args)`` (``fn(*args, exc)``),
    ``add_both``, ``get(timeout)``, ``is_done``, ``succeeded()``, ``failed()``, ``exception``."""

    __slots__ = ("_done", "_lock", "_waiter", "_callbacks", "_errbacks", "value", "exception")

    def __init__(self) -> None:
        # Cheap to make (one per record sent): a lock, and an Event only when someone waits.
        self._done = False
        self._lock = threading.Lock()
        self._waiter: threading.Event | None = None
        self._callbacks: list[tuple[Callable[..., Any], tuple]] = []
        self._errbacks: list[tuple[Callable[..., Any], tuple]] = []
        self.value: Any = None
        self.exception: BaseException | None = None

    @property
    def is_done(self) -> bool:
        return self._done

    def succeeded(self) -> bool:
        return self._done and self.exception is None

    def failed(self) -> bool:
        return self._done and self.exception is not None

    def success(self, value: Any) -> None:
        self._settle(value, None)

    def failure(self, exc: BaseException) -> None:
        self._settle(None, exc)

    def _settle(self, value: Any, exc: BaseException | None) -> None:
        with self._lock:
            if self._done:
                return
            self.value, self.exception = value, exc
            self._done = True
            calls = self._errbacks if exc is not None else self._callbacks
            self._callbacks, self._errbacks = [], []
            waiter = self._waiter
        if waiter is not None:
            waiter.set()
        for fn, args in calls:
            fn(*args, exc if exc is not None else value)

    def add_callback(self, fn: Callable[..., Any], *args: Any) -> "Delivery":
        with self._lock:
            if not self._done:
                self._callbacks.append((fn, args))
                return self
        if self.exception is None:
            fn(*args, self.value)
        return self

    def add_errback(self, fn: Callable[..., Any], *args: Any) -> "Delivery":
        with self._lock:
            if not self._done:
                self._errbacks.append((fn, args))
                return self
        if self.exception is not None:
            fn(*args, self.exception)
        return self

    def add_both(self, fn: Callable[..., Any], *args: Any) -> "Delivery":
        self.add_callback(fn, *args)
        self.add_errback(fn, *args)
        return self

    def get(self, timeout: float | None = None) -> Any:
        """The delivery's metadata; raises the failure, or :class:`ProduceFailed` on timeout."""
        if not self._done:
            with self._lock:
                if not self._done and self._waiter is None:
                    self._waiter = threading.Event()
                waiter = self._waiter
            if waiter is not None and not waiter.wait(timeout):
                raise ProduceFailed(f"no delivery report within {timeout}s")
        if self.exception is not None:
            raise self.exception
        return self.value


# ---------------------------------------------------------------- many sends at once


class OutRecord(NamedTuple):
    """One record to produce to an explicit partition (a batch of them:
    :func:`kmq.client.factory.send_many`). A tuple: one is made per record sent."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


#: The verdict of a send the producer has not decided yet.
UNDECIDED: Any = type("Undecided", (), {"__repr__": lambda self: "UNDECIDED"})()


class SendBatch(Protocol):
    """Sends started together (:func:`kmq.client.factory.send_many`); once the producer is flushed,
    ``verdict(i)`` is the verdict on the ``i``-th: None (acknowledged), the exception that failed it
    (refused before it left, or by the broker), or :data:`UNDECIDED`."""

    def __len__(self) -> int: ...

    def verdict(self, i: int) -> Any: ...


class FutureBatch:
    """A :class:`SendBatch` over one future per send (any producer whose ``send`` returns one)."""

    __slots__ = ("_futures",)

    def __init__(self, futures: list[Any]) -> None:
        self._futures = futures  # a future, or the exception ``send`` raised

    def __len__(self) -> int:
        return len(self._futures)

    def verdict(self, i: int) -> Any:
        fut = self._futures[i]
        if isinstance(fut, BaseException):
            return fut
        if not fut.is_done:
            return UNDECIDED
        try:
            fut.get(timeout=0)
        except Exception as exc:  # noqa: BLE001 - the send's failure is its verdict
            return exc
        return None


class ReportedBatch:
    """A :class:`SendBatch` whose verdicts a producer writes into a list as its delivery reports
    come in (no future per send: a list slot, filled from the client's report thread)."""

    __slots__ = ("verdicts",)

    def __init__(self, n: int) -> None:
        self.verdicts: list[Any] = [UNDECIDED] * n

    def __len__(self) -> int:
        return len(self.verdicts)

    def verdict(self, i: int) -> Any:
        return self.verdicts[i]


# ---------------------------------------------------------------- choosing the client


def client_of(kafka: Any) -> str:
    """The client ``kafka.client`` names (``kafka-python`` or ``confluent``)."""
    return getattr(kafka, "client", KAFKA_PYTHON) or KAFKA_PYTHON


def require_client(name: str) -> None:
    """Raise :class:`~kmq.core.errors.ClientNotInstalled` when ``name`` is chosen but not importable,
    and :class:`~kmq.core.errors.ConfigError` for aiokafka (only :mod:`kmq.aio`'s consumer runs on it;
    it builds its clients through :mod:`kmq.client.loop`, never here)."""
    if name == AIOKAFKA:
        raise ConfigError("kafka.client", "aiokafka is only for kmq.aio's AsyncKmqConsumer (its clients run on the "
                          "event loop); set kafka.client: kafka-python or confluent for this component "
                          "(KMQ_KAFKA__CLIENT), e.g. in its own configuration")
    if name == CONFLUENT and importlib.util.find_spec("confluent_kafka") is None:
        raise ClientNotInstalled(
            f"kafka.client is confluent but confluent-kafka is not installed; {install_extra('confluent')} "
            "or set kafka.client: kafka-python (KMQ_KAFKA__CLIENT)"
        )


def is_confluent_consumer(consumer: Any) -> bool:
    """True for a confluent-kafka ``Consumer`` (or subclass), decided without importing confluent-kafka."""
    return any(c.__module__.split(".")[0] in ("confluent_kafka", "cimpl") and c.__name__ == "Consumer"
               for c in type(consumer).__mro__)
