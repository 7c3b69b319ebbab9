"""The kafka-python adapter's fetch: a retriable error out of ``KafkaConsumer.poll`` is a failed poll
(nothing fetched, polled again), never the end of the consumer; others fail the caller as kmq's error."""

from __future__ import annotations

import logging

import pytest
from kafka.errors import CorruptRecordError, KafkaConnectionError, TopicAuthorizationFailedError

from kmq.client.kafka_python import consumer as adapter_module
from kmq.client.kafka_python.consumer import KafkaPythonConsumer
from kmq.config import Config
from kmq.core.errors import AuthorizationFailed, BrokerUnavailable


class RawConsumer:
    """Stands in for a ``kafka.KafkaConsumer`` whose polls raise ``errors`` in turn, then return nothing."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)

    def poll(self, timeout_ms: int, max_records: int) -> dict:
        if self.errors:
            raise self.errors.pop(0)
        return {}


def test_a_refused_connection_out_of_poll_is_a_failed_poll_logged_once_per_run(monkeypatch, caplog):
    monkeypatch.setattr(adapter_module, "POLL_RETRY_WAIT", 0.0)
    caplog.set_level(logging.DEBUG, logger=adapter_module.__name__)
    kc = KafkaPythonConsumer(RawConsumer(*[KafkaConnectionError("111 ECONNREFUSED")] * 3))
    assert [kc.fetch(0.0, 10) for _ in range(4)] == [[], [], [], []]
    levels = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records]
    assert levels == [("WARNING", "Kafka poll failed"), ("DEBUG", "Kafka poll failed"), ("DEBUG", "Kafka poll failed"),
                      ("INFO", "Kafka poll works again")]


class Subscribing(RawConsumer):
    """A stand-in that can also be subscribed (whose metadata look-up raises ``refuse`` when given)."""

    def __init__(self, *errors: Exception, refuse: Exception | None = None) -> None:
        super().__init__(*errors)
        self.refuse = refuse

    def partitions_for_topic(self, topic: str) -> set:
        if self.refuse is not None:
            raise self.refuse
        return {0}

    def subscribe(self, topics, listener) -> None:
        pass


KAFKA = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:9", "sasl_username": "svc"},
                          "queues": [{"name": "q"}]}).kafka


def test_a_non_retriable_error_out_of_poll_fails_the_caller_as_kmqs_error_naming_what_failed():
    kc = KafkaPythonConsumer(RawConsumer(TopicAuthorizationFailedError("not allowed")), KAFKA)
    with pytest.raises(AuthorizationFailed, match="Kafka denied user 'svc' a topic operation") as got:
        kc.fetch(0.0, 10)
    assert isinstance(got.value.__cause__, TopicAuthorizationFailedError)
    kc = KafkaPythonConsumer(Subscribing(CorruptRecordError("crc")), KAFKA)
    kc.subscribe(["q"], lambda parts: None, lambda parts: None)
    with pytest.raises(BrokerUnavailable, match=r"^consuming q failed: CorruptRecordError"):
        kc.fetch(0.0, 10)


def test_a_subscription_the_broker_refuses_fails_as_kmqs_error():
    kc = KafkaPythonConsumer(Subscribing(refuse=TopicAuthorizationFailedError("not allowed")), KAFKA)
    with pytest.raises(AuthorizationFailed):
        kc.subscribe(["q"], lambda parts: None, lambda parts: None)
