"""Topic administration behind the client seam: what :mod:`kmq.client.topics` needs from an admin
client (pure: no client imported here).

* :class:`TopicAdmin`: describe topics (partitions, partitions without a leader), list the
  brokers, create a topic, grow one, read topic configs, list topic names, read a group's committed offsets;
* :func:`kmq.client.factory.open_admin` builds the adapter of the configured client, on
  kafka-python's ``KafkaAdminClient`` (:mod:`kmq.client.kafka_python.admin`), confluent-kafka's
  ``AdminClient`` (:mod:`kmq.client.confluent.admin`) or aiokafka's ``AIOKafkaAdminClient``
  (:mod:`kmq.client.aiokafka.admin`, run on an event loop of its own: the protocol is synchronous).

Every method raises kmq's errors only: :class:`~kmq.core.errors.BrokerUnavailable` (or the
subclass naming a refused login, certificate or ACL) when the broker does not answer or refuses,
:class:`~kmq.core.errors.UnsupportedByBroker` for a request the broker does not implement,
:class:`~kmq.core.errors.TopicError` for any other refusal of a topic request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol

from kmq.client.api import Partition

__all__ = ["TopicState", "TopicAdmin"]


@dataclass(frozen=True)
class TopicState:
    """One existing topic as the cluster's metadata shows it."""

    partitions: int
    leaderless: int  # partitions without a leader yet (a topic just created or grown)


class TopicAdmin(Protocol):
    """Topic administration on one client; close it when done."""

    def describe(self, names: Iterable[str]) -> dict[str, TopicState | None]:
        """Each topic's state; None for a topic that does not exist (or is in error)."""
        ...

    def brokers(self) -> set[int]:
        """Ids of the cluster's brokers that serve (a fenced broker is left out)."""
        ...

    def create(self, name: str, partitions: int, replication_factor: int, configs: Mapping[str, str]) -> bool:
        """Create a topic; False when it exists already (another process won the race)."""
        ...

    def grow(self, name: str, partitions: int) -> None:
        """Grow a topic to ``partitions`` (:class:`~kmq.core.errors.UnsupportedByBroker` without
        CreatePartitions)."""
        ...

    def configs(self, names: Iterable[str]) -> dict[str, dict[str, str]]:
        """Every config of each topic, defaults included (a topic the broker reports none for: {})."""
        ...

    def topic_names(self) -> set[str]:
        """Names of the cluster's topics."""
        ...

    def group_offsets(self, group: str, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        """The offsets ``group`` committed for ``partitions`` (None: none), in one request."""
        ...

    def close(self) -> None: ...
