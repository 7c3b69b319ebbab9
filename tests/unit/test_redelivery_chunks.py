"""A large backlog is read and sent in chunks, judged once, closed in ranges, with bounded memory."""

from __future__ import annotations

from collections import namedtuple

import pytest

import tracker.redeliver as redeliver
from kmq.client.kafka_python.log_reader import ReadResult
from kmq.config import BackoffConfig, QueueConfig
from kmq.core.errors import LogReadError
from kmq.core.lease_state import DueItem, PartitionState, Reason
from kmq.core.markers import Closed, Outcome, Start, decode
from kmq.core.ranges import OffsetRange
from kmq.core.redelivery_plan import chunk_offsets, take_chunk
from kmq.telemetry.metrics import TrackerMetrics
from tracker.redeliver import Redeliverer

Rec = namedtuple("Rec", "offset key value headers")
Q = QueueConfig.named("orders", lease=1.0, max_deliveries=3, backoff=BackoffConfig(initial=1.0, max=4.0))


def item(*ranges, failures=0) -> DueItem:
    return DueItem(tuple(OffsetRange(a, n) for a, n in ranges), Reason.TIMEOUT, "", 0, 1000, 2000, 7, failures)


# ---------------------------------------------------------------- the pure chunking


def test_a_chunk_takes_whole_items_while_they_fit():
    a, b, c = item((0, 3)), item((3, 2)), item((5, 4))
    assert take_chunk([a, b, c], 5) == ([a, b], [c])
    assert take_chunk([a, b, c], 100) == ([a, b, c], [])


def test_an_item_is_cut_where_the_chunk_ends_and_both_parts_keep_its_lease():
    big = item((0, 4), (10, 6), failures=2)
    head, rest = take_chunk([big, item((20, 1))], 7)
    assert head == [item((0, 4), (10, 3), failures=2)]
    assert rest == [item((13, 3), failures=2), item((20, 1))]


def test_a_chunk_holds_at_least_one_offset():
    assert take_chunk([item((0, 3))], 0) == ([item((0, 1))], [item((1, 2))])


@pytest.mark.parametrize("record_bytes, expected", [(100, 1000), (1_000_000, 1), (0, 1000), (30_000, 3)])
def test_chunk_offsets_aim_at_a_byte_size_within_bounds(record_bytes, expected):
    assert chunk_offsets(record_bytes, 100_000, 1000) == expected


# ---------------------------------------------------------------- the shell


class Future:
    is_done = True

    def get(self, timeout=None):
        return None


class Producer:
    def __init__(self):
        self.sent: list[tuple] = []
        self.flushes: list[int] = []  # records sent before each flush

    def send(self, topic, value=None, key=None, headers=None, partition=None):
        self.sent.append((topic, partition, key, value, dict(headers or [])))
        return Future()

    def flush(self, timeout=None):
        self.flushes.append(len(self.sent))

    def closed(self):
        return [decode(v) for t, _, _, v, _ in self.sent if t == "orders__markers"]

    def copies(self):
        return [h["kmq-origin"] for t, _, _, _, h in self.sent if t == "orders"]


class Reader:
    def __init__(self, n, fail_at_read=None):
        self.records = {o: Rec(o, b"k", b"v" * 10, []) for o in range(n)}
        self.reads: list[list] = []
        self.fail_at_read = fail_at_read
        self.releases = 0

    def read(self, topic, partition, ranges):
        ranges = [tuple(r) for r in ranges]
        self.reads.append(ranges)
        if len(self.reads) == self.fail_at_read:
            raise LogReadError("the leader went away")
        found = {o: self.records[o] for a, n in ranges for o in range(a, a + n)}
        return ReadResult(found, [])

    def partition_count(self, topic):
        return 1

    def release(self):
        self.releases += 1


def run(reader, n, monkeypatch, chunk=4, limit=None, **consts):
    monkeypatch.setattr(redeliver, "_READ_CHUNK", chunk)
    for name, value in consts.items():
        monkeypatch.setattr(redeliver, name, value)
    prod = Producer()
    red = Redeliverer(prod, reader, TrackerMetrics(), clock_ms=lambda: 10_000, max_request_size=10)
    st = PartitionState(Q.backoff.delay, Q.max_deliveries)
    for first in range(0, n, 5):  # STARTs of 5
        st.apply(Start([(first, min(5, n - first))], lease_ms=1000), first // 5, 0)
    return red.process(Q, 0, st, st.due(10_000, limit=limit)), st, prod


def test_a_backlog_is_read_in_chunks_sent_without_waiting_judged_once_and_closed_as_one_range(monkeypatch):
    reader = Reader(10)
    report, st, prod = run(reader, 10, monkeypatch)
    assert reader.reads == [[(0, 4)], [(4, 4)], [(8, 2)]]
    assert report.redelivered == 10 and st.in_flight == 0
    assert prod.flushes == [10, 11]  # once after every copy was started; once for the CLOSED marker
    assert prod.closed() == [Closed([(0, 10)], Outcome.REDELIVERED)]


def test_a_read_failing_after_earlier_chunks_were_sent_closes_those_and_retries_only_the_rest(monkeypatch):
    reader = Reader(10, fail_at_read=2)
    report, st, prod = run(reader, 10, monkeypatch)
    assert prod.copies() == [b"orders/0/%d" % o for o in range(4)]
    assert prod.closed() == [Closed([(0, 4)], Outcome.REDELIVERED)]  # only after their copies were acknowledged
    assert (report.redelivered, report.failed) == (4, 6)
    assert st.open_ranges() == [OffsetRange(4, 6)] and st.failing == 6 and st.next_due_ms() > 10_000


def test_originals_held_for_unjudged_sends_are_bounded_by_judging_early(monkeypatch):
    reader = Reader(10)
    # Records of 11 bytes: a round is judged (flush, CLOSED) as soon as it holds 40 bytes or more.
    report, st, prod = run(reader, 10, monkeypatch, chunk=2, _ROUND_BYTES=40)
    assert report.redelivered == 10 and st.in_flight == 0
    assert prod.closed() == [Closed([(0, 4)], Outcome.REDELIVERED), Closed([(4, 4)], Outcome.REDELIVERED),
                             Closed([(8, 2)], Outcome.REDELIVERED)]


def test_chunks_start_small_until_the_size_of_the_queues_records_is_known(monkeypatch):
    reader = Reader(30)
    run(reader, 30, monkeypatch, chunk=1000, _CHUNK_BYTES=100)
    # Before any read: records may be as large as the producer takes (10 bytes) -> 10 offsets;
    # then 11-byte records -> 9 offsets a read.
    assert [sum(n for _, n in r) for r in reader.reads] == [10, 9, 9, 2]


def test_the_read_assignment_is_kept_for_the_next_step_only_while_more_of_the_partition_is_due_now(monkeypatch):
    reader = Reader(10)
    report, st, prod = run(reader, 10, monkeypatch, limit=5)  # a step takes 5 of the 10 due offsets
    assert report.redelivered == 5 and reader.releases == 0  # the next step reads on from where this stopped
    red = Redeliverer(prod, reader, TrackerMetrics(), clock_ms=lambda: 10_000, max_request_size=10)
    assert red.process(Q, 0, st, st.due(10_000)).redelivered == 5
    assert st.in_flight == 0 and reader.releases == 1  # nothing more due: librdkafka stops fetching ahead


def test_a_step_whose_rest_waits_for_a_retry_lets_go_of_the_read_assignment(monkeypatch):
    reader = Reader(10, fail_at_read=2)
    report, st, _ = run(reader, 10, monkeypatch)
    assert report.failed == 6 and st.next_due_ms() > 10_000 and reader.releases == 1
