"""What a user of the share-consumer API relies on, run against each implementation.

One set of tests, parametrised over:

* ``kmq-kafka-python``, ``kmq-confluent``: :class:`kmq.share.ShareConsumer` (``kafka.client``
  kafka-python or confluent underneath) on the test broker, with a running tracker (release,
  reject, lock expiry and close need it);
* ``native``: ``confluent_kafka.ShareConsumer`` on the suite's Apache Kafka (``KMQ_TEST_BROKER=kafka``),
  or on the broker ``KMQ_TEST_SHARE_BOOTSTRAP=host:port`` names, which must have share groups
  (Apache Kafka 4.2+) with ``group.share.record.lock.duration.ms`` given as ``KMQ_TEST_SHARE_LOCK_MS`` (default 30000; a broker started with
  ``group.share.record.lock.duration.ms=1000`` and ``group.share.min.record.lock.duration.ms=1000``
  keeps the run short); without it that half is skipped (the embedded tansu broker has no share
  groups: a share consumer there never receives a record).

The tests see only the API; what each implementation offers beside it (seeing that nothing is
left to redeliver, the DLQ) is in its backend class below. No sleeps on the kmq side: every wait
is on a condition (a copy in the queue topic, the tracker having read every marker with nothing
open). The native backend waits out the broker's lock duration where it cannot observe it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any, Callable

import pytest

from kmq.client.topics import ensure_topics
from kmq.config import Config
from kmq.core.message import delivery_count_of
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import produce, read_all, wait_until
from tests.helpers.produce_blackhole import ProduceBlackhole
from tests.integration.tracker_util import metric, running_tracker

pytestmark = pytest.mark.integration

LEASE_MS = 1500
#: One queue per test of a backend (they share one tracker): at least the number of tests.
POOL = 20
NATIVE_ENV = "KMQ_TEST_SHARE_BOOTSTRAP"


class KmqBackend:
    """kmq.share.ShareConsumer over pre-created queues, one tracker for all of them."""

    def __init__(self, bootstrap: str, client: str) -> None:
        import kmq.share as api

        self.api = api
        self.bootstrap = bootstrap
        self.client = client
        self.names = [unique("share") for _ in range(POOL)]
        queue = {"lease": f"{LEASE_MS}ms", "max_deliveries": 5,
                 "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0}}
        self.cfg = Config.from_dict({
            "kafka": {"bootstrap_servers": bootstrap, **TEST_GROUP_TIMING, "client": client},
            "queues": [{"name": n, **queue} for n in self.names],
            "tracker": {"group_id": unique("tracker"), "http_port": 0},
        })
        for q in self.cfg.queues:
            ensure_topics(self.cfg.kafka, q, 1)
        self.tracker: Any = None

    def queue(self) -> "Queue":
        return Queue(self, self.names.pop())

    def config(self, group: str, mode: str) -> dict:
        return {"bootstrap.servers": self.bootstrap, "group.id": group, "share.acknowledgement.mode": mode,
                "kmq.session.timeout.ms": 6000, "kmq.heartbeat.interval.ms": 1000, "kmq.kafka.client": self.client,
                "kmq.lease.ms": LEASE_MS, "kmq.ack.flush.interval.ms": 50}

    def produce(self, topic: str, values: list[bytes]) -> None:
        produce(self.cfg, topic, values=values, partition=None)

    def wait_lock_expired(self, topic: str, value: bytes) -> None:
        """The tracker has redelivered ``value`` (its copy is in the queue topic)."""
        wait_until(lambda: any(r.value == value and delivery_count_of(r.headers) >= 2
                               for r in read_all(self.bootstrap, topic, timeout=2)), 30,
                   what=f"the tracker's copy of {value!r}")

    def _settled(self, topic: str, markers_topic: str) -> bool:
        port = self.tracker.http_port
        written = len(read_all(self.bootstrap, markers_topic, timeout=2))
        read = metric(port, "kmq_tracker_markers_total", queue=topic)
        return written > 0 and read >= written and metric(port, "kmq_tracker_in_flight", queue=topic) == 0

    def assert_never_redelivered(self, topic: str, group: str, values: list[bytes]) -> None:
        """Once the tracker has read every marker and holds nothing open, nothing can come back:
        no copy of ``values`` may be in the queue topic."""
        q = self.cfg.queue(topic)
        wait_until(lambda: self._settled(topic, q.markers_topic), 30, what="the tracker to hold nothing open")
        copies = [r.value for r in read_all(self.bootstrap, topic, timeout=2)
                  if r.value in values and delivery_count_of(r.headers) >= 2]
        assert copies == [], f"redelivered: {copies}"

    def dead_letters(self, topic: str, expect: int) -> list[bytes] | None:
        q = self.cfg.queue(topic)
        return [r.value for r in wait_until(lambda: read_all(self.bootstrap, q.dlq_topic, timeout=2, expect=expect), 30,
                                            what="dead letters")]


class NativeBackend:
    """confluent_kafka.ShareConsumer on a broker with share groups."""

    def __init__(self, bootstrap: str, lock_ms: int) -> None:
        import confluent_kafka as api
        from confluent_kafka.admin import AdminClient

        self.api = api
        self.bootstrap = bootstrap
        self.lock_s = lock_ms / 1000
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.tracker = None

    def queue(self) -> "Queue":
        from confluent_kafka.admin import NewTopic

        topic = unique("share")
        for f in self.admin.create_topics([NewTopic(topic, 1, 1)]).values():
            f.result(30)
        return Queue(self, topic)

    def config(self, group: str, mode: str) -> dict:
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        # A new share group starts at the log end: this one reads the records produced before it joined.
        res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
        for f in self.admin.incremental_alter_configs([res]).values():
            f.result(30)
        return {"bootstrap.servers": self.bootstrap, "group.id": group, "share.acknowledgement.mode": mode}

    def produce(self, topic: str, values: list[bytes]) -> None:
        produce(self.bootstrap, topic, values=values, partition=None, client="confluent")

    def wait_lock_expired(self, topic: str, value: bytes) -> None:
        time.sleep(self.lock_s + 1)  # the broker's lock timer, started by the poll just made; not observable

    def assert_never_redelivered(self, topic: str, group: str, values: list[bytes]) -> None:
        with self.api.ShareConsumer(self.config(group, "implicit")) as c:
            c.subscribe([topic])
            deadline = time.monotonic() + self.lock_s + 2
            while time.monotonic() < deadline:
                got = [m.value() for m in c.poll(0.5) if m.error() is None]
                assert not set(got) & set(values), f"redelivered: {got}"

    def dead_letters(self, topic: str, expect: int) -> None:
        return None  # a share group archives rejected records; there is no DLQ


class Queue:
    """One test's topic on a backend, and the consumers it opened (closed at the end)."""

    def __init__(self, backend: Any, topic: str) -> None:
        self.backend = backend
        self.api = backend.api
        self.topic = topic
        self.group = unique("share-group")
        self.opened: list[Any] = []

    def consumer(self, mode: str = "explicit", group: str | None = None, **conf: Any) -> Any:
        c = self.api.ShareConsumer({**self.backend.config(group or self.group, mode), **conf})
        self.opened.append(c)
        c.subscribe([self.topic])
        return c

    def produce(self, *values: bytes) -> None:
        self.backend.produce(self.topic, list(values))

    def wait_lock_expired(self, value: bytes) -> None:
        self.backend.wait_lock_expired(self.topic, value)

    def assert_never_redelivered(self, *values: bytes) -> None:
        self.backend.assert_never_redelivered(self.topic, self.group, list(values))

    def dead_letters(self, expect: int) -> list[bytes] | None:
        return self.backend.dead_letters(self.topic, expect)

    def close_all(self) -> None:
        for c in self.opened:
            with contextlib.suppress(Exception):
                c.close()


@pytest.fixture(scope="module", params=["kmq-kafka-python", "kmq-confluent", "native"])
def backend(request, bootstrap, kafka_broker):
    if request.param == "native":
        native, lock_ms = os.environ.get(NATIVE_ENV), int(os.environ.get("KMQ_TEST_SHARE_LOCK_MS", "30000"))
        if not native and kafka_broker.kind == "kafka":  # the suite's own Apache Kafka has share groups
            native, lock_ms = bootstrap, int(kafka_broker.dev.settings["group.share.record.lock.duration.ms"])
        if not native:
            pytest.skip(f"{NATIVE_ENV} not set: confluent_kafka.ShareConsumer needs a broker with share groups "
                        "(Apache Kafka 4.2+); the embedded tansu broker has none")
        yield NativeBackend(native, lock_ms)
        return
    b = KmqBackend(bootstrap, request.param.removeprefix("kmq-"))
    with running_tracker(b.cfg) as tracker:
        b.tracker = tracker
        yield b


@pytest.fixture
def queue(backend):
    q = backend.queue()
    try:
        yield q
    finally:
        q.close_all()


def poll_until(consumer: Any, done: Callable[[list], bool], on_message: Callable[[Any], None] | None = None,
               timeout: float = 40.0) -> list:
    """Poll (0.5 s at a time) until ``done(all messages so far)``; ``on_message`` sees each one."""
    seen: list = []
    deadline = time.monotonic() + timeout
    while not done(seen):
        assert time.monotonic() < deadline, f"timed out; saw {[m.value() for m in seen]}"
        for m in consumer.poll(0.5):
            assert m.error() is None
            seen.append(m)
            if on_message is not None:
                on_message(m)
    return seen


def values_of(messages: list) -> set[bytes]:
    return {m.value() for m in messages}


# ------------------------------------------------------------------ acknowledgement modes
def test_implicit_mode_accepts_the_last_poll_on_the_next_poll(queue):
    queue.produce(b"a", b"b", b"c")
    c = queue.consumer("implicit")
    reported: list = []
    c.set_acknowledgement_commit_callback(lambda offsets, exc: reported.append((offsets, exc)))
    seen = poll_until(c, lambda s: len(s) >= 3)
    # One more call accepts the tail batch; the callback reports every record as accepted.
    poll_until(c, lambda _: {o for offsets, _ in reported for os_ in offsets.values() for o in os_}
               >= {m.offset() for m in seen}, timeout=20)
    assert values_of(seen) == {b"a", b"b", b"c"} and all(m.delivery_count() == 1 for m in seen)
    assert all(exc is None for _, exc in reported)
    c.close()
    queue.assert_never_redelivered(b"a", b"b", b"c")


def test_explicit_accept_is_final_and_commit_sync_reports_each_partition(queue):
    queue.produce(b"a", b"b")
    c = queue.consumer("explicit")
    seen = poll_until(c, lambda s: len(s) >= 2, lambda m: c.acknowledge(m, queue.api.AcknowledgeType.ACCEPT))
    result = c.commit_sync(10)
    assert [(tp.topic, tp.partition) for tp in result] == [(queue.topic, 0)]
    assert list(result.values()) == [None]
    assert c.commit_sync(10) == {}  # nothing pending any more
    c.close()
    assert values_of(seen) == {b"a", b"b"}
    queue.assert_never_redelivered(b"a", b"b")


def test_explicit_mode_refuses_to_poll_past_an_unacknowledged_record(queue):
    queue.produce(b"a")
    c = queue.consumer("explicit")
    (m,) = poll_until(c, lambda s: len(s) >= 1)
    with pytest.raises(queue.api.IllegalStateException):
        c.poll(0.1)
    c.acknowledge(m, queue.api.AcknowledgeType.ACCEPT)
    c.acknowledge(m, queue.api.AcknowledgeType.ACCEPT)  # again before it is sent: no error
    c.poll(0.1)
    with pytest.raises(queue.api.IllegalStateException):  # sent with that poll: no longer in flight
        c.acknowledge(m, queue.api.AcknowledgeType.ACCEPT)


def test_implicit_mode_refuses_acknowledge(queue):
    queue.produce(b"a")
    c = queue.consumer("implicit")
    (m,) = poll_until(c, lambda s: len(s) >= 1)
    with pytest.raises(queue.api.IllegalStateException):
        c.acknowledge(m, queue.api.AcknowledgeType.ACCEPT)
    c.close()
    with pytest.raises(queue.api.IllegalStateException, match="closed"):
        c.poll(0.1)
    c.close()  # a second close does nothing


# ------------------------------------------------------------------ acknowledgement types
def test_release_redelivers_with_a_higher_delivery_count(queue):
    A = queue.api.AcknowledgeType
    queue.produce(b"retry-me")
    c = queue.consumer("explicit")

    def settle(m) -> None:
        c.acknowledge(m, A.RELEASE if m.delivery_count() == 1 else A.ACCEPT)

    seen = poll_until(c, lambda s: len(s) >= 2, settle)
    assert [(m.value(), m.delivery_count()) for m in seen] == [(b"retry-me", 1), (b"retry-me", 2)]


def test_reject_is_never_redelivered(queue):
    queue.produce(b"poison")
    c = queue.consumer("explicit")
    poll_until(c, lambda s: len(s) >= 1, lambda m: c.acknowledge(m, queue.api.AcknowledgeType.REJECT))
    assert list(c.commit_sync(10).values()) == [None]
    c.close()
    dead = queue.dead_letters(expect=1)
    assert dead is None or dead == [b"poison"]  # kmq: in the DLQ; native: archived
    queue.assert_never_redelivered(b"poison")


def test_a_record_held_past_its_lock_comes_back(queue):
    queue.produce(b"slow")
    c = queue.consumer("implicit")
    (first,) = poll_until(c, lambda s: len(s) >= 1)
    queue.wait_lock_expired(b"slow")
    again = poll_until(c, lambda s: len(s) >= 1)
    assert (first.delivery_count(), [(m.value(), m.delivery_count()) for m in again]) == (1, [(b"slow", 2)])


def test_acknowledge_offset_settles_a_record_by_its_coordinates(queue):
    A = queue.api.AcknowledgeType
    queue.produce(b"keep", b"again")
    c = queue.consumer("explicit")

    def settle(m) -> None:  # by coordinates only: ACCEPT (the default) and RELEASE
        if m.value() == b"again" and m.delivery_count() == 1:
            c.acknowledge_offset(m.topic(), m.partition(), m.offset(), A.RELEASE)
        else:
            c.acknowledge_offset(m.topic(), m.partition(), m.offset())

    seen = poll_until(c, lambda s: sum(m.value() == b"again" for m in s) >= 2, settle)
    assert sorted((m.value(), m.delivery_count()) for m in seen) == [(b"again", 1), (b"again", 2), (b"keep", 1)]
    with pytest.raises(queue.api.IllegalStateException):  # not in flight: no record of this poll there
        c.acknowledge_offset(queue.topic, 0, 10_000, A.ACCEPT)
    assert list(c.commit_sync(10).values()) == [None]
    c.close()
    queue.assert_never_redelivered(b"keep")


# ------------------------------------------------------------------ commits and close
def accept_three_with_a_callback(queue) -> tuple[Any, list, list]:
    """Three records polled and accepted in explicit mode, a commit callback recording its calls:
    (consumer, calls, messages); the last batch's acknowledgements are not sent yet."""
    queue.produce(b"a", b"b", b"c")
    c = queue.consumer("explicit")
    calls: list = []
    c.set_acknowledgement_commit_callback(lambda offsets, exc: calls.append((offsets, exc)))
    seen = poll_until(c, lambda s: len(s) >= 3, lambda m: c.acknowledge(m, queue.api.AcknowledgeType.ACCEPT))
    return c, calls, seen


def test_commit_callback_reports_the_acknowledged_offsets(queue):
    c, calls, seen = accept_three_with_a_callback(queue)
    assert c.commit_async() is None

    def reported() -> set[int]:
        return {o for offsets, _ in calls for tp, offs in offsets.items() if tp.topic == queue.topic for o in offs}

    poll_until(c, lambda _: reported() >= {m.offset() for m in seen}, timeout=20)
    assert all(exc is None for _, exc in calls)
    assert all(isinstance(offs, set) for offsets, _ in calls for offs in offsets.values())


@pytest.mark.parametrize("mode", ["explicit", "implicit"])
def test_close_releases_what_is_held(queue, mode):
    queue.produce(b"first", b"second")
    a = queue.consumer(mode)
    batch = poll_until(a, lambda s: len(s) >= 1)
    accepted = set()
    if mode == "explicit":  # accept one, hold the rest
        a.acknowledge(batch[0], queue.api.AcknowledgeType.ACCEPT)
        accepted.add(batch[0].value())
    a.close()
    b = queue.consumer(mode)
    expected = {b"first", b"second"} - accepted
    ack = (lambda m: b.acknowledge(m, queue.api.AcknowledgeType.ACCEPT)) if mode == "explicit" else None
    seen = poll_until(b, lambda s: values_of(s) >= expected, ack)
    b.poll(0.1) if mode == "implicit" else b.commit_sync(10)  # accept the tail
    b.close()
    assert not values_of(seen) & accepted
    counts = {m.value(): m.delivery_count() for m in seen if m.value() in expected}
    if isinstance(queue.backend, KmqBackend):  # released by close, not by the application: no delivery counted
        assert counts == {v: 1 for v in expected}
    else:  # measured on Kafka 4.2 with confluent-kafka 2.16: native counts one (docs/share-consumer.md)
        assert set(counts.values()) <= {1, 2}
    if accepted:
        queue.assert_never_redelivered(*accepted)


@pytest.mark.parametrize("change", ["subscribe", "unsubscribe"])
def test_implicit_mode_a_subscription_change_accepts_the_last_poll(queue, backend, change):
    other = backend.queue()
    queue.produce(b"a", b"b")
    c = queue.consumer("implicit")
    reported: list = []
    c.set_acknowledgement_commit_callback(lambda offsets, exc: reported.append((offsets, exc)))
    seen = poll_until(c, lambda s: len(s) >= 2)
    if change == "unsubscribe":
        c.unsubscribe()
    c.subscribe([other.topic])

    def accepted() -> set[int]:
        return {o for offsets, exc in reported if exc is None
                for tp, offs in offsets.items() if tp.topic == queue.topic for o in offs}

    poll_until(c, lambda _: accepted() >= {m.offset() for m in seen}, timeout=20)
    c.close()
    queue.assert_never_redelivered(b"a", b"b")


def test_the_commit_callback_comes_within_the_poll_that_sends_the_acknowledgements(queue):
    c, calls, seen = accept_three_with_a_callback(queue)
    c.poll(2.0)  # sends the last batch's acknowledgements; their callback comes back within it
    reported = {o for offsets, exc in calls if exc is None for offs in offsets.values() for o in offs}
    assert reported >= {m.offset() for m in seen}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_broker_is_reported_to_error_cb_until_one_answers(queue, backend):
    port = _free_port()  # nothing listens here until the proxy below does
    errors: list = []
    c = queue.api.ShareConsumer({**backend.config(queue.group, "implicit"),
                                 "bootstrap.servers": f"127.0.0.1:{port}", "error_cb": errors.append})
    queue.opened.append(c)
    c.subscribe([queue.topic])  # returns: the consumer connects when it can
    deadline = time.monotonic() + 20
    while not any(e.code() == queue.api.KafkaError._TRANSPORT for e in errors):
        assert time.monotonic() < deadline, f"no transport error reported; got {errors}"
        assert len(c.poll(0.2)) == 0
    assert not any(e.fatal() for e in errors)
    broker_port = int(backend.bootstrap.rpartition(":")[2])
    proxy = ProduceBlackhole(broker_port, port=port)  # a broker answers there now
    try:
        queue.produce(b"late")
        seen = poll_until(c, lambda s: b"late" in values_of(s))
        c.close()
    finally:
        proxy.close()
    assert [m.delivery_count() for m in seen if m.value() == b"late"] == [1]
