"""Topic administration on aiokafka's ``AIOKafkaAdminClient`` (:class:`kmq.client.admin.TopicAdmin`).

The protocol is synchronous (topic checks at a start, the ``kmq topics`` commands): the async
client runs on a private event loop in a thread of its own, never on the application's loop,
and each call waits for its answer there (at most the request timeout). Called from a running
event loop's thread, a call blocks that loop as long as it waits: :class:`~kmq.consumer.aio.AsyncKmqConsumer`
builds its consumer, and runs its topic checks, off the loop.

aiokafka's errors are kmq's here: a broker that does not answer is diagnosed
(:func:`kmq.client.diagnose.diagnose`), a refused login or ACL named, a request the broker does
not implement :class:`~kmq.core.errors.UnsupportedByBroker`, any other refusal a
:class:`~kmq.core.errors.TopicError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Awaitable, Iterable, Mapping, TypeVar

from aiokafka import errors as ak
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import TopicPartition

from kmq.client.admin import TopicState
from kmq.client.aiokafka.bridge import LoopBridge
from kmq.client.aiokafka.settings import common
from kmq.client.api import Partition
from kmq.client.diagnose import diagnose
from kmq.client.sasl import authentication_failed
from kmq.config import KafkaConfig
from kmq.core.errors import AuthorizationFailed, KmqError, TopicError, UnsupportedByBroker

__all__ = ["AioKafkaAdmin"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_UNANSWERED = (ak.KafkaConnectionError, ak.KafkaTimeoutError, ak.RequestTimedOutError, ak.NodeNotReadyError,
               asyncio.TimeoutError)
_UNSUPPORTED = (ak.UnsupportedVersionError, ak.IncompatibleBrokerVersion, ak.UnrecognizedBrokerVersion)
_DENIED = (ak.TopicAuthorizationFailedError, ak.ClusterAuthorizationFailedError, ak.GroupAuthorizationFailedError)
_TOPIC_ALREADY_EXISTS = ak.TopicAlreadyExistsError.errno


class AioKafkaAdmin:
    """A :class:`~kmq.client.admin.TopicAdmin` on one ``AIOKafkaAdminClient``, started (connected)
    here, on an event loop of its own; :meth:`close` stops both."""

    def __init__(self, kafka: KafkaConfig, timeout_s: float) -> None:
        self._kafka = kafka
        self._timeout_s = timeout_s
        settings = common(kafka)  # a configuration error before any thread is started
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="kmq-aiokafka-admin", daemon=True)
        self._thread.start()
        self._bridge = LoopBridge(loop)
        try:
            self._admin = self._run(self._started(settings), "connecting to Kafka")
        except BaseException:
            self._stop_loop()
            raise

    async def _started(self, settings: dict[str, Any]) -> AIOKafkaAdminClient:
        # Built on its loop: aiokafka's clients take the running loop as theirs.
        admin = AIOKafkaAdminClient(**settings, request_timeout_ms=int(self._timeout_s * 1000))
        try:
            await admin.start()
        except BaseException:
            await admin.close()
            raise
        return admin

    def _error(self, exc: BaseException, what: str) -> KmqError:
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, (ak.AuthenticationFailedError, ak.UnsupportedSaslMechanismError)):
            return authentication_failed(self._kafka, text)
        if isinstance(exc, _DENIED):
            who = f"user {self._kafka.sasl_username!r}" if self._kafka.sasl_username else "kmq's principal"
            return AuthorizationFailed(f"Kafka denied {who} {what} ({text}); grant the ACLs listed in docs/deploy.md "
                                       "for this component")
        if isinstance(exc, _UNANSWERED):
            return diagnose(self._kafka, self._timeout_s, f"{what}: {text}")
        if isinstance(exc, _UNSUPPORTED):
            return UnsupportedByBroker(f"{what}: the broker does not support it ({text})")
        return TopicError(f"{what} failed: {text}")

    def _run(self, coro: Awaitable[T], what: str) -> T:
        """``coro`` on the admin's loop, its answer; aiokafka's errors as kmq's."""
        async def bounded() -> T:
            return await asyncio.wait_for(coro, self._timeout_s)

        try:
            # The loop's own bound first; the thread's wait a backstop should the loop be stuck.
            return self._bridge.wait(bounded(), self._timeout_s + 5.0, what)
        except KmqError:
            raise
        except (ak.KafkaError, asyncio.TimeoutError, OSError) as exc:
            raise self._error(exc, what) from exc

    def _metadata(self, what: str) -> Any:
        # All topics: a metadata request naming a topic may create it on a broker with
        # auto.create.topics.enable.
        return self._run(self._admin.describe_topics(None), what)

    def describe(self, names: Iterable[str]) -> dict[str, TopicState | None]:
        names = list(names)
        topics = {t["topic"]: t for t in self._metadata(f"describing topics {', '.join(names)}")}
        out: dict[str, TopicState | None] = dict.fromkeys(names)
        for name in names:
            t = topics.get(name)
            if t is not None and t.get("error_code", 0) == 0 and t.get("partitions"):
                out[name] = TopicState(len(t["partitions"]), sum(1 for p in t["partitions"] if p["leader"] < 0))
        return out

    def brokers(self) -> set[int]:
        # Metadata names the brokers that serve (KRaft leaves fenced ones out).
        found = self._run(self._admin.describe_cluster(), "listing the brokers").get("brokers") or []
        return {b["node_id"] for b in found}

    def create(self, name: str, partitions: int, replication_factor: int, configs: Mapping[str, str]) -> bool:
        what = f"creating topic {name!r}"
        new = NewTopic(name, partitions, replication_factor, topic_configs=dict(configs))
        answer = self._run(self._admin.create_topics([new], timeout_ms=int(self._timeout_s * 1000)), what)
        for entry in answer.topic_errors:
            code = entry[1]
            if code == _TOPIC_ALREADY_EXISTS:
                return False
            if code:
                detail = entry[2] if len(entry) > 2 and entry[2] else ""
                raise self._error(ak.for_code(code)(detail), what)
        return True

    def grow(self, name: str, partitions: int) -> None:
        what = f"growing {name!r} to {partitions} partitions (CreatePartitions)"
        try:
            self._run(self._admin.create_partitions({name: NewPartitions(partitions)},
                                                    timeout_ms=int(self._timeout_s * 1000)), what)
        except UnsupportedByBroker as exc:
            raise UnsupportedByBroker("this broker does not support CreatePartitions") from exc

    def configs(self, names: Iterable[str]) -> dict[str, dict[str, str]]:
        names = list(names)
        what = f"reading the configs of {', '.join(names)}"
        # configs=None: every config, a value left at the broker's default too.
        answers = self._run(self._admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t) for t in names]), what)
        out: dict[str, dict[str, str]] = {}
        for answer in answers:
            for resource in answer.to_object()["resources"]:
                if resource["error_code"]:
                    raise self._error(ak.for_code(resource["error_code"])(resource.get("error_message") or ""), what)
                out[resource["resource_name"]] = {e["config_names"]: str(e["config_value"])
                                                  for e in resource["config_entries"]
                                                  if e["config_value"] is not None}
        return {t: out.get(t, {}) for t in names}

    def topic_names(self) -> set[str]:
        return set(self._run(self._admin.list_topics(), "listing topics"))

    def group_offsets(self, group: str, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        asked = sorted(set(partitions))
        if not asked:
            return {}  # aiokafka would ask for every partition the group committed
        got = self._run(self._admin.list_consumer_group_offsets(
            group, partitions=[TopicPartition(t, p) for t, p in asked]), f"reading the offsets of group {group}")
        found = {(tp.topic, tp.partition): om.offset for tp, om in got.items()}
        return {tp: (found[tp] if found.get(tp) is not None and found[tp] >= 0 else None) for tp in asked}

    def close(self) -> None:
        try:
            self._run(self._admin.close(), "closing the admin client")
        except KmqError as exc:
            log.info("the aiokafka admin client did not close cleanly (%s); its connections go with its loop", exc)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        loop = self._bridge.loop
        if not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(self._timeout_s + 5.0)
            if not self._thread.is_alive():
                loop.close()
