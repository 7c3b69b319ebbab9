"""Topic administration on confluent-kafka's ``AdminClient`` (:class:`kmq.client.admin.TopicAdmin`).

Built from the same librdkafka settings as every kmq client on confluent-kafka
(:mod:`kmq.client.confluent.settings`, ``kafka.confluent`` last). librdkafka's errors are kmq's
here: a broker that does not answer is diagnosed (:func:`kmq.client.diagnose.diagnose`), a refused
login or ACL named, any other refusal a :class:`~kmq.core.errors.TopicError`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from typing import Any, Iterable, Iterator, Mapping

from kmq.client.api import CONFLUENT, Partition, require_client
from kmq.client.admin import TopicState
from kmq.client.confluent.settings import construct, passthrough, settings
from kmq.client.diagnose import diagnose
from kmq.client.sasl import authentication_failed
from kmq.config import KafkaConfig
from kmq.core.errors import AuthorizationFailed, KmqError, TopicError, UnsupportedByBroker

require_client(CONFLUENT)  # the one clear error when the extra is missing

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

__all__ = ["ConfluentAdmin"]

_UNANSWERED = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
               KafkaError._SSL, KafkaError.REQUEST_TIMED_OUT}
_UNSUPPORTED = {KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION, KafkaError.INVALID_REQUEST}
_DENIED = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
           KafkaError.CLUSTER_AUTHORIZATION_FAILED}


class ConfluentAdmin:
    """A :class:`~kmq.client.admin.TopicAdmin` on one ``confluent_kafka.admin.AdminClient``."""

    def __init__(self, kafka: KafkaConfig, timeout_s: float) -> None:
        self._kafka = kafka
        self._timeout_s = timeout_s
        self._admin = construct(AdminClient, {**settings(kafka), **passthrough(kafka)}, kafka)

    def _error(self, exc: BaseException, what: str) -> KmqError:
        err = exc.args[0] if exc.args else None
        code = err.code() if hasattr(err, "code") else None
        text = err.str() if hasattr(err, "str") else str(exc)
        if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            return authentication_failed(self._kafka, text)
        if code in _DENIED:
            who = f"user {self._kafka.sasl_username!r}" if self._kafka.sasl_username else "kmq's principal"
            return AuthorizationFailed(f"Kafka denied {who} {what} ({text}); grant the ACLs listed in docs/deploy.md "
                                       "for this component")
        if code in _UNANSWERED:
            return diagnose(self._kafka, self._timeout_s, text)
        if code in _UNSUPPORTED:
            return UnsupportedByBroker(f"{what}: the broker does not support it ({text})")
        return TopicError(f"{what} failed: {text}")

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except KafkaException as exc:
            raise self._error(exc, what) from exc
        except concurrent.futures.TimeoutError as exc:
            raise diagnose(self._kafka, self._timeout_s, f"{what}: no answer") from exc

    def _wait(self, future: Any) -> Any:
        return future.result(timeout=self._timeout_s)

    def _metadata(self, what: str) -> Any:
        # All topics: a request naming a topic may create it on a broker with auto.create.topics.enable.
        with self._errors(what):
            return self._admin.list_topics(timeout=self._timeout_s)

    def describe(self, names: Iterable[str]) -> dict[str, TopicState | None]:
        names = list(names)
        topics = self._metadata(f"describing topics {', '.join(names)}").topics
        out: dict[str, TopicState | None] = dict.fromkeys(names)
        for name in names:
            t = topics.get(name)
            if t is not None and t.error is None and t.partitions:
                out[name] = TopicState(len(t.partitions), sum(1 for p in t.partitions.values() if p.leader < 0))
        return out

    def brokers(self) -> set[int]:
        # Metadata names the brokers that serve (KRaft leaves fenced ones out).
        return set(self._metadata("listing the brokers").brokers)

    def create(self, name: str, partitions: int, replication_factor: int, configs: Mapping[str, str]) -> bool:
        new = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=dict(configs))
        try:
            with self._errors(f"creating topic {name!r}"):
                self._wait(self._admin.create_topics([new], request_timeout=self._timeout_s)[name])
        except TopicError as exc:
            cause = exc.__cause__
            err = cause.args[0] if cause is not None and cause.args else None
            if hasattr(err, "code") and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise
        return True

    def grow(self, name: str, partitions: int) -> None:
        with self._errors(f"growing {name!r} to {partitions} partitions (CreatePartitions)"):
            self._wait(self._admin.create_partitions([NewPartitions(name, partitions)],
                                                     request_timeout=self._timeout_s)[name])

    def configs(self, names: Iterable[str]) -> dict[str, dict[str, str]]:
        names = list(names)
        futures = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in names],
                                               request_timeout=self._timeout_s)
        out: dict[str, dict[str, str]] = {}
        for resource, future in futures.items():
            with self._errors(f"reading the configs of {resource.name!r}"):
                entries = self._wait(future)
            out[resource.name] = {k: str(e.value) for k, e in entries.items() if e.value is not None}
        return {t: out.get(t, {}) for t in names}

    def topic_names(self) -> set[str]:
        return set(self._metadata("listing topics").topics)

    def group_offsets(self, group: str, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        asked = sorted(set(partitions))
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in asked])
        with self._errors(f"reading the offsets of group {group}"):
            answer = self._wait(self._admin.list_consumer_group_offsets([request],
                                                                         request_timeout=self._timeout_s)[group])
        found = {(tp.topic, tp.partition): tp.offset for tp in answer.topic_partitions or []}
        return {tp: (found[tp] if found.get(tp) is not None and found[tp] >= 0 else None) for tp in asked}

    def close(self) -> None:
        """Nothing to release: librdkafka frees the handle with the object."""
