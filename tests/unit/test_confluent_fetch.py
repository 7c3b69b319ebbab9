"""The confluent-kafka group consumer adapter's fetch, against a stand-in for librdkafka's consumer.

The stand-in keeps librdkafka's ``consume(n, timeout)`` contract: it returns once ``n`` records
are there, else after ``timeout`` with what there is; its clock only moves when it waits.
"""

from __future__ import annotations

import pytest

pytest.importorskip("confluent_kafka", reason="the confluent-kafka extra is not installed")

import confluent_kafka as ck  # noqa: E402

from kmq.client.confluent.consumer import ConfluentConsumer  # noqa: E402
from kmq.config import Config  # noqa: E402
from kmq.core.errors import AuthorizationFailed, BrokerUnavailable  # noqa: E402


class FakeMessage:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self):
        return None

    def topic(self):
        return "q"

    def partition(self):
        return 0

    def offset(self):
        return self._offset

    def key(self):
        return None

    def value(self):
        return b"v%d" % self._offset

    def headers(self):
        return None

    def timestamp(self):
        return (1, 1000 + self._offset)


class FakeRdkafka:
    """librdkafka's consume contract, with a clock that moves only while it waits."""

    def __init__(self, queued: int) -> None:
        self.queued = [FakeMessage(i) for i in range(queued)]
        self.waited = 0.0
        self.memberid_calls = 0
        self.callbacks = {}

    def consume(self, n: int, timeout: float) -> list:
        if len(self.queued) < n:
            self.waited += timeout  # not enough records: librdkafka waits the whole timeout
        out, self.queued = self.queued[:n], self.queued[n:]
        return out

    def memberid(self) -> str:
        self.memberid_calls += 1
        return f"member-{self.memberid_calls}"

    def subscribe(self, topics, on_assign, on_revoke, on_lost) -> None:
        self.callbacks = {"assign": on_assign, "revoke": on_revoke}


def test_a_fetch_returns_the_records_that_are_there_without_waiting_for_a_full_batch():
    raw = FakeRdkafka(queued=3)
    got = ConfluentConsumer(raw).fetch(0.5, 500)
    assert [r.offset for r in got] == [0, 1, 2]
    assert raw.waited == 0.0  # a low rate's records are not held for the poll timeout


def test_a_fetch_takes_at_most_max_records_and_waits_only_when_nothing_is_there():
    raw = FakeRdkafka(queued=5)
    c = ConfluentConsumer(raw)
    assert [r.offset for r in c.fetch(0.5, 2)] == [0, 1]
    assert [r.offset for r in c.fetch(0.5, 1)] == [2]
    assert [r.offset for r in c.fetch(0.5, 10)] == [3, 4]
    assert raw.waited == 0.0
    assert c.fetch(0.5, 10) == []
    assert raw.waited == 0.5


def test_the_member_id_is_asked_once_per_membership_not_per_fetch():
    raw = FakeRdkafka(queued=0)
    c = ConfluentConsumer(raw)
    c.subscribe(["q"], lambda parts: None, lambda parts: None)
    assert [c.member_id() for _ in range(3)] == ["member-1"] * 3
    assert raw.memberid_calls == 1
    raw.callbacks["revoke"](None, [])  # a rebalance: the member may have a new id
    raw.callbacks["assign"](None, [])
    assert c.member_id() == "member-2"


class FailingRdkafka(FakeRdkafka):
    """librdkafka's consume raising ``error`` (a refused login or an ACL denial come so)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(queued=0)
        self.error = error

    def consume(self, n: int, timeout: float) -> list:
        raise self.error


class FatalRecord(FakeMessage):
    def error(self):
        return ck.KafkaError(ck.KafkaError._FATAL, "fenced", fatal=True)


KAFKA = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:9", "sasl_username": "svc"},
                          "queues": [{"name": "q"}]}).kafka


def test_a_fetch_librdkafka_fails_raises_kmqs_error_naming_what_failed():
    denied = ck.KafkaException(ck.KafkaError(ck.KafkaError.TOPIC_AUTHORIZATION_FAILED, "not allowed"))
    with pytest.raises(AuthorizationFailed, match="Kafka denied user 'svc' a topic operation") as got:
        ConfluentConsumer(FailingRdkafka(denied), kafka=KAFKA).fetch(0.5, 10)
    assert got.value.__cause__ is denied
    raw = FakeRdkafka(queued=0)
    raw.queued = [FatalRecord(0)]
    c = ConfluentConsumer(raw, kafka=KAFKA)
    c.subscribe(["q"], lambda parts: None, lambda parts: None)
    with pytest.raises(BrokerUnavailable, match=r"^consuming q failed: fenced"):
        c.fetch(0.5, 10)
