"""Redeliverer decisions and failure handling with a fake log and producer (no broker)."""

from __future__ import annotations

from collections import namedtuple

from kmq.config import BackoffConfig, QueueConfig
from kmq.markers import Closed, Outcome, Reject, Start, decode
from kmq.metrics import TrackerMetrics
from kmq.ranges import OffsetRange
from tracker.lease_state import PartitionState
from tracker.log_reader import ReadResult
from tracker.redeliver import Redeliverer

Rec = namedtuple("Rec", "offset key value headers")
Q = QueueConfig.named("orders", lease=1.0, max_deliveries=3, backoff=BackoffConfig(initial=1.0, max=4.0))


class FakeFuture:
    def __init__(self, error=None):
        self.error = error

    def get(self, timeout=None):
        if self.error:
            raise self.error
        return None


class FakeProducer:
    def __init__(self, fail_topics=()):
        self.sent = []
        self.fail_topics = set(fail_topics)

    def send(self, topic, value=None, key=None, headers=None, partition=None):
        self.sent.append((topic, partition, key, value, dict(headers or [])))
        return FakeFuture(RuntimeError("broker said no") if topic in self.fail_topics else None)

    def flush(self, timeout=None):
        pass

    def partitions_for(self, topic):
        return {0, 1}


class FakeReader:
    def __init__(self, records):
        self.records = records

    def read(self, topic, partition, ranges):
        found, missing = {}, []
        for r in ranges:
            for o in range(r[0], r[0] + r[1]):
                if o in self.records:
                    found[o] = self.records[o]
                else:
                    missing.append(OffsetRange(o, 1))
        return ReadResult(found, missing)


def records(n, count_header=None):
    h = [("app", b"1")] + ([("kmq-delivery-count", str(count_header).encode())] if count_header else [])
    return {o: Rec(o, b"k%d" % o, b"v%d" % o, h) for o in range(n)}


def setup(recs, producer, now=10_000):
    clock = {"now": now}
    red = Redeliverer(producer, FakeReader(recs), TrackerMetrics(), clock_ms=lambda: clock["now"])
    st = PartitionState(Q.backoff.delay, Q.max_deliveries)
    return red, st, clock


def test_copies_go_to_the_same_partition_with_count_and_origin_then_closed():
    prod = FakeProducer()
    red, st, clock = setup(records(2), prod)
    st.apply(Start([(0, 2)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 1, st, st.due(clock["now"]))
    assert rep.redelivered == 2 and st.in_flight == 0
    copies = [s for s in prod.sent if s[0] == "orders"]
    assert [(p, h["kmq-delivery-count"], h["kmq-origin"], h["app"]) for _, p, _, _, h in copies] == [
        (1, b"2", b"orders/1/0", b"1"), (1, b"2", b"orders/1/1", b"1")]
    (closed,) = [decode(v) for t, _, _, v, _ in prod.sent if t == "orders__markers"]
    assert closed == Closed([(0, 2)], Outcome.REDELIVERED)


def test_dead_letter_partition_is_original_mod_dlq_partitions_and_reject_reason_kept():
    prod = FakeProducer()
    red, st, clock = setup(records(1), prod)
    st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
    st.apply(Reject([(0, 1)], reason="bad payload"), 1, 5)
    red.process(Q, 3, st, st.due(clock["now"]))
    ((topic, p, _, _, h),) = [s for s in prod.sent if s[0] == "orders__dlq"]
    assert p == 3 % 2 and h["kmq-dlq-reason"] == b"rejected" and h["kmq-dlq-error"] == b"bad payload"
    assert h["kmq-delivery-count"] == b"1" and h["kmq-dlq-ts"] == b"10000"


def test_backoff_by_delivery_count_defers_without_producing():
    prod = FakeProducer()
    red, st, clock = setup(records(1, count_header=2), prod, now=2_000)
    st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 0, st, st.due(clock["now"]))  # due at 1 s + 1 s; count 2 needs 1 s + 2 s
    assert rep.deferred == 1 and prod.sent == [] and st.in_flight == 1
    assert st.next_due_ms() == 3_000
    clock["now"] = 3_000
    rep = red.process(Q, 0, st, st.due(3_000))
    assert rep.redelivered == 1 and prod.sent[0][4]["kmq-delivery-count"] == b"3"


def test_failing_sends_stay_open_and_are_retried_with_growing_delay():
    prod = FakeProducer(fail_topics={"orders"})
    red, st, clock = setup(records(2), prod)
    st.apply(Start([(0, 2)], lease_ms=1000), 0, 0)
    delays = []
    for _ in range(3):
        rep = red.process(Q, 0, st, st.due(clock["now"]))
        assert rep.failed == 2 and st.in_flight == 2 and st.committable_offset() == 0
        delays.append(st.next_due_ms() - clock["now"])
        clock["now"] = st.next_due_ms()
    assert delays[0] < delays[1] < delays[2]
    assert red._metrics.redelivery_failures.labels("orders")._value.get() == 6
    prod.fail_topics.clear()
    assert red.process(Q, 0, st, st.due(clock["now"])).redelivered == 2 and st.in_flight == 0


def test_missing_offsets_are_closed_as_missing_and_never_replaced():
    prod = FakeProducer()
    red, st, clock = setup({0: records(1)[0]}, prod)
    st.apply(Start([(0, 3)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert (rep.redelivered, rep.missing) == (1, 2)
    closed = [decode(v) for t, _, _, v, _ in prod.sent if t == "orders__markers"]
    assert Closed([(1, 2)], Outcome.MISSING) in closed
    assert [s[4]["kmq-origin"] for s in prod.sent if s[0] == "orders"] == [b"orders/0/0"]
