"""Topic administration on kafka-python's ``KafkaAdminClient`` (:class:`kmq.client.admin.TopicAdmin`).

kafka-python's errors are kmq's here: connection, login and ACL failures through
:func:`~kmq.client.kafka_python.clients.broker_errors`, any other refusal as
:class:`~kmq.core.errors.TopicError`.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Mapping

from kafka import TopicPartition

from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from kafka.errors import IncompatibleBrokerVersion, InvalidPartitionsError, KafkaError, TopicAlreadyExistsError

from kmq.client.admin import TopicState
from kmq.client.api import Partition
from kmq.client.kafka_python.clients import admin_client, broker_errors
from kmq.config import KafkaConfig
from kmq.core.errors import TopicError, UnsupportedByBroker

__all__ = ["KafkaPythonAdmin"]


class KafkaPythonAdmin:
    """A :class:`~kmq.client.admin.TopicAdmin` on one ``KafkaAdminClient``."""

    def __init__(self, kafka: KafkaConfig, timeout_s: float) -> None:
        self._kafka = kafka
        self._timeout_s = timeout_s
        self._admin = admin_client(kafka, timeout_s)

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            with broker_errors(self._kafka, self._timeout_s):
                yield
        except KafkaError as exc:
            raise TopicError(f"{what} failed: {type(exc).__name__}: {exc}") from exc

    def describe(self, names: Iterable[str]) -> dict[str, TopicState | None]:
        names = list(names)
        with self._errors(f"describing topics {', '.join(names)}"):
            topics = self._admin.describe_topics(names)
        out: dict[str, TopicState | None] = dict.fromkeys(names)
        for t in topics:
            name = t.get("name") or t.get("topic")
            if t.get("error_code", 0) == 0 and t.get("partitions"):
                out[name] = TopicState(len(t["partitions"]),
                                       sum(1 for p in t["partitions"] if p.get("leader_id", -1) < 0))
        return out

    def brokers(self) -> set[int]:
        with self._errors("listing the brokers"):
            found = self._admin.describe_cluster().get("brokers") or []
        return {b["node_id"] if "node_id" in b else b["broker_id"] for b in found if not b.get("is_fenced")}

    def create(self, name: str, partitions: int, replication_factor: int, configs: Mapping[str, str]) -> bool:
        try:
            with self._errors(f"creating topic {name!r}"):
                self._admin.create_topics([NewTopic(name, partitions, replication_factor,
                                                    topic_configs=dict(configs))])
        except TopicError as exc:
            if isinstance(exc.__cause__, TopicAlreadyExistsError):
                return False
            raise
        return True

    def grow(self, name: str, partitions: int) -> None:
        try:
            with self._errors(f"growing {name!r} to {partitions} partitions"):
                self._admin.create_partitions({name: NewPartitions(partitions)})
        except TopicError as exc:
            cause = exc.__cause__
            if isinstance(cause, IncompatibleBrokerVersion) or "CreatePartitions" in str(cause):
                raise UnsupportedByBroker("this broker does not support CreatePartitions") from cause
            if isinstance(cause, InvalidPartitionsError):
                raise TopicError(str(cause)) from cause
            raise

    def configs(self, names: Iterable[str]) -> dict[str, dict[str, str]]:
        names = list(names)
        with self._errors(f"reading the configs of {', '.join(names)}"):
            # "all": a value left at the broker's default is reported too.
            found = self._admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in names],
                                                 config_filter="all").get("topic", {})
        return {t: {k: str(v.get("value")) for k, v in (found.get(t) or {}).items() if v.get("value") is not None}
                for t in names}

    def topic_names(self) -> set[str]:
        with self._errors("listing topics"):
            return set(self._admin.list_topics())

    def group_offsets(self, group: str, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        asked = sorted(set(partitions))
        with self._errors(f"reading the offsets of group {group}"):
            got = self._admin.list_group_offsets({group: [TopicPartition(t, p) for t, p in asked]})
        found = {(tp.topic, tp.partition): om.offset for tp, om in got.get(group, {}).items()}
        return {tp: (found[tp] if found.get(tp) is not None and found[tp] >= 0 else None) for tp in asked}

    def close(self) -> None:
        self._admin.close()
