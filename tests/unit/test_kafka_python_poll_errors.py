"""The kafka-python adapter's fetch: a retriable error out of ``KafkaConsumer.poll`` is a failed poll
(nothing fetched, polled again), never the end of the consumer; others still fail the caller."""

from __future__ import annotations

import logging

import pytest
from kafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from kmq.client.kafka_python import consumer as adapter_module
from kmq.client.kafka_python.consumer import KafkaPythonConsumer


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


def test_a_non_retriable_error_out_of_poll_still_fails_the_caller():
    kc = KafkaPythonConsumer(RawConsumer(TopicAuthorizationFailedError("not allowed")))
    with pytest.raises(TopicAuthorizationFailedError):
        kc.fetch(0.0, 10)
