"""Redeliverer decisions and failure handling with a fake log and producer (no broker)."""

from __future__ import annotations

from collections import namedtuple

from kmq.client import ProducerFatal
from kmq.config import BackoffConfig, QueueConfig
from kmq.core.markers import Closed, Outcome, Reject, Start, decode
from kmq.telemetry.metrics import TrackerMetrics
from kmq.core.ranges import OffsetRange
from kmq.core.lease_state import PartitionState
from kmq.client.kafka_python.log_reader import ReadResult
from tracker.redeliver import Redeliverer

Rec = namedtuple("Rec", "offset key value headers")
Q = QueueConfig.named("orders", lease=1.0, max_deliveries=3, backoff=BackoffConfig(initial=1.0, max=4.0))


class FakeFuture:
    is_done = True

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

    def release(self):
        pass

    def partition_count(self, topic):
        return 2


def records(n, count_header=None):
    h = [("app", b"1")] + ([("kmq-delivery-count", str(count_header).encode())] if count_header else [])
    return {o: Rec(o, b"k%d" % o, b"v%d" % o, h) for o in range(n)}


def setup(recs, producer, now=10_000, smallest_limit=None):
    clock = {"now": now}
    red = Redeliverer(producer, FakeReader(recs), TrackerMetrics(), clock_ms=lambda: clock["now"],
                      smallest_limit=smallest_limit)
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


# ---------------------------------------------------------------- hostile records
class RefusingProducer(FakeProducer):
    """Refuses what kafka-python refuses, and records over ``limit`` bytes, like the real client."""

    def __init__(self, limit=1000, dlq_missing=False):
        super().__init__()
        self.limit = limit

    def send(self, topic, value=None, key=None, headers=None, partition=None):
        from kmq.client.errors import RecordTooLarge

        if key is None and value is None:
            raise ValueError("Need at least one: key or value")
        if not all(isinstance(v, bytes) for _, v in headers or []):
            raise TypeError("All headers items must be (str, bytes) tuples")
        if len(value or b"") + len(key or b"") > self.limit:
            raise RecordTooLarge("too large")
        return super().send(topic, value=value, key=key, headers=headers, partition=partition)


def test_null_header_value_is_copied_as_empty_bytes_named_by_a_kmq_header():
    prod = RefusingProducer()
    recs = {0: Rec(0, b"k", b"v", [("trace", None), ("app", b"1")])}
    red, st, clock = setup(recs, prod)
    st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
    assert red.process(Q, 0, st, st.due(clock["now"])).redelivered == 1
    (copy,) = [s for s in prod.sent if s[0] == "orders"]
    assert copy[4]["trace"] == b"" and copy[4]["kmq-null-header"] == b"trace" and copy[4]["app"] == b"1"


def test_tombstone_is_dead_lettered_as_undeliverable_with_the_reason():
    prod = RefusingProducer()
    red, st, clock = setup({0: Rec(0, None, None, [])}, prod)
    st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert rep.dead_lettered == 1 and st.in_flight == 0
    ((topic, _, key, value, h),) = [s for s in prod.sent if s[0] == "orders__dlq"]
    assert key is None and value == b"" and h["kmq-dlq-reason"] == b"undeliverable"
    assert b"tombstone" in h["kmq-dlq-error"]


def test_too_large_copy_goes_to_the_dlq_if_it_fits_else_closed_undeliverable():
    # Offset 0 fits the DLQ (limit differs per topic), offset 1 fits nowhere, offset 2 is ordinary.
    class PerTopic(RefusingProducer):
        def send(self, topic, value=None, key=None, headers=None, partition=None):
            self.limit = 150 if topic == "orders__dlq" else 100
            return super().send(topic, value=value, key=key, headers=headers, partition=partition)

    prod = PerTopic()
    recs = {0: Rec(0, b"k", b"x" * 120, []), 1: Rec(1, b"k", b"x" * 500, []), 2: Rec(2, b"k", b"ok", [])}
    red, st, clock = setup(recs, prod, smallest_limit=100)  # the topics' limits, as the tracker read them
    st.apply(Start([(0, 3)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert (rep.redelivered, rep.dead_lettered, rep.undeliverable, rep.failed) == (1, 1, 1, 0)
    assert st.in_flight == 0 and rep.causes["too_large"] == 3  # copy 0, copy 1, dead letter 1
    closed = {decode(v).outcome: decode(v).ranges for t, _, _, v, _ in prod.sent if t == "orders__markers"}
    assert closed == {Outcome.REDELIVERED: (OffsetRange(2, 1),), Outcome.DEAD_LETTERED: (OffsetRange(0, 1),),
                      Outcome.UNDELIVERABLE: (OffsetRange(1, 1),)}
    assert red._metrics.undeliverable.labels("orders", "too_large")._value.get() == 1
    # Offset 1 is named in the DLQ by a reference dead letter: where it is, its size, why; no payload.
    dead = [(k, v, h) for t, _, k, v, h in prod.sent if t == "orders__dlq"]
    assert [(k, v) for k, v, _ in dead] == [(b"k", b"x" * 120), (b"k", b"")]
    ref = dead[1][2]
    assert ref["kmq-dlq-reference"] == b"orders/0/1" and ref["kmq-dlq-size"] == b"501"
    assert ref["kmq-origin"] == b"orders/0/1" and ref["kmq-dlq-reason"] == b"undeliverable"
    assert ref["kmq-dlq-error"].startswith(b"dead letter (undeliverable) refused by the DLQ: RecordTooLarge")


def test_missing_dlq_keeps_dead_letters_open_without_repeating_the_copies_beside_them():
    class NoDlq(FakeReader):
        def partition_count(self, topic):
            return 0

    prod = FakeProducer()
    clock = {"now": 10_000}
    red = Redeliverer(prod, NoDlq(records(2)), TrackerMetrics(), clock_ms=lambda: clock["now"])
    st = PartitionState(Q.backoff.delay, Q.max_deliveries)
    st.apply(Start([(0, 2)], lease_ms=1000), 0, 0)
    st.apply(Reject([(1, 1)], reason="bad"), 1, 5)
    for _ in range(3):
        rep = red.process(Q, 0, st, st.due(clock["now"]))
        clock["now"] = st.next_due_ms()
    assert [s[0] for s in prod.sent].count("orders") == 1  # offset 0 copied once, never again
    assert st.open_ranges() == [OffsetRange(1, 1)] and rep.failed == 1 and rep.causes["dlq_missing"] == 1
    assert red._metrics.record_failures.labels("orders", "dlq_missing")._value.get() == 3


class EndsAt(FakeReader):
    """A read that runs into the log end at ``end``: what is not found is reported missing (as the
    readers did before they kept offsets past the end out of ``missing``) and the end is given."""

    def __init__(self, records, end):
        super().__init__(records)
        self.end = end

    def read(self, topic, partition, ranges):
        res = super().read(topic, partition, ranges)
        return ReadResult({o: r for o, r in res.records.items() if o < self.end}, res.missing, log_end=self.end)


def test_offsets_a_read_ended_below_are_held_not_closed_and_copied_once_the_log_reaches_them(caplog):
    """A worker fetched 0..3 (its START says so); the tracker's read ends at 2 (a reader stopped at an
    open transaction, a new leader's lagging high-water mark). 2..3 must be copied later, not lost."""
    prod = FakeProducer()
    clock = {"now": 10_000}
    reader = EndsAt(records(4), end=2)
    red = Redeliverer(prod, reader, TrackerMetrics(), clock_ms=lambda: clock["now"])
    st = PartitionState(Q.backoff.delay, Q.max_deliveries)
    st.apply(Start([(0, 4)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 5, st, st.due(clock["now"]))
    assert (rep.redelivered, rep.missing, rep.past_end) == (2, 0, 2) and st.open_ranges() == [OffsetRange(2, 2)]
    assert [decode(v) for t, _, _, v, _ in prod.sent if t == "orders__markers"] == [Closed([(0, 2)], Outcome.REDELIVERED)]
    assert red._metrics.past_log_end.labels("orders")._value.get() == 2
    assert red._metrics.missing_offsets.labels("orders")._value.get() == 0
    assert "orders[5]: the queue log read ended at offset 2, below 2 due offset(s)" in caplog.text
    assert st.next_due_ms() == clock["now"] + 500  # read again after a backoff
    reader.end = 4  # the log as read reaches them now
    clock["now"] = st.next_due_ms()
    rep = red.process(Q, 5, st, st.due(clock["now"]))
    assert rep.redelivered == 2 and st.in_flight == 0
    assert [s[4]["kmq-origin"] for s in prod.sent if s[0] == "orders"] == [b"orders/5/%d" % o for o in range(4)]


def test_a_start_far_beyond_the_log_end_is_held_at_once_and_never_closed():
    prod = FakeProducer()
    clock = {"now": 10_000}
    red = Redeliverer(prod, EndsAt(records(2), end=10), TrackerMetrics(), clock_ms=lambda: clock["now"])
    st = PartitionState(Q.backoff.delay, Q.max_deliveries)
    st.apply(Start([(0, 2), (1_000_000, 0xFFFFFFFF)], lease_ms=1000), 0, 0)
    items = st.due(clock["now"], limit=100)
    assert sum(i.offset_count for i in items) == 100  # the limit holds inside the huge segment
    rep = red.process(Q, 0, st, items)
    # All 4 billion held in one step (also those due() did not hand out), in a few segments, none closed.
    assert rep.redelivered == 2 and rep.missing == 0 and rep.past_end == 0xFFFFFFFF
    assert st.in_flight == 0xFFFFFFFF and st.segment_count <= 2 and st.next_due_ms() == clock["now"] + 500
    assert st.due(clock["now"] + 499) == []
    assert not [m for m in (decode(v) for t, _, _, v, _ in prod.sent if t == "orders__markers")
                if m.outcome is Outcome.MISSING]


def test_a_reference_the_dlq_refuses_too_is_closed_undeliverable_not_retried_forever(caplog):
    class NothingToDlq(FakeProducer):
        def send(self, topic, value=None, key=None, headers=None, partition=None):
            from kmq.client.errors import RecordRefused, RecordTooLarge

            if topic == "orders":
                raise RecordTooLarge("too large")
            if topic == "orders__dlq":
                raise RecordRefused("refused by a topic policy")
            return super().send(topic, value=value, key=key, headers=headers, partition=partition)

    prod = NothingToDlq()
    red, st, clock = setup(records(1), prod, smallest_limit=1)  # the record is over the queue's limit
    st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert rep.undeliverable == 1 and st.in_flight == 0 and rep.failed == 0
    (closed,) = [decode(v) for t, _, _, v, _ in prod.sent if t == "orders__markers"]
    assert closed == Closed([(0, 1)], Outcome.UNDELIVERABLE)
    assert "refused even a reference" in caplog.text


class Pending:
    """A send its producer has not decided (a broker that does not answer)."""

    is_done = False

    def get(self, timeout=None):
        raise AssertionError("an undecided send must not be read as a result")


def test_a_send_the_producer_left_undecided_is_retried_on_a_new_producer_never_on_the_old_one():
    class Stuck(FakeProducer):
        def send(self, topic, value=None, key=None, headers=None, partition=None):
            self.sent.append((topic, partition, key, value, dict(headers or [])))
            return Pending()

        def close(self, timeout=None):
            self.closed = True

    stuck, fresh = Stuck(), FakeProducer()
    clock = {"now": 10_000}
    red = Redeliverer(stuck, FakeReader(records(2)), TrackerMetrics(), clock_ms=lambda: clock["now"],
                      new_producer=lambda _compression: fresh)
    st = PartitionState(Q.backoff.delay, Q.max_deliveries)
    st.apply(Start([(0, 2)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    # Judged failed only after its producer was closed (what it held fails): it cannot land after the retry.
    assert rep.failed == 2 and st.in_flight == 2 and stuck.closed and rep.causes["send_failed"] == 2
    clock["now"] = st.next_due_ms()
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert rep.redelivered == 2 and st.in_flight == 0
    assert [s[0] for s in fresh.sent] == ["orders", "orders", "orders__markers"]


def test_a_closed_marker_that_cannot_be_written_for_missing_offsets_retries_the_whole_step():
    class NoMarkers(FakeProducer):
        def send(self, topic, value=None, key=None, headers=None, partition=None):
            from kmq.client.errors import ProduceFailed

            if topic == "orders__markers":
                return FakeFuture(ProduceFailed("markers topic unreachable"))
            return super().send(topic, value=value, key=key, headers=headers, partition=partition)

    red, st, clock = setup({}, NoMarkers())
    st.apply(Start([(0, 2)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert rep.failed == 2 and rep.missing == 0 and st.in_flight == 2 and st.next_due_ms() == clock["now"] + 500


def test_a_producer_whose_id_the_broker_refuses_is_replaced_and_the_sends_retried():
    from kmq.client.errors import ProducerFenced

    fenced = FakeProducer(fail_topics={"orders"})
    fenced.send = lambda topic, **kw: FakeFuture(ProducerFenced("newer epoch"))
    fenced.close = lambda timeout=None: setattr(fenced, "closed", True)
    fresh = FakeProducer()
    clock = {"now": 10_000}
    red = Redeliverer(fenced, FakeReader(records(1)), TrackerMetrics(), clock_ms=lambda: clock["now"],
                      new_producer=lambda _compression: fresh)
    st = PartitionState(Q.backoff.delay, Q.max_deliveries)
    st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
    assert red.process(Q, 0, st, st.due(clock["now"])).failed == 1 and fenced.closed
    clock["now"] = st.next_due_ms()
    assert red.process(Q, 0, st, st.due(clock["now"])).redelivered == 1 and st.in_flight == 0


def test_a_closed_marker_left_undecided_replaces_the_producer_and_retries_the_step():
    class MarkersStuck(FakeProducer):
        def send(self, topic, value=None, key=None, headers=None, partition=None):
            if topic == "orders__markers":
                return Pending()
            return super().send(topic, value=value, key=key, headers=headers, partition=partition)

    stuck, fresh = MarkersStuck(), FakeProducer()
    stuck.close = lambda timeout=None: setattr(stuck, "closed", True)
    clock = {"now": 10_000}
    red = Redeliverer(stuck, FakeReader({}), TrackerMetrics(), clock_ms=lambda: clock["now"],
                      new_producer=lambda _compression: fresh)
    st = PartitionState(Q.backoff.delay, Q.max_deliveries)
    st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
    assert red.process(Q, 0, st, st.due(clock["now"])).failed == 1 and stuck.closed and st.in_flight == 1
    clock["now"] = st.next_due_ms()
    assert red.process(Q, 0, st, st.due(clock["now"])).missing == 1 and st.in_flight == 0


class FatalProducer(FakeProducer):
    """A producer that turns fatal at its send number ``fatal_at`` (counted from 0), as
    confluent-kafka's does: :attr:`fatal` set, that send and every later one failing with it. What
    the adapter promises, not a client of its own: tests/integration/test_tracker_fatal_producer.py
    drives the real one."""

    def __init__(self, fatal_at):
        super().__init__()
        self.fatal, self.fatal_at, self.closed = None, fatal_at, False

    def send(self, topic, value=None, key=None, headers=None, partition=None):
        if len(self.sent) >= self.fatal_at and self.fatal is None:
            self.fatal = ProducerFatal("the producer is in a fatal state: gap-less guarantee (_GAPLESS_GUARANTEE)")
        super().send(topic, value=value, key=key, headers=headers, partition=partition)
        return FakeFuture(self.fatal)

    def close(self, timeout=None):
        self.closed = True


def replaced_by(first, fresh, n, metrics):
    """A redeliverer on ``first`` that makes ``fresh`` when it replaces it, and ``n`` messages due."""
    clock = {"now": 10_000}
    red = Redeliverer(first, FakeReader(records(n)), metrics, clock_ms=lambda: clock["now"],
                      new_producer=lambda _compression: fresh)
    st = PartitionState(Q.backoff.delay, Q.max_deliveries)
    st.apply(Start([(0, n)], lease_ms=1000), 0, 0)
    return red, st, clock


def test_a_producer_that_reports_a_fatal_error_is_replaced_and_only_acknowledged_copies_are_closed(caplog):
    fatal, fresh, metrics = FatalProducer(fatal_at=2), FakeProducer(), TrackerMetrics()
    red, st, clock = replaced_by(fatal, fresh, 4, metrics)
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    # Offsets 0 and 1 were acknowledged before the fatal error: closed. 2 and 3 were not: open.
    assert rep.redelivered == 2 and rep.failed == 2 and st.in_flight == 2 and fatal.closed
    assert metrics.registry.get_sample_value("kmq_tracker_producer_replacements_total", {"reason": "fatal"}) == 1
    assert "replacing the tracker's producer: it reported a fatal error" in caplog.text
    assert [t for t, *_ in fatal.sent] == ["orders"] * 4
    assert [decode(v) for _, _, _, v, _ in fresh.sent] == [Closed([(0, 2)], Outcome.REDELIVERED)]
    clock["now"] = st.next_due_ms()
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert rep.redelivered == 2 and st.in_flight == 0  # retried on the new producer
    assert [(t, k) for t, _, k, *_ in fresh.sent[1:]] == [("orders", b"k2"), ("orders", b"k3"),
                                                         ("orders__markers", b"\x00\x00\x00\x00")]
    assert metrics.registry.get_sample_value("kmq_tracker_producer_replacements_total", {"reason": "fatal"}) == 1


def test_a_closed_marker_a_fatal_producer_did_not_acknowledge_is_sent_again_on_a_new_producer(caplog):
    fatal, fresh = FatalProducer(fatal_at=1), FakeProducer()  # the copy is acknowledged, its CLOSED marker not
    red, st, clock = replaced_by(fatal, fresh, 1, TrackerMetrics())
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert rep.redelivered == 1 and st.in_flight == 0 and fatal.closed
    assert [t for t, *_ in fatal.sent] == ["orders", "orders__markers"]
    assert [decode(v) for _, _, _, v, _ in fresh.sent] == [Closed([(0, 1)], Outcome.REDELIVERED)]
    assert "not written" not in caplog.text


def test_each_queue_is_written_by_the_producer_of_its_compression_and_a_replacement_keeps_the_codec():
    """A client compresses everything it produces with one codec, so queues of different
    ``compression`` get a producer each (made on first use); their copies and CLOSED markers go
    through it, and a replaced producer is replaced by one of the same codec."""
    from dataclasses import replace

    from kmq.client.errors import ProducerFenced

    first = FakeProducer()
    made: dict[str, list] = {}

    def new_producer(codec):
        made.setdefault(codec, []).append(FakeProducer())
        return made[codec][-1]

    clock = {"now": 10_000}
    red = Redeliverer(first, FakeReader(records(1)), TrackerMetrics(), clock_ms=lambda: clock["now"],
                      new_producer=new_producer, compression="lz4")
    lz4, zstd = replace(Q, compression="lz4"), replace(Q, name="audit", markers_topic="audit__markers",
                                                         dlq_topic="audit__dlq", compression="zstd")
    for q in (zstd, lz4, zstd):
        st = PartitionState(q.backoff.delay, q.max_deliveries)
        st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
        assert red.process(q, 0, st, st.due(clock["now"])).redelivered == 1
    assert list(made) == ["zstd"] and len(made["zstd"]) == 1
    assert [t for t, *_ in first.sent] == ["orders", "orders__markers"]
    assert [t for t, *_ in made["zstd"][0].sent] == ["audit", "audit__markers"] * 2

    made["zstd"][0].send = lambda topic, **kw: FakeFuture(ProducerFenced("newer epoch"))
    made["zstd"][0].close = lambda timeout=None: None
    st = PartitionState(zstd.backoff.delay, zstd.max_deliveries)
    st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
    assert red.process(zstd, 0, st, st.due(clock["now"])).failed == 1
    assert list(made) == ["zstd"] and len(made["zstd"]) == 2  # the lz4 producer is kept
    clock["now"] = st.next_due_ms()
    assert red.process(zstd, 0, st, st.due(clock["now"])).redelivered == 1
    assert [t for t, *_ in made["zstd"][1].sent] == ["audit", "audit__markers"]


def test_a_crash_sized_step_runs_with_the_cyclic_collector_paused_and_restores_it():
    """A backlog's copies are freed by reference counting; collecting them as they go took a third
    of the tracker's time. The collector is paused for a large step only, and is on again after it,
    also when the step fails; a process that turned it off keeps it off."""
    import gc

    from tracker.redeliver import _GC_PAUSE_OFFSETS

    class Watching(FakeProducer):
        def __init__(self, fail=False):
            super().__init__()
            self.enabled_during, self.fail = set(), fail

        def send(self, topic, value=None, key=None, headers=None, partition=None):
            self.enabled_during.add(gc.isenabled())
            if self.fail:
                raise OSError("connection reset")
            return super().send(topic, value=value, key=key, headers=headers, partition=partition)

    def step(n, producer):
        red, st, clock = setup(records(n), producer)
        st.apply(Start([(0, n)], lease_ms=1000), 0, 0)
        return red.process(Q, 0, st, st.due(clock["now"]))

    assert gc.isenabled()
    small, large, failing = Watching(), Watching(), Watching(fail=True)
    assert step(_GC_PAUSE_OFFSETS - 1, small).redelivered == _GC_PAUSE_OFFSETS - 1
    assert step(_GC_PAUSE_OFFSETS, large).redelivered == _GC_PAUSE_OFFSETS
    assert small.enabled_during == {True} and large.enabled_during == {False} and gc.isenabled()
    assert step(_GC_PAUSE_OFFSETS, failing).failed == _GC_PAUSE_OFFSETS
    assert failing.enabled_during == {False} and gc.isenabled()
    gc.disable()
    try:
        step(_GC_PAUSE_OFFSETS, Watching())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_copy_under_every_topics_limit_refused_as_too_large_is_sent_again_not_dead_lettered():
    """A broker refuses a whole batch for one record over the limit, and a client may pass the answer
    on to the records beside it: one that fits every topic is retried, never dead-lettered for it."""
    from kmq.client.errors import RecordTooLarge

    class OnceTooLarge(FakeProducer):
        refusals = 0

        def send(self, topic, value=None, key=None, headers=None, partition=None):
            if topic == "orders" and self.refusals == 0:
                self.refusals += 1
                return FakeFuture(RecordTooLarge("too large"))  # the broker's answer, after it left
            return super().send(topic, value=value, key=key, headers=headers, partition=partition)

    prod = OnceTooLarge()
    red, st, clock = setup(records(1), prod, smallest_limit=16_384)
    st.apply(Start([(0, 1)], lease_ms=1000), 0, 0)
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert (rep.redelivered, rep.dead_lettered, rep.undeliverable, rep.failed) == (0, 0, 0, 1)
    assert st.in_flight == 1 and not [t for t, *_ in prod.sent if t == "orders__dlq"]
    clock["now"] += 60_000
    rep = red.process(Q, 0, st, st.due(clock["now"]))
    assert rep.redelivered == 1 and st.in_flight == 0
