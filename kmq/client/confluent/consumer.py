"""The confluent-kafka side of the client seam (:mod:`kmq.client.api`).

Needs the ``confluent`` extra (``kmq[confluent]``). Builds clients from the librdkafka settings of
:mod:`kmq.client.confluent.settings`, wraps ``confluent_kafka.Consumer``
as a :class:`~kmq.client.api.ConsumerAdapter` and ``confluent_kafka.Producer``
behind kafka-python's ``send() -> future`` shape, so the marker sender, the
tracker and the Spark source use either client through one API.

Only public confluent-kafka API is used. Send and flush failures are raised
as kmq's error classes (:mod:`kmq.client.errors`, by Kafka's error code, the
same numbers on both clients; :mod:`kmq.client.confluent.errors`), so the code
that classifies failures (permanent or not, too large, unauthorised) serves both.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from functools import partial
from typing import Any, Callable, Iterable, Mapping, Sequence

from kmq.client.api import (
    CONFLUENT,
    ClientCommitFailed,
    Delivery,
    OutRecord,
    Partition,
    ProduceFailed,
    ProducerFatal,
    Record,
    ReportedBatch,
    require_client,
)
from kmq.config import KafkaConfig
from kmq.core.errors import BrokerUnavailable
from kmq.client.confluent.errors import as_kmq_error, client_error
from kmq.client.confluent.fatal import FatalState
from kmq.client.confluent.flush_settlement import FlushSettlement
from kmq.client.confluent.log_bridge import LibrdkafkaLogBridge
from kmq.client.confluent.settings import FETCH_QUEUE_BACKOFF_MS, construct, passthrough, settings

require_client(CONFLUENT)  # the one clear error when the extra is missing

import confluent_kafka as ck  # noqa: E402
from confluent_kafka import KafkaError, KafkaException, TopicPartition  # noqa: E402

__all__ = ["ConfluentConsumer", "ConfluentProducer", "producer", "consumer"]

log = logging.getLogger(__name__)

# Error codes that mean "the group moved on": the partitions belong to another member now.
_REBALANCED = {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
               KafkaError._ASSIGNMENT_LOST, KafkaError._STATE, KafkaError.FENCED_INSTANCE_ID}


class ConfluentProducer:
    """``confluent_kafka.Producer`` with kafka-python's ``send(...) -> future`` shape.

    A daemon thread serves delivery reports (``poll``), so futures complete
    without the caller polling, as with kafka-python's I/O thread.

    With ``settle_on_flush`` the verdicts (futures and :meth:`send_many`'s batches) are given
    only when a :meth:`flush` leaves nothing in the queue, and librdkafka reports failures only:
    no callback object per record (see :mod:`kmq.client.confluent.flush_settlement`). One
    thread then sends and flushes.

    A fatal error (:mod:`kmq.client.confluent.fatal`) is kept in :attr:`fatal`: later sends fail
    with it (:class:`~kmq.client.api.ProducerFatal`), records no report names are not vouched for
    (they fail with it too), and the owner replaces the producer."""

    is_confluent = True

    def __init__(self, conf: dict[str, Any], settle_on_flush: bool = False) -> None:
        self._settlement: FlushSettlement | None = None
        if settle_on_flush:
            self._settlement = FlushSettlement(as_kmq_error)
            conf = {**conf, "delivery.report.only.error": True, "on_delivery": self._settlement.report}
        self.raw = ck.Producer(conf)
        self._log_bridge = conf.get("logger")
        self._fatal = FatalState()
        self._closed = threading.Event()
        # Held by the serving thread while it polls: a failure it took from the queue is recorded
        # before a flush infers that the records no failure names were acknowledged.
        self._serving = threading.Lock()
        self._poller = threading.Thread(target=self._serve if self._settlement is None else self._serve_locked,
                                        name="kmq-confluent-producer", daemon=True)
        self._poller.start()

    @property
    def fatal(self) -> ProducerFatal | None:
        """The fatal error this producer reported (then it sends nothing more), or None."""
        return self._fatal.error

    def _served(self, serve: Callable[[float], int], timeout: float) -> int:
        """``serve(timeout)``: the handle's ``poll`` or ``flush``. The fatal error either may raise is
        kept, not raised (librdkafka serves it once); what is left in the queue is returned then."""
        try:
            return serve(timeout)
        except:  # noqa: E722 - only the fatal error is taken (it can come as no BaseException, see fatal.py)
            if not self._fatal.note(sys.exc_info()[1]):
                raise
            return len(self.raw)

    def _poll(self, timeout: float) -> int:
        return self._served(self.raw.poll, timeout)

    def _serve(self) -> None:
        while not self._closed.is_set():
            self._poll(0.05)

    def _serve_locked(self) -> None:
        # poll(0) under the lock, never a wait in it: a flush waits for the lock at most one serving.
        while not self._closed.is_set():
            with self._serving:
                served = self._poll(0)
            if not served:
                self._closed.wait(0.05)

    def _refused(self, err: Any, topic: str) -> Exception:
        """The error of a record ``produce`` refused with ``err`` (before it left)."""
        return self._fatal.refused(err) or as_kmq_error(err, f"{topic}: ")

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
             headers: Any = None, timestamp_ms: int | None = None) -> Delivery:
        fut = Delivery()
        settlement = self._settlement
        kw: dict[str, Any] = {"value": value, "key": key}
        if settlement is None:
            def report(err: Any, msg: Any) -> None:
                if err is not None:
                    fut.failure(as_kmq_error(err, f"{topic}: "))
                else:
                    fut.success((msg.topic(), msg.partition(), msg.offset()))

            kw["on_delivery"] = report
        if partition is not None:
            kw["partition"] = partition
        if headers:
            kw["headers"] = list(headers)
        if timestamp_ms is not None:
            kw["timestamp"] = timestamp_ms
        while True:
            try:
                self.raw.produce(topic, **kw)
                break
            except BufferError:  # local queue full: wait for deliveries to drain it
                self._poll(0.05)
            except KafkaException as exc:  # refused before it left (too large, unknown partition, fatal)
                raise self._refused(exc.args[0], topic) from exc
        if settlement is not None:  # its verdict comes with the next complete flush
            settlement.future(fut, topic, partition, key, value, kw.get("headers"))
        return fut

    def send_many(self, records: Sequence[OutRecord]) -> ReportedBatch:
        """Start producing ``records``; their verdicts arrive in the returned batch (see
        :class:`~kmq.client.api.ReportedBatch`): one list slot a record, no future, no lock."""
        batch = ReportedBatch(len(records))
        verdicts, produce, poll = batch.verdicts, self.raw.produce, self._poll
        settled = self._settlement is not None
        if settled:
            self._settlement.batch(records, verdicts)  # type: ignore[union-attr]
        for i, (topic, partition, key, value, headers) in enumerate(records):
            report = None if settled else partial(_report_into, verdicts, i)
            while True:
                try:
                    # produce(topic, value, key, partition, callback, on_delivery, timestamp, headers):
                    # positional, as keywords cost a sixth of the call (timestamp 0: now; headers None: none).
                    produce(topic, value, key, partition, report, None, 0, headers)  # type: ignore[arg-type]  # list invariance
                    break
                except BufferError:  # local queue full: wait for deliveries to drain it
                    poll(0.05)
                except KafkaException as exc:  # refused before it left (too large, unknown partition, fatal)
                    verdicts[i] = self._refused(exc.args[0], topic)
                    break
        return batch

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every record sent so far (at most ``timeout``). Raises :class:`~kmq.client.errors.ProduceFailed` for
        what is left, :class:`~kmq.client.api.ProducerFatal` when the producer became fatal during
        this flush (what it had not delivered fails with it)."""
        began, known = time.monotonic(), self._fatal.error
        left = self._flush_raw(-1 if timeout is None else max(0.0, timeout))
        fatal = self._fatal.error
        if fatal is not None and known is None:
            # A flush that raised the fatal error stopped there: serve the reports still due (purged
            # and in-flight records). Those served with the error set may be lost: settle() below
            # vouches for nothing no report names.
            left = self._flush_raw(-1 if timeout is None else max(0.0, timeout - (time.monotonic() - began)))
        if self._settlement is not None and not left:
            with self._serving:  # the serving thread is not inside a poll: every failure is recorded
                self._settlement.settle(unknown=fatal)
        if fatal is not None and (known is None or left):
            raise fatal
        if left:
            raise ProduceFailed(f"{left} record(s) not delivered within {timeout}s")

    def _flush_raw(self, timeout: float) -> int:
        return self._served(self.raw.flush, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Flush for at most ``timeout`` seconds; what is left fails (librdkafka purges it).
        Then librdkafka's handle is released (its threads and broker connections), not left to
        the garbage collector: a handle still referenced kept reconnecting to a stopped broker."""
        if self._closed.is_set():
            return
        try:
            self._flush_raw(max(0.0, timeout))
        finally:
            if len(self.raw):
                self.raw.purge()
                self._poll(0)  # deliver the purge failures to the futures
            self._closed.set()
            if self._poller is not threading.current_thread():
                self._poller.join(1)
                if self._settlement is not None and not self._poller.is_alive() and not len(self.raw):
                    # Purged ones failed; the others were acknowledged (unless it was fatal: not vouched for).
                    self._settlement.settle(unknown=self._fatal.error)
                if not self._poller.is_alive():  # never under a poll() of the serving thread
                    self.raw.close()
            _flush_logs(self._log_bridge)


def _record_error(err: Any) -> None:
    """A consumed record that is an error: fatal ones raise, the rest are logged (not partition EOF)."""
    if err.fatal():
        raise KafkaException(err)
    if err.code() != KafkaError._PARTITION_EOF:
        log.warning("consumer error from librdkafka: %s", err.str())


def _report_into(verdicts: list, i: int, err: Any, msg: Any) -> None:
    verdicts[i] = None if err is None else as_kmq_error(err, f"{msg.topic()}: ")


def _flush_logs(bridge: Any) -> None:
    """The closing handle's repeat counts not logged yet (see :mod:`kmq.client.confluent.log_bridge`)."""
    if isinstance(bridge, LibrdkafkaLogBridge):
        bridge.flush()


def producer(kafka: KafkaConfig, timeout_s: float | None = None, settle_on_flush: bool = False,
             **conf: Any) -> ConfluentProducer:
    """Idempotent, acks=all producer (what markers and redeliveries need); ``settle_on_flush``:
    see :class:`ConfluentProducer`; ``conf``: librdkafka properties over kmq's defaults
    (:func:`kmq.client.factory.producer` translates kmq's setting names into them)."""
    timeout_s = timeout_s or kafka.connect_timeout
    conf = {
        **settings(kafka),
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "request.timeout.ms": int(timeout_s * 1000),
        **conf,
        **passthrough(kafka),
    }
    return construct(lambda c: ConfluentProducer(c, settle_on_flush), conf, kafka)


def consumer(kafka: KafkaConfig, *topics: str, group_id: str | None = None, timeout_s: float | None = None,
             **overrides: Any) -> "ConfluentConsumer":
    """A consumer adapter; with ``group_id`` it joins the group with kmq's session timing
    and subscribes to ``topics``, without one it is assigned nothing (call ``assign``).
    ``overrides``: librdkafka properties over kmq's defaults."""
    conf: dict[str, Any] = {
        **settings(kafka),
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # A consumer without a group still needs a group.id in librdkafka; it never joins or commits.
        "group.id": f"{kafka.client_id}-nogroup",
        "enable.partition.eof": False,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
    }
    if group_id:
        conf["group.id"] = group_id
        conf["session.timeout.ms"] = int(kafka.session_timeout * 1000)
        conf["heartbeat.interval.ms"] = int(kafka.heartbeat_interval * 1000)
    conf.update({k: v for k, v in overrides.items() if v is not None})
    conf.update(passthrough(kafka))
    c = ConfluentConsumer(construct(ck.Consumer, conf, kafka), log_bridge=conf["logger"],
                          timeout_s=timeout_s or kafka.connect_timeout, kafka=kafka)
    if topics:
        c.raw.subscribe(list(topics))
    return c


class ConfluentConsumer:
    """:class:`~kmq.client.api.ConsumerAdapter` over a ``confluent_kafka.Consumer``."""

    client = CONFLUENT

    def __init__(self, consumer: Any, log_bridge: LibrdkafkaLogBridge | None = None,
                 timeout_s: float = 10.0, kafka: KafkaConfig | None = None) -> None:
        self.raw = consumer
        self._kafka = kafka  # the settings it was built from: they name a refused login or an ACL
        self._what = "fetching records"  # what a failed fetch was doing, for kmq's error
        self._log_bridge = log_bridge
        self._timeout_s = timeout_s  # of the look-ups that ask the broker (committed, log start)
        # Where each partition's next fetch starts after a seek: librdkafka reports no position
        # until a record of the partition is consumed (see position()).
        self._sought: dict[Partition, int] = {}
        # Assigned by the last rebalance: resumed once the assignment is applied, since librdkafka
        # keeps the pause of a partition that was paused, revoked and then assigned again.
        self._fresh: set[Partition] = set()
        self._member: str | None = None  # member_id(), until the next rebalance callback

    def poll(self, timeout: float, max_records: int) -> list[Record]:
        return self.fetch(timeout, max_records, Record)

    # ------------------------------------------------------------ group consumer (KmqConsumer)
    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = Record,
              wake: threading.Event | None = None) -> list:
        """Up to ``max_records`` records as ``build(topic, partition, offset, key, value, headers,
        timestamp)``. Rebalance callbacks (:meth:`subscribe`) run inside this call. ``wake`` is not
        used: librdkafka's wait costs no CPU and returns as soon as a record arrives.

        Returns as soon as records are there, like kafka-python's poll: librdkafka's
        ``consume(n, timeout)`` waits for ``n`` records or the timeout, which at a low rate holds
        each record for up to ``timeout`` seconds. So wait for one record, then take what is
        queued behind it. A fatal error of librdkafka raises kmq's error
        (:func:`kmq.client.confluent.errors.client_error`)."""
        try:
            return self._fetch(timeout, max_records, build)
        except KafkaException as exc:
            raise client_error(self._kafka, exc, self._what) from exc

    def _fetch(self, timeout: float, max_records: int, build: Callable[..., Any]) -> list:
        first = self.raw.consume(1, timeout)
        msgs = first + self.raw.consume(max_records - 1, 0) if first and max_records > 1 else first
        many = getattr(build, "many", None)  # kmq's message builder: the whole poll in one call
        out = many(msgs, _record_error) if many is not None else []  # many() empties msgs
        # Each librdkafka message is let go as soon as it was read: the cyclic collector counts
        # live container objects, and holding the whole batch next to the messages built from it
        # doubled its runs (and the full ones, which visit every object of the process).
        msgs.reverse()
        take = msgs.pop
        while msgs:
            m = take()
            err = m.error()
            if err is not None:
                _record_error(err)
                continue
            out.append(build(m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers(),
                             m.timestamp()[1]))
        if self._fresh:
            self._resume_fresh()
        return out

    def _resume_fresh(self) -> None:
        """The seam's contract (Kafka's own consumer's): a partition a rebalance assigns arrives
        unpaused. librdkafka keeps the pause flag of a partition that comes back to the member that
        paused it, so a consumer that paused everything for flow control and lost a partition
        would never fetch it again. Runs after ``consume`` returned: confluent-kafka applies an
        assignment after the callback, and only assigned partitions can be resumed."""
        fresh, self._fresh = self._fresh, set()
        assigned = {(tp.topic, tp.partition) for tp in self.raw.assignment()}
        parts = [TopicPartition(t, p) for t, p in fresh & assigned]
        if parts:
            self.raw.resume(parts)

    def subscribe(self, topics: Iterable[str], on_assigned: Callable[[set], None],
                  on_revoked: Callable[[set], None],
                  commit_on_revoke: Callable[[set], Mapping[Partition, int]] | None = None,
                  on_commit_failed: Callable[[ClientCommitFailed], None] | None = None) -> None:
        """Join the group for ``topics``; the callbacks get ``(topic, partition)`` sets and run inside
        :meth:`fetch` and :meth:`close`. With ``partition.assignment.strategy=cooperative-sticky``
        librdkafka passes only the partitions that move (confluent-kafka applies the incremental
        assignment after the callback); a lost assignment (session expired) counts as revoked.
        ``commit_on_revoke``: see :meth:`kmq.client.api.GroupConsumerAdapter.subscribe` (librdkafka
        allows a synchronous commit inside its revoke callback)."""
        def assigned(_c: Any, parts: list) -> None:
            moved = {(tp.topic, tp.partition) for tp in parts}
            self._forget_seeks(moved)
            self._fresh |= moved
            self._member = None  # a (re)join may have given this member a new id
            on_assigned(moved)

        def revoked(_c: Any, parts: list) -> None:
            moved = {(tp.topic, tp.partition) for tp in parts}
            self._forget_seeks(moved)
            self._member = None
            offsets = commit_on_revoke(moved) if commit_on_revoke is not None and moved else {}
            if offsets:
                try:
                    self.commit(offsets)
                except ClientCommitFailed as exc:
                    if on_commit_failed is not None:
                        on_commit_failed(exc)
                    else:
                        log.warning("commit before revoking %s failed: %s", sorted(moved), exc)
            on_revoked(moved)

        topics = list(topics)
        self._what = f"consuming {', '.join(topics)}"
        try:
            self.raw.subscribe(topics, on_assign=assigned, on_revoke=revoked, on_lost=revoked)
        except KafkaException as exc:
            raise client_error(self._kafka, exc, f"subscribing to {', '.join(topics)}") from exc

    def _forget_seeks(self, partitions: set) -> None:
        for tp in partitions:
            self._sought.pop(tp, None)

    def commit_async(self, offsets: Mapping[tuple[str, int], int]) -> Delivery:
        """Commit ``offsets`` (next offset to read); returns a completed
        :class:`~kmq.client.api.Delivery` (failed with :class:`~kmq.client.api.ClientCommitFailed`).

        Synchronous on the caller's (the fetcher's) thread: librdkafka answers in one round trip.
        Not asynchronous because confluent-kafka serves an asynchronous commit's result only inside
        a later ``poll``/``consume``, and a synchronous commit from a second thread was seen to wait
        until the polling thread stopped (confluent-kafka 2.16)."""
        fut = Delivery()
        try:
            self.commit(offsets)
        except ClientCommitFailed as exc:
            fut.failure(exc)
        else:
            fut.success(None)
        return fut

    def member_id(self) -> str | None:
        """This member's id in the group (None before the first join). Kept until the next
        rebalance callback: the fetcher asks once per fetch, and librdkafka's look-up showed
        in its profile."""
        if self._member is None:
            try:
                self._member = self.raw.memberid() or None
            except (KafkaException, RuntimeError):
                return None
        return self._member

    def watch(self, stall_timeout: float, on_fatal: Callable[[str], None], name: str) -> None:
        """Nothing to watch: librdkafka's ``consume`` returns within its timeout."""

    def unwatch(self) -> None:
        """See :meth:`watch`."""

    def recover_starved(self) -> None:
        """Nothing to recover: librdkafka fetches again on its own."""

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        try:
            result = self.raw.commit(offsets=[TopicPartition(t, p, off) for (t, p), off in offsets.items()],
                                     asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            raise ClientCommitFailed(str(exc), rebalanced=code in _REBALANCED) from exc
        failed = [tp for tp in result or [] if tp.error is not None]
        if failed:
            rebalanced = any(tp.error.code() in _REBALANCED for tp in failed)
            raise ClientCommitFailed("; ".join(f"{tp.topic}[{tp.partition}]: {tp.error.str()}" for tp in failed),
                                     rebalanced=rebalanced)

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self.raw.assignment()}

    def assign(self, partitions: Iterable[tuple[str, int]], offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        offsets = offsets or {}
        self.raw.assign([TopicPartition(t, p, offsets.get((t, p), ck.OFFSET_BEGINNING)) for t, p in partitions])

    def seek(self, topic: str, partition: int, offset: int) -> None:
        try:
            self.raw.seek(TopicPartition(topic, partition, offset))
        except KafkaException as exc:
            raise ClientCommitFailed(f"cannot seek {topic}[{partition}]: {exc}", rebalanced=True) from exc
        self._sought[(topic, partition)] = offset

    def seek_to_beginning(self, partitions: Iterable[Partition]) -> None:
        for t, p in partitions:
            self.seek(t, p, ck.OFFSET_BEGINNING)

    def committed(self, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        """The group's committed offsets (None: none); :class:`~kmq.core.errors.BrokerUnavailable`
        when the coordinator does not answer."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        if not tps:
            return {}
        try:
            found = self.raw.committed(tps, timeout=self._timeout_s)
        except KafkaException as exc:
            raise BrokerUnavailable(f"committed offsets not read: {exc}") from exc
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None for tp in found}

    def position(self, topic: str, partition: int) -> int | None:
        """librdkafka's position is the offset after the last record consumed; until a record of the
        partition is consumed it has none, and the next fetch starts at the last seek's target, else
        at the committed offset, else at the log start (``auto.offset.reset=earliest``). An offset
        below the log start as the last fetch saw it is the log start: the broker refuses such a
        fetch as out of range and librdkafka resets to the log start, as kafka-python does."""
        tp = TopicPartition(topic, partition)
        try:
            pos = self.raw.position([tp])[0].offset
        except KafkaException:
            return None
        if pos >= 0:
            return pos
        start = self._sought.get((topic, partition))
        if start is None:
            start = self.committed([(topic, partition)])[(topic, partition)]
        low = self._cached_log_start(tp)
        if start is not None and start >= 0:
            return start if low is None else max(start, low)
        if low is not None:
            return low
        try:  # nothing fetched yet: ask the broker for the log start (its log end is not used)
            low, _high = self.raw.get_watermark_offsets(tp, timeout=self._timeout_s, cached=False)
        except KafkaException as exc:
            raise BrokerUnavailable(f"log start of {topic}[{partition}] not read: {exc}") from exc
        return low if low >= 0 else None

    def _cached_log_start(self, tp: Any) -> int | None:
        """The log start as the last fetch saw it (None before any fetch)."""
        try:
            low, _high = self.raw.get_watermark_offsets(tp, cached=True) or (-1, -1)
        except KafkaException:
            return None
        return low if low >= 0 else None

    def pause(self, partitions: Iterable[tuple[str, int]]) -> None:
        self.raw.pause([TopicPartition(t, p) for t, p in partitions])

    def resume(self, partitions: Iterable[tuple[str, int]]) -> None:
        self.raw.resume([TopicPartition(t, p) for t, p in partitions])

    def highwater(self, topic: str, partition: int) -> int | None:
        """The high-water mark the last fetch saw (librdkafka's cache: no broker round trip,
        and not the ListOffsets answer, which some brokers get wrong)."""
        try:
            lo_hi = self.raw.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except KafkaException:
            return None
        if not lo_hi or lo_hi[1] < 0:
            return None
        return lo_hi[1]

    def close(self) -> None:
        self.raw.close()
        _flush_logs(self._log_bridge)

    def __repr__(self) -> str:
        return f"ConfluentConsumer({self.raw!r})"

