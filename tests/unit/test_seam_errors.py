"""kmq's errors at the client seam: each adapter turns its client's failures into kmq's classes, the
same class for the same Kafka error code on both clients, so code above kmq.client catches only kmq's."""

from __future__ import annotations

import pytest
from kafka import errors as kp

from kmq.client import factory
from kmq.client.errors import (
    ProduceDenied,
    ProduceFailed,
    ProducerFenced,
    RecordRefused,
    RecordTooLarge,
    TopicUnknown,
)
from kmq.client.kafka_python.errors import KmqFuture
from kmq.client.kafka_python.errors import as_kmq_error as kafka_python_error
from kmq.config import Config
from kmq.core.errors import AuthenticationFailed, AuthorizationFailed, KmqError

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is in the dev extra")
# After the importorskip: without confluent-kafka the module is skipped, not an import error.
from kmq.client.confluent.errors import as_kmq_error as confluent_error  # noqa: E402
from kmq.client.confluent.errors import classify  # noqa: E402

CODES = [
    (10, RecordTooLarge), (18, RecordTooLarge), (87, RecordRefused), (2, RecordRefused), (3, TopicUnknown),
    (29, ProduceDenied), (90, ProducerFenced), (59, ProducerFenced), (45, ProducerFenced), (47, ProducerFenced),
    (7, ProduceFailed),  # REQUEST_TIMED_OUT: no class of its own
]


@pytest.mark.parametrize("code, kind", CODES)
def test_both_adapters_give_the_same_kmq_class_for_a_kafka_error_code(code, kind):
    raw = kp.for_code(code)("broker said no")
    mine = kafka_python_error(raw)
    assert type(mine) is kind and mine.__cause__ is raw
    theirs = confluent_error(ck.KafkaError(code), "t: ")
    assert type(theirs) is kind and str(theirs).startswith("t: ")


def test_librdkafka_local_errors_and_timeouts_are_kmq_errors_too():
    assert type(confluent_error(ck.KafkaError(ck.KafkaError._UNKNOWN_PARTITION))) is TopicUnknown
    assert type(confluent_error(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT))) is ProduceFailed
    assert type(kafka_python_error(kp.KafkaTimeoutError("no metadata"))) is ProduceFailed
    refused = ValueError("Need at least one: key or value")  # Python's own: refused before sending
    assert kafka_python_error(refused) is refused


def test_the_seam_functions_name_kmq_classes_only():
    for cls in (*factory.produce_errors(), *factory.producer_state_errors()):
        assert issubclass(cls, KmqError), cls
    assert factory.send_failure(RecordTooLarge("x")) == factory.SendFailure("too_large", True)
    assert factory.send_failure(TopicUnknown("x")) == factory.SendFailure("unknown_topic", False)
    assert factory.send_failure(ProduceDenied("x")) == factory.SendFailure("forbidden", False)
    assert factory.send_failure(RecordRefused("x")) == factory.SendFailure("invalid", True)
    assert factory.send_failure(ProduceFailed("x")) == factory.SendFailure("failed", False)


def test_logins_and_acls_refused_by_librdkafka_are_named():
    kafka = Config.from_dict({"kafka": {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                                        "sasl_username": "kmq", "sasl_password": "x"}}).kafka
    assert isinstance(classify(kafka, ck.KafkaError(ck.KafkaError.SASL_AUTHENTICATION_FAILED)), AuthenticationFailed)
    denied = classify(kafka, ck.KafkaError(ck.KafkaError.GROUP_AUTHORIZATION_FAILED))
    assert isinstance(denied, AuthorizationFailed) and "user 'kmq' a group operation" in str(denied)
    assert classify(kafka, ck.KafkaError(ck.KafkaError.REQUEST_TIMED_OUT)) is None
    err = factory.client_error(kafka, ck.KafkaException(ck.KafkaError(ck.KafkaError.TOPIC_AUTHORIZATION_FAILED)), "x")
    assert isinstance(err, AuthorizationFailed) and "a topic operation" in str(err)


class _Future:
    """kafka-python's FutureRecordMetadata, as far as KmqFuture uses it."""

    def __init__(self) -> None:
        self.is_done, self.value, self.exception, self._errbacks = False, None, None, []

    def add_errback(self, fn, *args):
        self._errbacks.append((fn, args))

    def failure(self, exc):
        self.is_done, self.exception = True, exc
        for fn, args in self._errbacks:
            fn(*args, exc)

    def get(self, timeout=None):
        if not self.is_done:
            raise kp.KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.")
        raise self.exception


def test_a_kafka_python_future_fails_with_one_kmq_error():
    raw = _Future()
    fut = KmqFuture(raw)
    seen = []
    fut.add_errback(seen.append)
    with pytest.raises(ProduceFailed, match="no delivery report within 0.1s"):
        fut.get(0.1)  # undecided: kmq's timeout, not the record's failure
    raw.failure(kp.MessageSizeTooLargeError("too large"))
    with pytest.raises(RecordTooLarge) as info:
        fut.get(1)
    assert seen == [info.value] and fut.exception is info.value
    assert isinstance(info.value.__cause__, kp.MessageSizeTooLargeError)
