"""The kafka-python side of the client seam (:mod:`kmq.client.api`).

kafka-python is pinned to its major version 3 (pyproject): the private
attributes read here and in :func:`kmq.client.kafka_python.clients.close_producer` are those of
3.x; ``tests/unit/test_client_pin.py`` fails when an installed version
breaks the pin or loses one of them. Nothing outside the adapter modules and
:mod:`kmq.client.kafka_python.clients` touches a client's private API.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError, IllegalStateError, KafkaError, KafkaTimeoutError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata

from kmq.client.api import KAFKA_PYTHON, ClientCommitFailed, Record
from kmq.client.kafka_python.watchdog import FetchWatchdog, lagging_partitions, unstrand_records

__all__ = ["KafkaPythonConsumer", "PRIVATE_ATTRIBUTES", "member_id"]

log = logging.getLogger(__name__)

#: kafka-python internals kmq reads (object path -> attribute), checked against the installed version by a test.
PRIVATE_ATTRIBUTES = {
    "KafkaConsumer": ("_coordinator",),
    "ConsumerCoordinator": ("_generation",),
    "KafkaProducer": ("_sender",),
}


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


class KafkaPythonConsumer:
    """:class:`~kmq.client.api.ConsumerAdapter` over a ``kafka.KafkaConsumer``.

    Also the group-consumer side :class:`~kmq.consumer.consumer.KmqConsumer` uses (:meth:`subscribe`,
    :meth:`fetch`, :meth:`commit_async`, :meth:`member_id`, :meth:`watch`, :meth:`recover_starved`),
    which carries kmq's workarounds for kafka-python 3.0 (:mod:`kmq.client.kafka_python.watchdog`)."""

    client = KAFKA_PYTHON

    def __init__(self, consumer: KafkaConsumer) -> None:
        self.raw = consumer
        self._watchdog: FetchWatchdog | None = None

    def poll(self, timeout: float, max_records: int) -> list[Record]:
        batches = self.raw.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        return [Record(r.topic, r.partition, r.offset, r.key, r.value, r.headers or [], r.timestamp)
                for rs in batches.values() for r in rs]

    # ------------------------------------------------------------ group consumer (KmqConsumer)
    def subscribe(self, topics: Iterable[str], on_assigned: Callable[[set], None],
                  on_revoked: Callable[[set], None]) -> None:
        """Join the group for ``topics``; the callbacks get ``(topic, partition)`` sets (kafka-python
        calls them inside :meth:`fetch`; with the cooperative assignor only the partitions that move)."""
        self.raw.subscribe(list(topics), listener=_Listener(on_assigned, on_revoked))

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = Record) -> list:
        """Up to ``max_records`` records as ``build(topic, partition, offset, key, value, headers,
        timestamp)``, in fetch order per partition. Under the watchdog (:meth:`watch`): a poll it
        unblocked returns nothing (and is logged) instead of hanging."""
        wd = self._watchdog
        if wd is not None:
            wd.poll_started()
        unstrand_records(self.raw)
        try:
            batches = self.raw.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        except KafkaTimeoutError as exc:
            if wd is not None:
                wd.poll_returned(normally=False)
            log.warning("Kafka poll failed (%s); polling again", exc)
            return []
        if wd is not None:
            wd.poll_returned()
        return [build(r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
                for rs in batches.values() for r in rs]

    def commit_async(self, offsets: Mapping[tuple[str, int], int]) -> Any:
        """Send a commit of ``offsets`` (next offset to read); returns a future with ``is_done``,
        ``failed()`` and ``exception``. kafka-python completes it on its own I/O thread."""
        return self.raw.commit_async({TopicPartition(t, p): OffsetAndMetadata(off, "", -1)
                                      for (t, p), off in offsets.items()})

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
            self.raw.commit({TopicPartition(t, p): OffsetAndMetadata(off, "", -1) for (t, p), off in offsets.items()})
        except (CommitFailedError, RebalanceInProgressError) as exc:
            raise ClientCommitFailed(f"{type(exc).__name__}: {exc}", rebalanced=True) from exc
        except KafkaError as exc:
            raise ClientCommitFailed(f"{type(exc).__name__}: {exc}") from exc

    def assignment(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self.raw.assignment()}

    def seek(self, topic: str, partition: int, offset: int) -> None:
        try:
            self.raw.seek(TopicPartition(topic, partition), offset)
        except (IllegalStateError, AssertionError) as exc:  # not assigned (any more)
            raise ClientCommitFailed(f"cannot seek {topic}[{partition}]: {exc}", rebalanced=True) from exc

    def pause(self, partitions: Iterable[tuple[str, int]]) -> None:
        self.raw.pause(*(TopicPartition(t, p) for t, p in partitions))

    def resume(self, partitions: Iterable[tuple[str, int]]) -> None:
        self.raw.resume(*(TopicPartition(t, p) for t, p in partitions))

    def highwater(self, topic: str, partition: int) -> int | None:
        return self.raw.highwater(TopicPartition(topic, partition))

    def close(self) -> None:
        self.unwatch()
        self.raw.close()

    def __repr__(self) -> str:
        return f"KafkaPythonConsumer({self.raw!r})"


def installed_private_attributes() -> dict[str, bool]:
    """Whether each attribute in :data:`PRIVATE_ATTRIBUTES` exists in the installed kafka-python
    (set in ``__init__``, so checked in the constructors' source)."""
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
            found[f"{cls_name}.{attr}"] = f"self.{attr} =" in src or f"self.{attr}=" in src
    return found
