"""The kafka-python side of the client seam (:mod:`kmq.client.api`).

kafka-python is pinned to its major version 3 (pyproject): the private
attributes read here and in :func:`kmq.client.kafka_python.clients.close_producer` are those of
3.x; ``tests/unit/test_client_pin.py`` fails when an installed version
breaks the pin or loses one of them. Nothing outside the adapter modules and
:mod:`kmq.client.kafka_python.clients` touches a client's private API.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Mapping

from kafka import AsyncConsumerRebalanceListener, ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError, IllegalStateError, KafkaError, KafkaTimeoutError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata

from kmq.client.api import KAFKA_PYTHON, ClientCommitFailed, Partition, Record
from kmq.client.kafka_python.clients import client_error
from kmq.client.kafka_python.group_join import COORDINATOR_ATTRIBUTES, keep_finished_joins, snapshot_subscribed_metadata
from kmq.client.kafka_python.grown_partitions import PRODUCER_ATTRIBUTES
from kmq.client.kafka_python.watchdog import FetchWatchdog, lagging_partitions, unstrand_records
from kmq.config import KafkaConfig
from kmq.core.errors import BrokerUnavailable

__all__ = ["KafkaPythonConsumer", "PRIVATE_ATTRIBUTES", "member_id"]

log = logging.getLogger(__name__)

#: Seconds a poll that failed with a retriable error waits before it returns nothing.
POLL_RETRY_WAIT = 0.1
#: Waits up to this long are taken outside kafka-python's poll when the caller gives a ``wake``
#: event (see :meth:`KafkaPythonConsumer.fetch`): kafka-python 3.0's poll costs about 0.3 ms of
#: CPU a call and spins through a short timeout (poll(timeout_ms=1) in a loop: 90 % of a core).
SHORT_WAIT = 0.005

#: kafka-python internals kmq reads or calls (object path -> attribute or method), checked against the
#: installed version by a test.
PRIVATE_ATTRIBUTES = {
    "KafkaConsumer": ("_coordinator",),
    "ConsumerCoordinator": ("_generation", "_commit_offsets_sync_async", *COORDINATOR_ATTRIBUTES),
    "KafkaProducer": ("_closed", *PRODUCER_ATTRIBUTES),
}

#: How long a commit before a revoke may take (kafka-python retries it within this bound).
REVOKE_COMMIT_TIMEOUT_MS = 10_000


def member_id(consumer: KafkaConsumer) -> str | None:
    """The group member id of ``consumer`` (kafka-python keeps it in private coordinator state)."""
    gen = getattr(getattr(consumer, "_coordinator", None), "_generation", None)
    return getattr(gen, "member_id", None) or None


class _Listener(ConsumerRebalanceListener):
    """Rebalance callbacks with ``(topic, partition)`` sets. kafka-python calls them during ``poll``."""

    def __init__(self, on_assigned: Callable[[set], None], on_revoked: Callable[[set], None]) -> None:
        self._assigned, self._revoked = on_assigned, on_revoked

    def on_partitions_revoked(self, revoked):
        self._revoked({(tp.topic, tp.partition) for tp in revoked})

    def on_partitions_assigned(self, assigned):
        self._assigned({(tp.topic, tp.partition) for tp in assigned})


def _offsets(offsets: Mapping[Partition, int]) -> dict[TopicPartition, OffsetAndMetadata]:
    return {TopicPartition(t, p): OffsetAndMetadata(off, "", -1) for (t, p), off in offsets.items()}


def _commit_failed(exc: BaseException) -> ClientCommitFailed:
    """The seam's error for a commit kafka-python did not complete: ``rebalanced`` when the group moved on."""
    rebalanced = isinstance(exc, (CommitFailedError, RebalanceInProgressError))
    return ClientCommitFailed(f"{type(exc).__name__}: {exc}", rebalanced=rebalanced)


class _CommittingListener(AsyncConsumerRebalanceListener):
    """Rebalance callbacks that commit before partitions are revoked. kafka-python 3 runs them on its
    I/O thread, where the blocking ``commit`` is refused; this listener awaits the coordinator's own
    commit coroutine there instead (private API: :data:`PRIVATE_ATTRIBUTES`)."""

    def __init__(self, consumer: KafkaConsumer, on_assigned: Callable[[set], None], on_revoked: Callable[[set], None],
                 commit_on_revoke: Callable[[set], Mapping[Partition, int]],
                 on_commit_failed: Callable[[ClientCommitFailed], None] | None) -> None:
        self._consumer = consumer
        self._assigned, self._revoked = on_assigned, on_revoked
        self._offsets, self._failed = commit_on_revoke, on_commit_failed

    async def on_partitions_revoked(self, revoked):
        parts = {(tp.topic, tp.partition) for tp in revoked}
        offsets = self._offsets(parts) if parts else {}
        if offsets:
            try:
                await self._consumer._coordinator._commit_offsets_sync_async(_offsets(offsets), REVOKE_COMMIT_TIMEOUT_MS)
            except Exception as exc:  # noqa: BLE001 - raised into poll() it would fail the caller's step
                if self._failed is not None:
                    self._failed(_commit_failed(exc))
                else:
                    log.warning("commit before revoking %s failed: %s", sorted(parts), exc)
        self._revoked(parts)

    async def on_partitions_assigned(self, assigned):
        self._assigned({(tp.topic, tp.partition) for tp in assigned})


class KafkaPythonConsumer:
    """:class:`~kmq.client.api.ConsumerAdapter` over a ``kafka.KafkaConsumer``.

    Also the group-consumer side :class:`~kmq.consumer.consumer.KmqConsumer` uses (:meth:`subscribe`,
    :meth:`fetch`, :meth:`commit_async`, :meth:`member_id`, :meth:`watch`, :meth:`recover_starved`),
    which carries kmq's workarounds for kafka-python 3.0 (:mod:`kmq.client.kafka_python.watchdog`,
    :mod:`kmq.client.kafka_python.group_join`)."""

    client = KAFKA_PYTHON

    def __init__(self, consumer: KafkaConsumer, kafka: KafkaConfig | None = None) -> None:
        self.raw = consumer
        self._kafka = kafka  # the settings it was built from: they name a refused login or an ACL
        self._what = "fetching records"  # what a failed fetch was doing, for kmq's error
        keep_finished_joins(consumer)  # also a user's own consumer handed to MarkerWriter
        self._watchdog: FetchWatchdog | None = None
        self._poll_failing = False  # logged once per run of failed polls

    def poll(self, timeout: float, max_records: int) -> list[Record]:
        batches = self.raw.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        return [Record(r.topic, r.partition, r.offset, r.key, r.value, r.headers or [], r.timestamp)
                for rs in batches.values() for r in rs]

    # ------------------------------------------------------------ group consumer (KmqConsumer)
    def subscribe(self, topics: Iterable[str], on_assigned: Callable[[set], None],
                  on_revoked: Callable[[set], None],
                  commit_on_revoke: Callable[[set], Mapping[Partition, int]] | None = None,
                  on_commit_failed: Callable[[ClientCommitFailed], None] | None = None) -> None:
        """Join the group for ``topics``; the callbacks get ``(topic, partition)`` sets (kafka-python
        calls them inside :meth:`fetch` and :meth:`close`, on its I/O thread; with the cooperative
        assignor only the partitions that move). ``commit_on_revoke``: see
        :meth:`kmq.client.api.GroupConsumerAdapter.subscribe`."""
        if commit_on_revoke is None:
            listener: Any = _Listener(on_assigned, on_revoked)
        else:
            listener = _CommittingListener(self.raw, on_assigned, on_revoked, commit_on_revoke, on_commit_failed)
        topics = list(topics)
        self._what = f"consuming {', '.join(topics)}"
        # kafka-python's group leader assigns from its metadata cache: a subscribed topic not in it yet
        # gets no partitions ("No partition metadata for topic"), and the whole group sat with nothing
        # assigned until a later rebalance (a tracker started on Apache Kafka: over 40 s). Known first.
        try:
            for topic in topics:
                self.raw.partitions_for_topic(topic)
            self.raw.subscribe(topics, listener=listener)
        except KafkaError as exc:
            raise client_error(self._kafka, exc, f"subscribing to {', '.join(topics)}") from exc
        snapshot_subscribed_metadata(self.raw)

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = Record,
              wake: threading.Event | None = None) -> list:
        """Up to ``max_records`` records as ``build(topic, partition, offset, key, value, headers,
        timestamp)``, in fetch order per partition. Under the watchdog (:meth:`watch`): a poll it
        unblocked returns nothing (and is logged) instead of hanging.

        With ``wake`` and a ``timeout`` of at most :data:`SHORT_WAIT`, what is already fetched is
        taken without waiting, and the wait for more is on ``wake`` instead (it returns [] once
        ``wake`` is set or the timeout passed): kafka-python's poll cannot be woken from another
        thread and keeps a core busy through short timeouts."""
        if wake is not None and 0 < timeout <= SHORT_WAIT:
            out = self._fetch(0.0, max_records, build)
            if not out:
                wake.wait(timeout)
            return out
        return self._fetch(timeout, max_records, build)

    def _fetch(self, timeout: float, max_records: int, build: Callable[..., Any]) -> list:
        wd = self._watchdog
        if wd is not None:
            wd.poll_started()
        unstrand_records(self.raw)
        try:
            batches = self.raw.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        except KafkaError as exc:
            # A broker that refuses connections can surface through poll (seen: ECONNREFUSED from a
            # reconnect, right after a broker was killed). kafka-python reconnects on its own; only a
            # non-retriable error (authorization, a bug) fails the caller, as kmq's error.
            if not (isinstance(exc, KafkaTimeoutError) or exc.retriable):
                raise client_error(self._kafka, exc, self._what) from exc
            if wd is not None:
                wd.poll_returned(normally=False)
            log.log(logging.DEBUG if self._poll_failing else logging.WARNING,
                    "Kafka poll failed (%s: %s); polling again", type(exc).__name__, exc)
            self._poll_failing = True
            time.sleep(max(timeout, POLL_RETRY_WAIT))  # the error may come back at once: do not spin
            return []
        if wd is not None:
            wd.poll_returned()
        if self._poll_failing:
            self._poll_failing = False
            log.info("Kafka poll works again")
        out = []
        for rs in batches.values():
            # Each record is let go as soon as it was read, as in the confluent-kafka fetch: a
            # batch held next to the messages built from it doubles the cyclic collector's runs.
            rs.reverse()
            take = rs.pop
            while rs:
                r = take()
                out.append(build(r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp))
        return out

    def commit_async(self, offsets: Mapping[tuple[str, int], int]) -> Any:
        """Send a commit of ``offsets`` (next offset to read); returns a future with ``is_done``,
        ``failed()`` and ``exception``. kafka-python completes it on its own I/O thread."""
        return self.raw.commit_async(_offsets(offsets))

    def member_id(self) -> str | None:
        """This member's id in the group (None before the first join)."""
        return member_id(self.raw)

    def watch(self, stall_timeout: float, on_fatal: Callable[[str], None], name: str) -> None:
        """Start the fetch watchdog: kafka-python 3.0's poll can lose its wake-up after a broker
        outage and hang for ever (see :mod:`kmq.client.kafka_python.watchdog`)."""
        if self._watchdog is None:
            self._watchdog = FetchWatchdog(self.raw, stall_timeout, on_fatal, name).start()

    def unwatch(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()

    def recover_starved(self) -> None:
        """Called when :meth:`fetch` returned nothing for a while: if assigned, unpaused partitions
        lag behind their high-water mark, drop kafka-python's stuck fetch state (lost fetch responses
        after a cooperative revocation or a broker restart) so new fetches are sent."""
        lagging = lagging_partitions(self.raw)
        if not lagging:
            return
        if self._watchdog is not None:
            self._watchdog.unstick_fetches()
        for tp, pos in lagging.items():  # a seek to the position drops the fetch state kept for it
            self.raw.seek(tp, pos)

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        try:
            self.raw.commit(_offsets(offsets))
        except KafkaError as exc:
            raise _commit_failed(exc) from exc

    def committed(self, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        """The group's committed offsets (None: none); :class:`~kmq.core.errors.BrokerUnavailable`
        when the coordinator does not answer."""
        out: dict[Partition, int | None] = {}
        timeout_ms = self.raw.config["request_timeout_ms"]
        for t, p in partitions:
            try:
                out[(t, p)] = self.raw.committed(TopicPartition(t, p), timeout_ms=timeout_ms)
            except KafkaError as exc:
                raise BrokerUnavailable(f"committed offset of {t}[{p}] not read: {type(exc).__name__}: {exc}") from exc
        return out

    def position(self, topic: str, partition: int) -> int | None:
        """kafka-python's position: a pending reset (committed offset, else ``auto_offset_reset``) is
        resolved first, with a broker round trip."""
        return self.raw.position(TopicPartition(topic, partition))

    def seek_to_beginning(self, partitions: Iterable[Partition]) -> None:
        tps = [TopicPartition(t, p) for t, p in partitions]
        if tps:
            self.raw.seek_to_beginning(*tps)

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self.raw.assignment()}

    def seek(self, topic: str, partition: int, offset: int) -> None:
        try:
            self.raw.seek(TopicPartition(topic, partition), offset)
        # Not assigned (any more): kafka-python raises IllegalStateError, AssertionError or (3.0)
        # ValueError('Unassigned partition') depending on its version and where it notices.
        except (IllegalStateError, AssertionError, ValueError) as exc:
            raise ClientCommitFailed(f"cannot seek {topic}[{partition}]: {exc}", rebalanced=True) from exc

    def pause(self, partitions: Iterable[tuple[str, int]]) -> None:
        self.raw.pause(*(TopicPartition(t, p) for t, p in partitions))

    def resume(self, partitions: Iterable[tuple[str, int]]) -> None:
        self.raw.resume(*(TopicPartition(t, p) for t, p in partitions))

    def highwater(self, topic: str, partition: int) -> int | None:
        try:
            return self.raw.highwater(TopicPartition(topic, partition))
        except IllegalStateError:  # not assigned: the seam answers None, as for one not yet fetched
            return None

    def close(self) -> None:
        self.unwatch()
        self.raw.close()

    def __repr__(self) -> str:
        return f"KafkaPythonConsumer({self.raw!r})"


def installed_private_attributes() -> dict[str, bool]:
    """Whether each attribute in :data:`PRIVATE_ATTRIBUTES` exists in the installed kafka-python
    (an attribute set in ``__init__``, so checked in the constructors' source; a method kmq calls or
    awaits, checked to be a function or a coroutine function)."""
    import inspect

    from kafka import KafkaProducer
    from kafka.coordinator.consumer import ConsumerCoordinator

    classes: dict[str, Any] = {"KafkaConsumer": KafkaConsumer, "ConsumerCoordinator": ConsumerCoordinator,
                               "KafkaProducer": KafkaProducer}
    found = {}
    for cls_name, attrs in PRIVATE_ATTRIBUTES.items():
        cls = classes[cls_name]
        src = "".join(inspect.getsource(k) for k in cls.__mro__ if k.__module__.startswith("kafka"))
        for attr in attrs:
            method = getattr(cls, attr, None)
            found[f"{cls_name}.{attr}"] = (f"self.{attr} =" in src or f"self.{attr}=" in src
                                           or inspect.isfunction(method) or inspect.iscoroutinefunction(method))
    return found
