"""The pure trace reconstruction: one message's timeline from queue, marker and DLQ records."""

from __future__ import annotations

import pytest

from kmq.core import markers as m
from kmq.core.errors import TraceError
from kmq.core.trace import TraceBuilder, parse_origin

Q = "q"


class Feed:
    """Feeds a builder the way the reader does: marker offsets count up in log order."""

    def __init__(self, origin: str = "q/0/0") -> None:
        self.b = TraceBuilder(Q, origin)
        self.moff = 0

    def queue(self, off, ts, headers=None, key=b"k", p=0):
        return self.b.add_queue_record(p, off, ts, key, headers)

    def marker(self, mk, ts, p=0):
        self.b.add_marker_record(self.moff, ts, m.encode_key(p), m.encode(mk))
        self.moff += 1


def copy_headers(count=None, origin="q/0/0"):
    h = [("app", b"x"), ("kmq-origin", origin.encode())]
    if count is not None:
        h.append(("kmq-delivery-count", str(count).encode()))
    return h


def test_acked_first_time_ignores_other_messages():
    f = Feed()
    assert f.queue(0, 1000)
    assert not f.queue(1, 1001, key=b"other")  # another message in the same batch
    f.marker(m.Start([(0, 2)], 30_000, "w1"), 1010)
    f.marker(m.End([(1, 1)]), 1015)
    f.marker(m.End([(0, 1)]), 1020)
    t = f.b.result(now_ms=99_000)
    assert t.kinds() == ["delivered", "start", "ack"]
    assert t.state == "acked" and t.deliveries == 1 and t.key == "k"
    assert t.events[1].detail["owner"] == "w1" and t.events[1].detail["deadline_ms"] == 31_010
    assert t.events[0].detail == {"delivery_count": 1, "via": "first delivery"}


def test_nacked_twice_then_acked():
    f = Feed()
    f.queue(0, 1000)
    f.marker(m.Start([(0, 1)], 30_000, "w1"), 1001)
    f.marker(m.Nack([(0, 1)], 0), 1002)
    f.marker(m.Closed([(0, 1)], m.Outcome.REDELIVERED), 1004)
    f.queue(5, 1003, copy_headers(2))
    f.marker(m.Start([(5, 1)], 30_000, "w1"), 1005)
    f.marker(m.Nack([(5, 1)], 500), 1006)
    f.marker(m.Closed([(5, 1)], m.Outcome.REDELIVERED), 1600)
    f.queue(9, 1599, copy_headers(3))
    f.marker(m.Start([(9, 1)], 30_000, "w2"), 1601)
    f.marker(m.End([(9, 1)]), 1602)
    t = f.b.result(now_ms=99_000)
    assert t.kinds() == ["delivered", "start", "nack", "delivered", "closed", "start", "nack", "delivered",
                         "closed", "start", "ack"]
    assert [e.detail["delivery_count"] for e in t.events if e.kind == "delivered"] == [1, 2, 3]
    assert t.events[6].detail["due_ms"] == 1506
    assert t.state == "acked" and t.deliveries == 3  # no lease-expired: the NACKs closed the leases


def test_timed_out_redelivered_and_a_late_ack():
    f = Feed()
    f.queue(0, 1000)
    f.marker(m.Start([(0, 1)], 1000, "w1"), 1000)
    f.queue(3, 2300, copy_headers(2))
    f.marker(m.Closed([(0, 1)], m.Outcome.REDELIVERED), 2301)
    f.marker(m.End([(0, 1)]), 2400)  # the slow first consumer finishes after all
    f.marker(m.Start([(3, 1)], 1000, "w2"), 2350)
    f.marker(m.End([(3, 1)]), 2500)
    t = f.b.result(now_ms=99_000)
    assert t.kinds() == ["delivered", "start", "lease-expired", "delivered", "closed", "start", "late-ack", "ack"]
    assert t.events[2].ts_ms == 2000 and t.events[6].detail["closed_as"] == "redelivered"
    assert t.state == "acked"


def test_end_written_before_the_trackers_closed_is_late():
    f = Feed()
    f.queue(0, 1000)
    f.marker(m.Start([(0, 1)], 1000, "w1"), 1000)
    f.marker(m.End([(0, 1)]), 2100)  # in the log before CLOSED, but the tracker had already redelivered
    f.queue(1, 2050, copy_headers(2))
    f.marker(m.Closed([(0, 1)], m.Outcome.REDELIVERED), 2120)
    t = f.b.result(now_ms=2200)
    assert t.kinds() == ["delivered", "start", "lease-expired", "delivered", "late-ack", "closed"]
    assert t.state == "queued"


def test_rejected_to_the_dlq_then_redriven_and_acked():
    f = Feed()
    f.queue(0, 1000)
    f.queue(4, 5000, copy_headers(None))  # the DLQ replay: origin kept, count dropped
    f.marker(m.Start([(0, 1)], 30_000, "w1"), 1001)
    f.marker(m.Reject([(0, 1)], "bad payload"), 1002)
    f.marker(m.Closed([(0, 1)], m.Outcome.DEAD_LETTERED), 1010)
    f.marker(m.Start([(4, 1)], 30_000, "w1"), 5001)
    f.marker(m.End([(4, 1)]), 5002)
    assert f.b.add_dlq_record(0, 7, 1005, copy_headers(1) + [("kmq-dlq-reason", b"rejected"),
                                                             ("kmq-dlq-error", b"bad payload")])
    assert not f.b.add_dlq_record(0, 8, 1005, copy_headers(1, origin="q/0/1"))
    t = f.b.result(now_ms=9_000)
    assert t.kinds() == ["delivered", "start", "reject", "dead-lettered", "closed", "delivered", "start", "ack"]
    dl = t.events[3]
    assert (dl.offset, dl.detail["reason"], dl.detail["error"]) == (7, "rejected", "bad payload")
    assert t.events[5].detail["via"] == "redriven from the DLQ" and t.state == "acked"
    # Before the redrive the same history ends dead-lettered.
    g = Feed()
    g.queue(0, 1000)
    g.marker(m.Start([(0, 1)], 30_000, "w1"), 1001)
    g.marker(m.Reject([(0, 1)], "bad payload"), 1002)
    g.b.add_dlq_record(0, 7, 1005, copy_headers(1) + [("kmq-dlq-reason", b"rejected")])
    assert g.b.result(now_ms=2000).state == "dead-lettered"


@pytest.mark.parametrize("now, state, kinds", [
    (1500, "in-flight", ["delivered", "start", "renew"]),
    (9000, "awaiting-redelivery", ["delivered", "start", "renew", "lease-expired"]),
])
def test_open_copy_in_flight_or_overdue(now, state, kinds):
    f = Feed()
    f.queue(0, 1000)
    f.marker(m.Start([(0, 1)], 1000, "w1"), 1000)
    f.marker(m.Renew([(0, 1)], 5000), 1400)
    t = f.b.result(now_ms=now)
    assert (t.state, t.kinds()) == (state, kinds)
    if state != "in-flight":
        assert t.events[-1].ts_ms == 6400 and t.events[-1].detail["pending"] is True


def test_queued_unknown_missing_and_not_found():
    f = Feed("q/0/3")
    assert not f.queue(2, 1000)  # before the origin
    f.queue(3, 1000)
    assert f.b.result(now_ms=2000, workers_committed=3).state == "queued"
    assert f.b.result(now_ms=2000, workers_committed=4).state == "unknown"
    f.marker(m.Start([(0, 10)], 1000, "w"), 1001)
    f.marker(m.Closed([(3, 1)], m.Outcome.MISSING), 3000)
    t = f.b.result(now_ms=4000)
    assert t.state == "missing" and t.kinds() == ["delivered", "start", "closed"]  # no lease expiry for missing
    assert TraceBuilder(Q, "q/0/0").result(now_ms=1).state == "not-found"


def test_a_message_whose_record_was_deleted_before_the_trace_shows_as_missing_by_the_trackers_closed():
    """Retention or DeleteRecords took the record: no queue record names the message any more, but
    the tracker's CLOSED (outcome 3) does; before, such a message was 'not-found'."""
    f = Feed("q/0/3")
    f.marker(m.Start([(0, 10)], 1000, "w"), 1001)  # read before its record is known: not attached
    f.marker(m.Closed([(4, 1)], m.Outcome.MISSING), 2999)  # another offset
    assert f.b.result(now_ms=3000).state == "not-found"
    f.marker(m.Closed([(2, 3)], m.Outcome.MISSING), 3000)
    t = f.b.result(now_ms=4000)
    assert t.state == "missing" and t.kinds() == ["closed"] and t.events[0].detail["outcome"] == "missing"
    assert TraceBuilder(Q, "q/0/3").result(now_ms=1).state == "not-found"


def test_bad_markers_and_markers_keyed_for_another_partition_are_counted_and_skipped():
    f = Feed()
    f.queue(0, 1000)
    f.b.add_marker_record(0, 1001, m.encode_key(0), b"\x01\x63")
    f.marker(m.Start([(0, 1)], 1000, "w"), 1001, p=1)  # in markers partition 0, keyed for queue partition 1
    # Both are bad records of markers partition 0, as the tracker counts them.
    assert f.b.bad_markers == 2 and f.b.result(now_ms=1).kinds() == ["delivered"]


# Kafka topic names hold no "/": a/b/2/7 is malformed, as the consumer reads kmq-origin too.
@pytest.mark.parametrize("text", ["q/0", "q/x/1", "/0/1", "q/0/-1", "nonsense", "a/b/2/7", "q/2147483648/1"])
def test_malformed_origin(text):
    with pytest.raises(TraceError, match="topic/partition/offset"):
        parse_origin(text)


def test_origin_parts_and_json_shape():
    assert parse_origin("a.b_c-d/2/7") == ("a.b_c-d", 2, 7)
    f = Feed()
    f.queue(0, 0)
    d = f.b.result(now_ms=1).to_dict()
    assert d["state"] == "queued" and d["events"][0]["time"] == "1970-01-01T00:00:00.000+00:00"


def test_a_scheduled_message_shows_as_scheduled_until_its_time_and_its_copy_keeps_the_count():
    from kmq.core.trace import describe_event

    f = Feed()
    f.queue(0, 1000, [("kmq-not-before", b"61000")])
    f.marker(m.Start([(0, 1)], 30_000, "w1"), 1001)
    f.marker(m.Nack([(0, 1)], 59_999, counted=False), 1001)
    t = f.b.result(now_ms=30_000)
    assert t.state == "scheduled" and t.kinds() == ["delivered", "start", "nack"]
    assert "scheduled: held back until" in describe_event(t.events[2])
    assert f.b.result(now_ms=61_001).state == "awaiting-redelivery"  # its time came: the copy is due
    f.marker(m.Closed([(0, 1)], m.Outcome.REDELIVERED), 61_000)
    f.queue(7, 61_000, copy_headers(1) + [("kmq-not-before", b"61000")])
    f.marker(m.Start([(7, 1)], 30_000, "w1"), 61_010)
    f.marker(m.End([(7, 1)]), 61_020)
    t = f.b.result(now_ms=62_000)
    assert t.state == "acked" and [e.detail["delivery_count"] for e in t.events if e.kind == "delivered"] == [1, 1]
