"""kmq.share without a broker: the configuration dict, the acknowledgement rules of both modes,
the call discipline (states, threads, the callback) over a fake queue consumer, and the API
surface held against confluent_kafka's (names, values, methods)."""

from __future__ import annotations

import gc
import inspect
import logging
import socket
import threading
import time

import pytest

import kmq.share as share
from kmq.core.errors import (
    AuthenticationFailed,
    BrokerUnavailable,
    ConfigError,
    InvalidSettlement,
    KmqError,
    MarkerWriteError,
)
from kmq.core.message import KmqMessage
from kmq.core.settlement import Released
from kmq.share import AcknowledgeType, IllegalStateException, ShareConsumer, TopicPartition
from kmq.share.acknowledgements import due, unacknowledged
from kmq.share.connection import Unreachable
from kmq.share.settings import IGNORED_KEYS, KAFKA_KEYS, REFUSED_KEYS, AckMode, read_settings
from kmq.share.types import Message
from tests.helpers.kafka import wait_until

BASE = {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"}


# ------------------------------------------------------------------ the configuration dict
def test_group_id_is_required_as_natively():
    with pytest.raises(ValueError, match="group.id must be set"):
        read_settings({"bootstrap.servers": "x:1"})


def test_the_trackers_settings_are_not_consumer_keys():
    with pytest.raises(ConfigError, match="kmq.max.deliveries"):
        read_settings({**BASE, "kmq.max.deliveries": 3})


def test_an_unknown_key_is_named_and_a_native_network_key_is_ignored():
    with pytest.raises(ConfigError, match="kmq.leese.ms"):
        read_settings({**BASE, "kmq.leese.ms": 100})
    assert read_settings({**BASE, "socket.timeout.ms": 100, "fetch.wait.max.ms": 10}).group_id == "g"


def test_kmq_keys_set_the_subscribed_queue_and_the_clients():
    s = read_settings({**BASE, "share.acknowledgement.mode": "EXPLICIT", "max.poll.records": "50",
                       "kmq.lease.ms": 1500, "kmq.dlq.topic": "orders-dead",
                       "kmq.kafka.client": "confluent", "kmq.session.timeout.ms": 6000,
                       "kmq.heartbeat.interval.ms": "1000"})
    cfg = s.config_for("orders")
    q = cfg.queue("orders")
    assert (s.mode, s.max_poll_records) == (AckMode.EXPLICIT, 50)
    assert (q.lease, q.dlq_topic, q.markers_topic) == (1.5, "orders-dead", "orders__markers")
    assert (cfg.kafka.client, cfg.kafka.session_timeout, cfg.kafka.heartbeat_interval, cfg.consumer.group_id) == (
        "confluent", 6.0, 1.0, "g")


@pytest.mark.parametrize("key, instead", [("session.timeout.ms", "kmq.session.timeout.ms"),
                                          ("heartbeat.interval.ms", "kmq.heartbeat.interval.ms")])
def test_the_group_timing_keys_native_refuses_are_refused_and_name_the_kmq_key(key, instead):
    # Natively: ValueError "... is not supported for ... share consumer. It is defined broker side".
    with pytest.raises(ValueError, match="defined broker side") as err:
        ShareConsumer({**BASE, key: 6000})
    assert not isinstance(err.value, ConfigError) and instead in str(err.value)


@pytest.mark.parametrize("key, value", [("group.protocol", "consumer"), ("fetch.error.backoff.ms", 500),
                                        ("auto.offset.reset", "earliest")])
def test_keys_native_finds_not_applicable_are_value_errors(key, value):
    with pytest.raises(ValueError, match="not applicable"):
        read_settings({**BASE, key: value})


def test_error_cb_must_be_callable_as_natively():
    with pytest.raises(TypeError, match="error_cb"):
        read_settings({**BASE, "error_cb": 42})
    assert read_settings({**BASE, "error_cb": print}).error_cb is print


@pytest.mark.parametrize("conf, key", [({"share.acknowledgement.mode": "auto"}, "share.acknowledgement.mode"),
                                       ({"max.poll.records": 0}, "max.poll.records"),
                                       ({"kmq.lease.ms": "soon"}, "kmq.lease.ms"),
                                       ({"kmq.config": "kmq.yaml"}, "kmq.config")])
def test_a_bad_value_names_its_key(conf, key):
    with pytest.raises(ConfigError) as err:
        read_settings({**BASE, **conf})
    assert err.value.path == key


def test_max_poll_interval_ms_is_the_consumers_max_poll_interval():
    # Natively a member not polled within it leaves the group; on kmq the consumer gives its partitions up.
    assert read_settings(BASE).config_for("orders").consumer.max_poll_interval == 300.0
    cfg = read_settings({**BASE, "max.poll.interval.ms": "45000"}).config_for("orders")
    assert cfg.consumer.max_poll_interval == 45.0
    with pytest.raises(ConfigError) as err:
        read_settings({**BASE, "max.poll.interval.ms": "soon"})
    assert err.value.path == "max.poll.interval.ms"


# ------------------------------------------------------------------ a fake queue consumer
class Settled:
    def __init__(self) -> None:
        self.outcomes: list[tuple[int, str, object]] = []
        self.renewals: list[tuple[int, object]] = []

    def settled(self, msg, outcome, arg) -> None:
        self.outcomes.append((msg.offset, outcome, arg))

    def renewed(self, msg, lease) -> None:
        self.renewals.append((msg.offset, lease))


class FakeWriter:
    def __init__(self) -> None:
        self.failed_writes = 0
        self.fail = False
        self.flushes = 0

    def flush(self, timeout=None) -> None:
        self.flushes += 1
        if self.fail:
            raise MarkerWriteError("1 marker(s) not acknowledged")

    def flush_buffer(self) -> int:
        return 0


class FakeQueue:
    """What ShareConsumer uses of a KmqConsumer: poll, writer, close."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.settler = Settled()
        self.lock = threading.Lock()
        self.writer = FakeWriter()
        self.next_offset = 0
        self.ready = 0
        self.closed = False
        self.error: KmqError | None = None

    def give(self, n: int) -> None:
        self.ready += n

    def poll(self, timeout, max_records):
        if self.error is not None:
            raise self.error
        n, self.ready = min(self.ready, max_records), self.ready - min(self.ready, max_records)
        out = [KmqMessage(self.topic, 0, self.next_offset + i, None, b"v", [], 1, self.settler, self.lock)
               for i in range(n)]
        self.next_offset += n
        return out

    def close(self) -> None:
        self.closed = True


class FakeShareConsumer(ShareConsumer):
    queues: list[FakeQueue]

    def __init__(self, conf) -> None:
        super().__init__(conf)
        self.queues = []

    def open_queue(self, cfg, topic, max_records):  # type: ignore[override]
        q = FakeQueue(topic)
        self.queues.append(q)
        return q


def consumer(mode: str = "explicit", records: int = 3) -> tuple[FakeShareConsumer, FakeQueue]:
    c = FakeShareConsumer({**BASE, "share.acknowledgement.mode": mode})
    c.subscribe(["orders"])
    q = c.queues[0]
    q.give(records)
    return c, q


def test_a_share_consumer_dropped_without_close_closes_its_queue_consumer_at_once():
    c, q = consumer("implicit")
    c.poll(0)
    collecting = gc.isenabled()
    gc.disable()  # no reference cycle keeps it: it goes with its last reference, not at a later collection
    try:
        del c
        wait_until(lambda: q.closed, 5, what="the dropped consumer's queue consumer closed")
    finally:
        if collecting:
            gc.enable()
    assert q.settler.outcomes == []  # what the last poll returned is left to its locks


def test_a_closed_share_consumer_is_not_closed_again_when_dropped():
    c, q = consumer("implicit")
    c.close()
    q.closed = False
    del c
    gc.collect()
    assert not q.closed


# ------------------------------------------------------------------ the acknowledgement rules
def test_implicit_mode_accepts_the_last_poll_on_the_next_and_releases_it_on_close():
    c, q = consumer("implicit")
    first = c.poll(0)
    assert len(first) == 3 and q.settler.outcomes == []
    q.give(1)
    c.poll(0)
    assert q.settler.outcomes == [(0, "ack", None), (1, "ack", None), (2, "ack", None)]
    c.close()
    assert q.settler.outcomes[3:] == [(3, "nack", 0.0)] and q.closed
    assert isinstance(q.settler.outcomes[3][2], Released)  # released by close: not a delivery (kmq keeps the count)


def test_explicit_mode_applies_the_last_type_recorded_and_releases_the_rest_on_close():
    c, q = consumer("explicit")
    a, b, _ = c.poll(0)
    c.acknowledge(a, AcknowledgeType.ACCEPT)
    c.acknowledge(a, AcknowledgeType.REJECT)  # replaces the type before it is sent
    c.acknowledge_offset("orders", 0, b.offset(), AcknowledgeType.RELEASE)
    assert c.commit_sync(1) == {TopicPartition("orders", 0): None}
    assert q.settler.outcomes == [(0, "reject", "AcknowledgeType.REJECT"), (1, "nack", 0.0)]
    with pytest.raises(IllegalStateException, match="not in flight"):
        c.acknowledge(a, AcknowledgeType.ACCEPT)  # sent by the commit
    assert not isinstance(q.settler.outcomes[1][2], Released)  # a RELEASE asked for counts a delivery
    c.close()
    assert q.settler.outcomes[2:] == [(2, "nack", 0.0)]
    assert isinstance(q.settler.outcomes[2][2], Released)  # released by close: not a delivery (kmq keeps the count)


def test_explicit_mode_refuses_a_poll_while_a_record_is_unacknowledged():
    c, _ = consumer("explicit")
    batch = c.poll(0)
    c.acknowledge(batch[0])
    c.acknowledge(batch[1])
    with pytest.raises(IllegalStateException, match="1 record"):
        c.poll(0)
    c.acknowledge(batch[2], AcknowledgeType.ACCEPT)
    assert c.poll(0).is_empty()


def test_due_and_unacknowledged_follow_the_modes():
    msgs = [Message(KmqMessage("t", 0, i, None, b"", [], 1, Settled(), threading.Lock())) for i in range(3)]
    msgs[0]._ack = (AcknowledgeType.REJECT, "r")
    msgs[1]._applied = True
    assert [(m.offset(), k) for m, k, _ in due(msgs, AckMode.EXPLICIT)] == [(0, AcknowledgeType.REJECT)]
    assert [(m.offset(), k) for m, k, _ in due(msgs, AckMode.EXPLICIT, closing=True)] == [
        (0, AcknowledgeType.REJECT), (2, AcknowledgeType.RELEASE)]
    assert [(m.offset(), k) for m, k, _ in due(msgs, AckMode.IMPLICIT)] == [
        (0, AcknowledgeType.ACCEPT), (2, AcknowledgeType.ACCEPT)]
    assert unacknowledged(msgs) == 1


@pytest.mark.parametrize("change", ["subscribe", "unsubscribe"])
def test_a_subscription_change_accepts_the_last_poll_in_implicit_mode(change):
    c, q = consumer("implicit")
    c.poll(0)
    c.subscribe(["payments"]) if change == "subscribe" else c.unsubscribe()
    assert q.settler.outcomes == [(0, "ack", None), (1, "ack", None), (2, "ack", None)] and q.closed


def test_a_subscription_change_releases_what_explicit_mode_left_unacknowledged():
    c, q = consumer("explicit")
    a, _, _ = c.poll(0)
    c.acknowledge(a, AcknowledgeType.ACCEPT)
    c.unsubscribe()
    assert q.settler.outcomes == [(0, "ack", None), (1, "nack", 0.0), (2, "nack", 0.0)]


def test_the_callback_of_a_subscription_change_comes_from_the_next_call_as_natively():
    c, q = consumer("implicit")
    calls = []
    c.set_acknowledgement_commit_callback(lambda offsets, exc: calls.append((offsets, exc)))
    c.poll(0)
    c.subscribe(["payments"])
    assert calls == []
    c.poll(0)
    assert calls == [({TopicPartition("orders", 0): {0, 1, 2}}, None)]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_a_broker_subscribe_returns_and_poll_reports_to_error_cb():
    errors = []
    c = ShareConsumer({"bootstrap.servers": f"127.0.0.1:{_closed_port()}", "group.id": "g", "error_cb": errors.append})
    started = time.monotonic()
    c.subscribe(["orders"])
    assert c.subscription() == ["orders"] and c.kmq_consumer is None and errors == []  # served by poll
    assert c.poll(0.3).is_empty() and time.monotonic() - started < 3
    codes = [e.code() for e in errors]
    assert codes[:2] == [share.KafkaError._TRANSPORT, share.KafkaError._ALL_BROKERS_DOWN]
    assert "refused" in errors[0].str() and not any(e.fatal() for e in errors)
    assert c.commit_sync(1) == {} and c.commit_async() is None
    c.close()


def test_a_broker_that_appears_is_connected_on_a_later_poll():
    tries = []

    class Late(FakeShareConsumer):
        def open_queue(self, cfg, topic, max_records):  # type: ignore[override]
            tries.append(time.monotonic())
            if len(tries) < 3:
                raise Unreachable([("kafka:9092", BrokerUnavailable("connection refused by kafka:9092"))])
            return super().open_queue(cfg, topic, max_records)

    errors = []
    c = Late({**BASE, "error_cb": errors.append})
    c.subscribe(["orders"])
    deadline = time.monotonic() + 10
    while c.kmq_consumer is None:
        assert time.monotonic() < deadline
        assert c.poll(0.05).is_empty()
    c.queues[0].give(1)
    assert len(c.poll(0)) == 1
    assert [e.name() for e in errors] == ["_TRANSPORT", "_ALL_BROKERS_DOWN"] * 2
    assert tries[2] - tries[1] >= tries[1] - tries[0] > 0  # the backoff grows


def test_a_connection_error_a_retry_cannot_cure_is_raised_by_subscribe():
    class Refused(FakeShareConsumer):
        def open_queue(self, cfg, topic, max_records):  # type: ignore[override]
            raise AuthenticationFailed("SASL PLAIN login as 'u' refused: check kafka.sasl_password")

    c = Refused(BASE)
    with pytest.raises(AuthenticationFailed):
        c.subscribe(["orders"])
    assert c.subscription() == []


# ------------------------------------------------------------------ states, threads, callback
def test_calls_in_the_wrong_state_raise_illegal_state():
    c = FakeShareConsumer(BASE)
    with pytest.raises(IllegalStateException, match="not subscribed"):
        c.poll(0)
    assert c.commit_sync(1) == {} and c.commit_async() is None  # nothing to commit, as natively
    c.subscribe(["orders"])
    c.queues[0].give(1)
    (m,) = c.poll(0)
    with pytest.raises(IllegalStateException, match="explicit"):
        c.acknowledge(m)  # implicit mode (the default)
    c.close()
    for call in (lambda: c.poll(0), lambda: c.subscribe(["x"]), c.commit_async, lambda: c.commit_sync(1),
                 lambda: c.acknowledge(m), c.subscription, lambda: c.set_acknowledgement_commit_callback(None)):
        with pytest.raises(IllegalStateException, match="Share consumer closed"):
            call()
    assert isinstance(IllegalStateException("x"), RuntimeError)
    c.close()  # again: nothing


def test_bad_arguments_are_type_and_value_errors():
    c, _ = consumer("explicit")
    (m, *_) = c.poll(0)
    with pytest.raises(TypeError):
        c.acknowledge("not a message")
    with pytest.raises(TypeError):
        c.acknowledge(m, "ACCEPT")
    with pytest.raises(ValueError):
        c.acknowledge(m, 9)
    with pytest.raises(ValueError):
        c.acknowledge_offset("orders", -1, 0)
    with pytest.raises(TypeError):
        c.poll("1")
    with pytest.raises(TypeError):
        c.subscribe("orders")
    with pytest.raises(TypeError):
        c.set_acknowledgement_commit_callback(42)
    with pytest.raises(ValueError, match="one queue per consumer"):
        c.subscribe(["a", "b"])


def test_the_callback_runs_on_the_calling_thread_and_may_not_call_back_in():
    c, q = consumer("explicit")
    calls, inner = [], []

    def callback(offsets, exc) -> None:
        calls.append((threading.get_ident(), offsets, exc))
        try:
            c.poll(0)
        except IllegalStateException as e:
            inner.append(e)

    c.set_acknowledgement_commit_callback(callback)
    for m in c.poll(0):
        c.acknowledge(m)
    c.commit_async()
    assert calls == [(threading.get_ident(), {TopicPartition("orders", 0): {0, 1, 2}}, None)]
    assert len(inner) == 1 and "callback" in str(inner[0])


def test_a_marker_not_written_in_time_fails_the_commit_per_partition():
    c, q = consumer("explicit")
    reported = []
    c.set_acknowledgement_commit_callback(lambda offsets, exc: reported.append(exc))
    for m in c.poll(0):
        c.acknowledge(m)
    q.writer.fail = True
    (err,) = c.commit_sync(1).values()
    assert isinstance(err, share.KafkaException) and err.args[0].retriable() and reported == [err]


def test_a_second_thread_inside_a_call_is_refused():
    c, _ = consumer("implicit")
    entered, release = threading.Event(), threading.Event()

    def slow_poll(timeout, max_records):
        entered.set()
        release.wait(5)
        return []

    c.queues[0].poll = slow_poll
    t = threading.Thread(target=c.poll, args=(1,))
    t.start()
    entered.wait(5)
    try:
        with pytest.raises(share.ConcurrentModificationException):
            c.subscription()
    finally:
        release.set()
        t.join(5)


def test_a_fetch_error_is_a_kafka_exception_with_its_cause():
    c, q = consumer("implicit")
    q.error = MarkerWriteError("START not acknowledged")
    with pytest.raises(share.KafkaException) as err:
        c.poll(0)
    assert isinstance(err.value.__cause__, MarkerWriteError) and err.value.args[0].retriable()


# ------------------------------------------------------------------ kmq extras
def test_extras_release_with_a_delay_reject_with_a_reason_and_renew():
    c, q = consumer("explicit")
    a, b, d = c.poll(0)
    c.kmq_release(a, 2.5)
    c.kmq_reject(b, "no schema")
    c.kmq_renew(d, 30)
    with pytest.raises(InvalidSettlement):
        c.kmq_release(d, -1)
    c.acknowledge(d)
    c.commit_sync(1)
    assert q.settler.outcomes == [(0, "nack", 2.5), (1, "reject", "no schema"), (2, "ack", None)]
    assert q.settler.renewals == [(2, 30)]


def test_message_reads_like_confluents():
    km = KmqMessage("t", 2, 7, b"k", b"value", [("kmq-delivery-count", b"3")], 1234, Settled(), threading.Lock())
    m = Message(km)
    assert (m.topic(), m.partition(), m.offset(), m.key(), m.value()) == ("t", 2, 7, b"k", b"value")
    assert (m.headers(), m.timestamp(), m.error(), m.delivery_count(), len(m)) == (
        [("kmq-delivery-count", b"3")], (1, 1234), None, 3, 5)
    bare = Message(KmqMessage("t", 0, 0, None, None, [], None, Settled(), threading.Lock()))
    assert (bare.headers(), bare.timestamp(), bare.delivery_count()) == (None, (0, -1), 1)


# ------------------------------------------------------------------ the surface, held against confluent_kafka
ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka (kmq[confluent]) not installed")


def _public(cls) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_acknowledge_type_has_confluents_names_and_values():
    assert {t.name: int(t) for t in AcknowledgeType} == {t.name: int(t) for t in ck.AcknowledgeType}


def test_share_consumer_and_its_values_offer_every_native_method():
    assert _public(ck.ShareConsumer) <= _public(ShareConsumer)
    assert {"__enter__", "__exit__"} <= set(dir(ShareConsumer))
    assert _public(ck.Messages) <= _public(share.Messages)
    wanted = {"topic", "partition", "offset", "key", "value", "headers", "timestamp", "error", "delivery_count",
              "latency", "leader_epoch"}
    assert wanted <= _public(ck.Message) and wanted <= _public(Message)
    extras = _public(ShareConsumer) - _public(ck.ShareConsumer)
    assert all(n.startswith("kmq_") for n in extras - {"open_queue"}), extras


def test_native_signatures_have_the_same_defaults():
    assert inspect.signature(ShareConsumer.poll).parameters["timeout"].default == -1
    assert inspect.signature(ShareConsumer.commit_sync).parameters["timeout"].default == 60
    assert inspect.signature(ShareConsumer.acknowledge).parameters["ack_type"].default is AcknowledgeType.ACCEPT


def test_exports_are_what_all_names():
    assert sorted(share.__all__) == sorted(n for n in share.__all__ if hasattr(share, n))
    assert issubclass(share.IllegalStateException, RuntimeError) and issubclass(share.KafkaException, KmqError)


NATIVE_BASE = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}


@pytest.mark.parametrize("key", sorted(REFUSED_KEYS))
def test_a_key_kmq_refuses_as_native_is_refused_by_native(key):
    value = {"group.protocol": "consumer", "auto.offset.reset": "earliest"}.get(key, 1000)
    with pytest.raises(ValueError, match="defined broker side|not applicable"):
        ck.ShareConsumer({**NATIVE_BASE, key: value})


@pytest.mark.parametrize("key", sorted(IGNORED_KEYS | set(KAFKA_KEYS)))
def test_every_native_key_kmq_accepts_is_accepted_by_native(key):
    samples = {"security.protocol": "plaintext", "sasl.mechanism": "PLAIN", "sasl.mechanisms": "PLAIN",
               "debug": "generic", "broker.address.family": "v4", "socket.keepalive.enable": True,
               "log.connection.close": True, "api.version.request": True,
               "enable.sasl.oauthbearer.unsecure.jwt": False, "error_cb": print, "stats_cb": print,
               "throttle_cb": print, "statistics.interval.ms": 0, "log_level": 6,
               "logger": logging.getLogger("native-share-consumer")}
    value = samples.get(key, 1000 if key.endswith((".ms", ".bytes")) else "x")
    ck.ShareConsumer({**NATIVE_BASE, key: value}).close()


def test_commits_before_subscribe_answer_as_natively():
    native = ck.ShareConsumer(NATIVE_BASE)
    try:
        expected = (native.commit_sync(), native.commit_async())
    finally:
        native.close()
    c = FakeShareConsumer(BASE)
    assert (c.commit_sync(), c.commit_async()) == expected == ({}, None)


def test_a_batch_settles_in_its_order_and_a_record_settled_directly_keeps_its_outcome():
    c, q = consumer("explicit")
    a, b, d = c.poll(0)
    b.kmq_message.reject("bad")  # the application settles one through the kmq extra
    c.acknowledge(a, AcknowledgeType.ACCEPT)
    c.acknowledge(b, AcknowledgeType.ACCEPT)
    c.acknowledge(d, AcknowledgeType.RELEASE)
    c.poll(0)
    assert q.settler.outcomes == [(1, "reject", "bad"), (0, "ack", None), (2, "nack", 0.0)]
    assert [m.kmq_message.outcome for m in (a, b, d)] == ["ack", "reject", "nack"]
