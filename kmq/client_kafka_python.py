"""The kafka-python side of the client seam (:mod:`kmq.client_api`).

kafka-python is pinned to its major version 3 (pyproject): the private
attributes read here and in :func:`kmq.clients.close_producer` are those of
3.x; ``tests/unit/test_client_pin.py`` fails when an installed version
breaks the pin or loses one of them. Nothing outside the adapter modules and
:mod:`kmq.clients` touches a client's private API.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError, IllegalStateError, KafkaError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata

from kmq.client_api import KAFKA_PYTHON, ClientCommitFailed, Record

__all__ = ["KafkaPythonConsumer", "PRIVATE_ATTRIBUTES", "member_id", "forget_highwater"]

#: kafka-python internals kmq reads (object path -> attribute), checked against the installed version by a test.
PRIVATE_ATTRIBUTES = {
    "KafkaConsumer": ("_coordinator", "_subscription"),
    "ConsumerCoordinator": ("_generation",),
    "KafkaProducer": ("_sender",),
}


def member_id(consumer: KafkaConsumer) -> str | None:
    """The group member id of ``consumer`` (kafka-python keeps it in private coordinator state)."""
    gen = getattr(getattr(consumer, "_coordinator", None), "_generation", None)
    return getattr(gen, "member_id", None) or None


def forget_highwater(consumer: KafkaConsumer, partitions: Iterable[TopicPartition]) -> None:
    """Drop the high-water marks ``consumer`` remembers for ``partitions``, so that only a fetch
    response received from now on answers ``highwater()`` (kafka-python keeps them in private state)."""
    states = getattr(getattr(consumer, "_subscription", None), "assignment", {})
    for tp in partitions:
        if tp in states:
            states[tp].highwater = None


class KafkaPythonConsumer:
    """:class:`~kmq.client_api.ConsumerAdapter` over a ``kafka.KafkaConsumer``."""

    client = KAFKA_PYTHON

    def __init__(self, consumer: KafkaConsumer) -> None:
        self.raw = consumer

    def poll(self, timeout: float, max_records: int) -> list[Record]:
        batches = self.raw.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        return [Record(r.topic, r.partition, r.offset, r.key, r.value, r.headers or [], r.timestamp)
                for rs in batches.values() for r in rs]

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
