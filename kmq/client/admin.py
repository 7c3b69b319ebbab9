"""Topic administration behind the client seam: what :mod:`kmq.client.topics` needs from an admin
client, and the one that ``kafka.client`` names.

* :class:`TopicAdmin`: describe topics (partitions, partitions without a leader), count the
  brokers, create a topic, grow one, read topic configs, list topic names;
* :func:`open_admin`: the adapter of the configured client, kafka-python's ``KafkaAdminClient``
  (:mod:`kmq.client.kafka_python.admin`) or confluent-kafka's ``AdminClient``
  (:mod:`kmq.client.confluent.admin`).

Every method raises kmq's errors only: :class:`~kmq.core.errors.BrokerUnavailable` (or the
subclass naming a refused login, certificate or ACL) when the broker does not answer or refuses,
:class:`~kmq.core.errors.UnsupportedByBroker` for a request the broker does not implement,
:class:`~kmq.core.errors.TopicError` for any other refusal of a topic request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol

from kmq.client.api import CONFLUENT, client_of, require_client
from kmq.config import KafkaConfig

__all__ = ["TopicState", "TopicAdmin", "open_admin"]


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

    def broker_count(self) -> int:
        """Brokers in the cluster."""
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

    def close(self) -> None: ...


def open_admin(kafka: KafkaConfig, timeout_s: float | None = None) -> TopicAdmin:
    """A :class:`TopicAdmin` on the client ``kafka.client`` names; ``timeout_s`` (default
    ``kafka.connect_timeout``) bounds each request."""
    name = client_of(kafka)
    require_client(name)
    timeout_s = timeout_s or kafka.connect_timeout
    if name == CONFLUENT:
        from kmq.client.confluent.admin import ConfluentAdmin

        return ConfluentAdmin(kafka, timeout_s)
    from kmq.client.kafka_python.admin import KafkaPythonAdmin

    return KafkaPythonAdmin(kafka, timeout_s)
