"""``kmq.share.ShareConsumer``: confluent-kafka's share-consumer API on any Kafka.

The API of ``confluent_kafka.ShareConsumer`` (KIP-932 share groups): the same
constructor dict, methods, acknowledgement modes, exception names and message
interface, backed by :class:`~kmq.consumer.consumer.KmqConsumer` (START and END
markers, the tracker, the DLQ). Code written for the native share consumer runs
on a cluster without share groups by changing its import; docs/share-consumer.md
says where the two differ and how to move a queue between them.

The mapping: ``poll()`` is ``KmqConsumer.poll`` (every record's START is in
Kafka before it is returned); ``ACCEPT`` is ``ack()``, ``RELEASE`` ``nack(0)``
(redelivered by the tracker at once, delivery count one higher), ``REJECT``
``reject()`` (dead-lettered); a record ``close()`` releases unacknowledged keeps its
delivery count (a NACK "not a delivery"; docs/share-consumer.md says where native differs); a record not acknowledged within the lock (the
queue's lease, ``kmq.lease.ms``) is redelivered by the tracker. Which
acknowledgements each call applies is :mod:`kmq.share.acknowledgements`;
"commit" means: their markers are written and acknowledged by Kafka.

As natively, ``subscribe`` does not wait for a broker: while none answers, ``poll``
tries again and reports each failure to the dict's ``error_cb``
(:mod:`kmq.share.connection`).

Like the native consumer it is not thread-safe (a call from a second thread
while one runs raises :class:`~kmq.core.errors.ConcurrentModificationException`)
and the acknowledgement-commit callback runs on the application thread, inside
``poll``, ``commit_sync``, ``commit_async`` or ``close``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from typing import Any, Callable, Mapping

from kmq.config import Config
from kmq.consumer.consumer import KmqConsumer
from kmq.core import settlement
from kmq.core.message import ack_all
from kmq.core.errors import (
    ConcurrentModificationException,
    IllegalStateException,
    KafkaException,
    KmqError,
    MarkerWriteError,
    MessageAlreadySettled,
)
from kmq.share.acknowledgements import (
    KMQ_REJECT_REASON,
    Due,
    due,
    due_on_leave,
    offsets_by_partition,
    unacknowledged,
)
from kmq.share.connection import Backoff, errors_of, is_transport, require_reachable
from kmq.share.settings import AckMode, read_settings
from kmq.share.types import AcknowledgeType, KafkaError, Message, Messages, TopicPartition

__all__ = ["ShareConsumer", "CommitCallback"]

log = logging.getLogger(__name__)

#: ``callback(offsets, exception)``: ``{TopicPartition: {offsets}}`` and None or a KafkaException.
CommitCallback = Callable[[dict[TopicPartition, set[int]], KafkaException | None], None]

_CLOSED = "Share consumer closed"


def _open_queue(cfg: Config, topic: str, max_records: int) -> KmqConsumer:
    require_reachable(cfg.kafka)  # fast: a client would wait kafka.connect_timeout to find no broker
    return KmqConsumer(cfg, topic, batch_size=max_records)


def _ack_type(ack_type: Any) -> AcknowledgeType:
    if isinstance(ack_type, bool) or not isinstance(ack_type, int):
        raise TypeError(f"ack_type must be an AcknowledgeType, got {type(ack_type).__name__}")
    try:
        return AcknowledgeType(ack_type)
    except ValueError:
        raise ValueError(f"invalid ack_type {ack_type}: expected ACCEPT (1), RELEASE (2) or REJECT (3)") from None


#: What acknowledge() records per type: (type, kmq argument: the nack delay of RELEASE, the DLQ reason of REJECT).
_ACKS: dict[AcknowledgeType, tuple[AcknowledgeType, Any]] = {
    AcknowledgeType.ACCEPT: (AcknowledgeType.ACCEPT, None),
    AcknowledgeType.RELEASE: (AcknowledgeType.RELEASE, 0.0),
    AcknowledgeType.REJECT: (AcknowledgeType.REJECT, KMQ_REJECT_REASON),
}


def _seconds(timeout: Any, what: str) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(timeout).__name__}")
    return float(timeout)


class _Call:
    """The call discipline of a share consumer (``with consumer._call("poll"):``): one thread at a
    time, nothing from inside the commit callback, nothing after close. A class rather than a
    generator context manager: explicit mode enters it once per record. It holds the closed flag
    itself, not its consumer: no reference cycle, so a consumer dropped without ``close()`` is
    finalised (and leaves its group) as soon as its last reference goes."""

    __slots__ = ("_lock", "owner", "in_callback", "what", "closed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None
        self.in_callback = False
        self.what = ""
        self.closed = False

    def __enter__(self) -> None:
        # ``owner`` is the thread running the callback, set with ``in_callback``: no thread id is
        # read per call (explicit mode makes one call per record).
        if self.in_callback and self.owner == threading.get_ident():
            raise IllegalStateException(f"{self.what}() called from inside the acknowledgement commit callback")
        if not self._lock.acquire(blocking=False):
            raise ConcurrentModificationException(
                f"{self.what}() called while another thread is inside a call of this share consumer; "
                "it is not thread-safe: use one consumer per thread")
        if self.closed:
            self._lock.release()
            raise IllegalStateException(_CLOSED)

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _Subscription:
    """The queue consumer of a subscription, shared with the finaliser of its share consumer."""

    __slots__ = ("queue", "topic")

    def __init__(self) -> None:
        self.queue: Any = None
        self.topic: str | None = None


def _close_dropped(sub: _Subscription) -> None:
    """A share consumer was garbage-collected without ``close()``: close its queue consumer (leave the
    group, give never-handed messages back) on a thread of its own, since a collection can run on any
    thread, the consumer's own included, and closing waits for them. The last poll's records are left
    to their locks (the tracker redelivers them), as a dropped native consumer's are."""
    queue, topic, sub.queue = sub.queue, sub.topic, None
    if queue is None:
        return
    log.warning("a kmq.share.ShareConsumer of %s was garbage-collected without close(): closing it, so it leaves "
                "the group; records it returned and nobody acknowledged are redelivered when their locks end", topic)
    try:
        threading.Thread(target=queue.close, name=f"kmq-share-close-{topic}").start()
    except RuntimeError:  # the interpreter is shutting down: its threads end with it
        log.debug("not closing the dropped share consumer of %s: interpreter shutting down", topic)


class ShareConsumer:
    """A share consumer (``confluent_kafka.ShareConsumer``'s API) over a kmq queue.

    ::

        from kmq.share import ShareConsumer, AcknowledgeType   # native: from confluent_kafka import ...

        with ShareConsumer({"bootstrap.servers": "kafka:9092", "group.id": "orders-workers",
                            "share.acknowledgement.mode": "explicit"}) as consumer:
            consumer.subscribe(["orders"])
            while running:
                for msg in consumer.poll(timeout=1.0):
                    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)

    :param config: the native consumer's dict (``bootstrap.servers``, ``group.id``,
        ``share.acknowledgement.mode``, ``max.poll.records``, security keys) plus kmq's keys
        (``kmq.lease.ms``, ``kmq.kafka.client``, ``kmq.config``, ...;
        :mod:`kmq.share.settings`). Keyword arguments are merged into it, as natively.

    Methods beyond the native API are named ``kmq_*`` (:meth:`kmq_release`,
    :meth:`kmq_reject`, :meth:`kmq_renew`); code that calls them runs on kmq only.
    """

    #: Opens the queue consumer of a subscription; tests replace it.
    open_queue: Callable[[Config, str, int], Any] = staticmethod(_open_queue)

    def __init__(self, config: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        if config is None and not kwargs:
            raise TypeError("expected configuration dict")
        conf = {**(config or {}), **kwargs}
        self._settings = read_settings(conf)
        self._mode = self._settings.mode
        self._sub = _Subscription()  # the KmqConsumer of the subscribed topic
        #: Subscribed, queue not open yet (no broker answered): its configuration and retry timing.
        self._cfg: Config | None = None
        self._backoff: Backoff | None = None
        #: Connection errors for ``error_cb``, served by the next poll (as natively).
        self._errors: list[KafkaError] = []
        self._warned = False
        self._batch: list[Message] = []  # the last poll's records (in flight until applied)
        self._poll_token = object()
        self._by_coordinates: dict[tuple[str, int, int], Message] | None = None
        self._callback: CommitCallback | None = None
        #: Applied acknowledgements awaiting their callback: (offsets, markers given up before).
        self._unreported: list[tuple[dict[TopicPartition, set[int]], int]] = []
        #: Their outcome once known (written, or failed), for the callback of the next call.
        self._settled: list[tuple[dict[TopicPartition, set[int]], KafkaException | None]] = []
        self._guard = _Call()
        # Dropped without close(): its queue consumer is closed all the same (else its fetcher thread
        # keeps it in the group). Not at interpreter exit: a consumer still referenced then is the
        # application's to close, and a closing thread started then would not be waited for.
        self._finalizer = weakref.finalize(self, _close_dropped, self._sub)
        self._finalizer.atexit = False

    @property
    def _closed(self) -> bool:
        return self._guard.closed

    # ------------------------------------------------------------ call discipline
    def _call(self, what: str) -> "_Call":
        self._guard.what = what
        return self._guard

    def _connect(self) -> bool:
        """Try to open the subscribed queue's consumer. A broker that does not answer is reported
        (``error_cb``, from the next poll) and tried again after the backoff; anything else raises."""
        assert self._cfg is not None and self._backoff is not None and self._sub.topic is not None
        try:
            self._sub.queue = self.open_queue(self._cfg, self._sub.topic, self._settings.max_poll_records)
        except BaseException as exc:
            self._backoff.failed(time.monotonic())
            if not is_transport(exc):
                raise
            self._errors += errors_of(exc)
            return False
        self._cfg = self._backoff = None
        self._warned = False
        return True

    def _connect_until(self, deadline: float | None) -> Any:
        """The queue consumer once a broker answers, trying until ``deadline`` (None: no limit);
        None at the deadline. Reports each failed try to ``error_cb`` on the way."""
        backoff = self._backoff
        if backoff is None:
            raise IllegalStateException("not subscribed: call subscribe([topic]) before poll()")
        while True:
            if backoff.due(time.monotonic()) and self._connect():
                return self._sub.queue
            self._serve_errors()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            pause = backoff.next_try - now if deadline is None else min(backoff.next_try, deadline) - now
            if pause > 0:
                time.sleep(pause)  # the reconnect backoff (at most 1 s) or the rest of the poll

    def _serve_errors(self) -> None:
        errors, self._errors = self._errors, []
        callback = self._settings.error_cb
        for error in errors:
            if callback is not None:
                callback(error)
            elif not self._warned:
                log.warning("share consumer of %s: %s (retrying; set error_cb to see every error)",
                            self._sub.topic, error.str())
                self._warned = True
            else:
                log.debug("share consumer of %s: %s", self._sub.topic, error.str())

    # ------------------------------------------------------------ subscription
    def subscribe(self, topics: list[str]) -> None:
        """Consume ``topics`` (exactly one: kmq consumes one queue per consumer; ``[]`` = :meth:`unsubscribe`).
        The queue's markers and DLQ topics must exist (``kmq topics create``)."""
        with self._call("subscribe"):
            if not isinstance(topics, list):
                raise TypeError(f"expected list of topic names, got {type(topics).__name__}")
            if any(not isinstance(t, str) or not t for t in topics) or len(set(topics)) != len(topics):
                raise ValueError(f"topic names must be non-empty and distinct, got {topics!r}")
            if len(topics) > 1:
                raise ValueError(f"kmq.share.ShareConsumer consumes one queue per consumer, got {topics!r}: "
                                 "create one ShareConsumer per topic")
            if topics and topics[0] == self._sub.topic:
                return
            self._leave(closing=False)
            if topics:
                self._cfg = self._settings.config_for(topics[0])
                self._sub.topic, self._backoff = topics[0], Backoff()
                try:
                    self._connect()  # no broker: subscribed all the same; poll() tries again
                except BaseException:
                    self._sub.topic = self._cfg = self._backoff = None
                    raise

    def unsubscribe(self) -> None:
        """Send what is due (implicit mode: accept the last poll's records; explicit: what was
        acknowledged, releasing the rest) and leave the group (a no-op when not subscribed)."""
        with self._call("unsubscribe"):
            self._leave(closing=False)

    def subscription(self) -> list[str]:
        with self._call("subscription"):
            return [self._sub.topic] if self._sub.topic else []

    def _leave(self, closing: bool) -> None:
        """End the subscription: apply what a subscription change (or ``closing``) settles, wait
        for the markers, close the queue consumer. The callback is left to the next call, as natively."""
        queue = self._sub.queue
        self._cfg = self._backoff = None
        if queue is None:
            self._sub.topic = None
            return
        try:
            self._apply(due_on_leave(self._batch, self._mode, closing))
            self._batch = []
            if self._unreported:
                self._settle_unreported(self._flush(None))
        finally:
            self._sub.queue = self._sub.topic = None
            queue.close()

    # ------------------------------------------------------------ polling
    def poll(self, timeout: float = -1) -> Messages:
        """The next batch (at most ``max.poll.records``), empty after ``timeout`` seconds
        (-1: wait until there is one). Applies the acknowledgements due first: in implicit
        mode the last poll's records are accepted; in explicit mode every one of them must
        have been acknowledged (else :class:`IllegalStateException`)."""
        with self._call("poll"):
            wait = _seconds(timeout, "timeout")
            deadline = None if wait < 0 else time.monotonic() + wait
            queue = self._sub.queue if self._sub.queue is not None else self._connect_until(deadline)
            if queue is None:  # no broker answered by the deadline: nothing, as natively
                self._report(0.0)
                return Messages([])
            if self._mode is AckMode.EXPLICIT:
                left = unacknowledged(self._batch)
                if left:
                    raise IllegalStateException(
                        f"{left} record(s) of the previous poll are not acknowledged; in explicit mode "
                        "acknowledge() every record before polling again")
            self._apply(due(self._batch, self._mode))
            self._batch = []
            if self._unreported:
                queue.writer.flush_buffer()  # sent now: their callback can come within this poll
            records = self._take(queue, deadline)
            # Natively the acknowledgements go out with the fetch and their callback comes back with
            # its answer, in this poll: wait for the markers within what is left of the timeout.
            self._report(None if deadline is None else max(0.0, deadline - time.monotonic()))
            token = self._poll_token = object()
            self._by_coordinates = None
            self._batch = [Message(m, token) for m in records]
            return Messages(self._batch)

    def _take(self, queue: Any, deadline: float | None) -> list[Any]:
        records: list[Any]
        try:
            if deadline is not None:
                records = queue.poll(max(0.0, deadline - time.monotonic()), self._settings.max_poll_records)
                return records
            while True:
                records = queue.poll(1.0, self._settings.max_poll_records)
                if records:
                    return records
        except KmqError as exc:
            raise KafkaException(KafkaError(KafkaError._FAIL, str(exc), exc.retriable)) from exc

    # ------------------------------------------------------------ acknowledging
    def acknowledge(self, message: Message, ack_type: AcknowledgeType = AcknowledgeType.ACCEPT) -> None:
        """Record how ``message`` is settled (explicit mode); sent with the next poll, commit or close.
        Acknowledging again before then replaces the type."""
        with self._call("acknowledge"):
            if type(message) is not Message and not isinstance(message, Message):
                raise TypeError(f"expected a Message returned by poll(), got {type(message).__name__}")
            # The recorded (type, kmq argument) pairs are shared: no enum lookup or tuple per record.
            self._record(message, _ACKS[ack_type if type(ack_type) is AcknowledgeType else _ack_type(ack_type)])

    def acknowledge_offset(self, topic: str, partition: int, offset: int,
                           ack_type: AcknowledgeType = AcknowledgeType.ACCEPT) -> None:
        """:meth:`acknowledge` by coordinates (of a record of the last poll)."""
        with self._call("acknowledge_offset"):
            if not isinstance(topic, str):
                raise TypeError(f"topic must be a str, got {type(topic).__name__}")
            for name, v in (("partition", partition), ("offset", offset)):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise TypeError(f"{name} must be an int, got {type(v).__name__}")
                if v < 0:
                    raise ValueError(f"{name} must be >= 0, got {v}")
            ack = _ACKS[_ack_type(ack_type)]
            if self._by_coordinates is None:
                self._by_coordinates = {(m.topic(), m.partition(), m.offset()): m for m in self._batch}
            message = self._by_coordinates.get((topic, partition, offset))
            if message is None:
                raise IllegalStateException(f"{topic}/{partition}/{offset} is not in flight on this consumer "
                                            "(not returned by the last poll)")
            self._record(message, ack)

    def _in_flight(self, message: Message, what: str) -> None:
        if message._poll is not self._poll_token or message._applied:
            raise IllegalStateException(f"{message!r} is not in flight on this consumer (acknowledged and sent "
                                        f"already, or not returned by the last poll); {what} refused")

    def _record(self, message: Message, ack: tuple[AcknowledgeType, Any]) -> None:
        if self._mode is not AckMode.EXPLICIT:
            raise IllegalStateException("acknowledge() needs share.acknowledgement.mode=explicit; in implicit "
                                        "mode records are accepted by the next poll or commit")
        if message._poll is not self._poll_token or message._applied:
            self._in_flight(message, "acknowledgement")
        message._note(ack)

    def _apply(self, dues: list[Due], results: bool = False) -> dict[TopicPartition, set[int]]:
        """Settle ``dues`` on their kmq messages (buffered markers, no I/O). Returns what was applied
        when ``results`` is asked for or a callback will report it (else ``{}``: poll's hot path)."""
        if not dues:
            return {}
        accepted: list[Any] = []  # a run of accepts, settled together under one lock acquisition
        for m, kind, arg in dues:
            km = m._applying()
            if kind is AcknowledgeType.ACCEPT:
                accepted.append(km)
                continue
            if accepted:  # in the batch's order: the run before this one first
                self._accept(accepted)
                accepted = []
            try:
                if isinstance(arg, settlement.Released):  # released by close(): not a delivery
                    km._give_back(arg)
                elif kind is AcknowledgeType.RELEASE:
                    km.nack(arg)
                else:
                    km.reject(arg)
            except MessageAlreadySettled:  # settled through m.kmq_message by the application: its own call stands
                log.debug("%r was settled directly; its %s is not applied", m, kind.name)
        if accepted:
            self._accept(accepted)
        if not results and self._callback is None:
            return {}
        applied = offsets_by_partition(m for m, _, _ in dues)
        if self._callback is not None:
            self._unreported.append((applied, self._queue_writer_failures()))
        return applied

    @staticmethod
    def _accept(messages: list[Any]) -> None:
        for km in ack_all(messages):  # settled through kmq_message by the application: its own call stands
            log.debug("%r was settled directly; its ACCEPT is not applied", km)

    # ------------------------------------------------------------ committing
    def commit_sync(self, timeout: float = 60) -> dict[TopicPartition, KafkaException | None]:
        """Apply the pending acknowledgements (implicit mode: the last poll's records) and wait,
        at most ``timeout`` seconds (-1: the writer's own limit), until their markers are in Kafka.
        Returns ``{TopicPartition: None}`` on success, a :class:`KafkaException` per partition
        whose markers were not acknowledged in time (they are retried; if they never arrive the
        tracker redelivers those records); ``{}`` when nothing was pending (also when not
        subscribed, as natively)."""
        with self._call("commit_sync"):
            wait = _seconds(timeout, "timeout")
            if self._sub.queue is None:
                self._report(0.0)
                return {}
            applied = self._apply(due(self._batch, self._mode), results=True)
            if not applied and not self._unreported:
                self._report(0.0)
                return {}
            error = self._flush(None if wait < 0 else wait)
            self._settle_unreported(error)
            self._report(0.0)
            return {tp: error for tp in applied}

    def commit_async(self) -> None:
        """Apply the pending acknowledgements and send their markers without waiting; the
        commit callback reports them from a later call. Does nothing when not subscribed (as natively)."""
        with self._call("commit_async"):
            queue = self._sub.queue
            if queue is None:
                self._report(0.0)
                return
            self._apply(due(self._batch, self._mode))
            queue.writer.flush_buffer()
            self._report(0.0)

    def set_acknowledgement_commit_callback(self, callback: CommitCallback | None) -> None:
        """``callback(offsets, exception)`` once applied acknowledgements are written (or failed),
        called on this thread from ``poll``, ``commit_sync``, ``commit_async`` or ``close``;
        None clears it."""
        with self._call("set_acknowledgement_commit_callback"):
            if callback is not None and not callable(callback):
                raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
            self._callback = callback
            if callback is None:
                self._unreported.clear()
                self._settled.clear()

    def _queue_writer_failures(self) -> int:
        return self._sub.queue.writer.failed_writes if self._sub.queue is not None else 0

    def _flush(self, timeout: float | None) -> KafkaException | None:
        try:
            self._sub.queue.writer.flush(timeout)
        except MarkerWriteError as exc:
            err = KafkaException(KafkaError(KafkaError._TIMED_OUT, str(exc), retriable=True))
            err.__cause__ = exc
            return err
        return None

    def _settle_unreported(self, error: KafkaException | None) -> None:
        self._settled += [(offsets, error) for offsets, _ in self._unreported]
        self._unreported = []

    def _report(self, timeout: float | None) -> None:
        """Call back for applied acknowledgements whose markers are written (or given up), waiting
        at most ``timeout`` seconds for them (None: until the writer gives up)."""
        if self._unreported and self._sub.queue is not None:
            error = self._flush(timeout)
            # A failure is reported at once when a marker was given up (else it may still arrive).
            if error is None or timeout is None or self._queue_writer_failures() > min(f for _, f in self._unreported):
                self._settle_unreported(error)
        callback, todo, self._settled = self._callback, self._settled, []
        if callback is None or not todo:
            return
        self._guard.owner = threading.get_ident()
        self._guard.in_callback = True
        try:
            for offsets, error in todo:
                callback(offsets, error)
        finally:
            self._guard.in_callback = False

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """Use these SASL PLAIN/SCRAM credentials from the next :meth:`subscribe` on (kmq's clients
        are opened by subscribe: the running subscription keeps the credentials it logged in with)."""
        with self._call("set_sasl_credentials"):
            if not isinstance(username, str) or not isinstance(password, str):
                raise TypeError("username and password must be str")
            kafka = {**self._settings.sections.get("kafka", {}), "sasl_username": username, "sasl_password": password}
            self._settings = dataclasses.replace(self._settings, sections={**self._settings.sections, "kafka": kafka})

    # ------------------------------------------------------------ kmq extras (not in the native API)
    @property
    def kmq_consumer(self) -> KmqConsumer | None:
        """kmq extra: the :class:`~kmq.consumer.consumer.KmqConsumer` of the subscription (its
        ``in_flight()``, ``writer``, metrics), None when not subscribed."""
        queue: KmqConsumer | None = self._sub.queue
        return queue

    def kmq_release(self, message: Message, delay: float) -> None:
        """kmq extra: ``RELEASE`` with a redelivery delay in seconds (a NACK with that delay)."""
        with self._call("kmq_release"):
            settlement.delay_ms(delay)  # InvalidSettlement (a ValueError) before anything is recorded
            self._record(message, (AcknowledgeType.RELEASE, float(delay)))

    def kmq_reject(self, message: Message, reason: str) -> None:
        """kmq extra: ``REJECT`` with a reason (the dead letter's ``kmq-dlq-error`` header)."""
        with self._call("kmq_reject"):
            self._record(message, (AcknowledgeType.REJECT, settlement.reject_reason(reason)))

    def kmq_renew(self, message: Message, lease: float | None = None) -> None:
        """kmq extra: extend the lock of a record in flight to now + ``lease`` seconds (default:
        the queue's lease). Native share groups cannot renew a lock (confluent-kafka 2.16)."""
        with self._call("kmq_renew"):
            self._in_flight(message, "renewal")
            message.kmq_message.renew(lease)

    # ------------------------------------------------------------ closing
    def close(self) -> None:
        """Apply what was acknowledged, release the rest of the last poll (redelivered at once, with
        the delivery count it had: not a delivery), wait for the markers, call back, leave the group. A second call does nothing."""
        if self._closed:
            return
        with self._call("close"):
            try:
                self._leave(closing=True)
                self._report(0.0)
            finally:
                self._guard.closed = True
                self._finalizer.detach()

    def __enter__(self) -> "ShareConsumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
