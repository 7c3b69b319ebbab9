"""Settlement arguments, backoff and kmq headers bounded by the wire (pure, no I/O)."""

from __future__ import annotations

import math
import threading
from fractions import Fraction

import pytest

from kmq.consumer.ack_buffer import AckBuffer
from kmq.core.backoff import MAX_BACKOFF, backoff_delay
from kmq.config import BackoffConfig
from kmq.core.errors import InvalidSettlement
from kmq.core.markers import End, decode, encode
from kmq.core.message import MAX_DELIVERY_COUNT, KmqMessage, delivery_count_of, origin_of, parse_origin
from kmq.core.settlement import MAX_MS, MAX_REASON_BYTES, clip_reason, delay_ms, lease_ms, reject_reason


# ---------------------------------------------------------------- arguments
@pytest.mark.parametrize("delay, ms", [(0, 0), (0.0004, 0), (2.5, 2500), (Fraction(1, 4), 250), (MAX_MS / 1000, MAX_MS)])
def test_nack_delays_the_wire_carries(delay, ms):
    assert delay_ms(delay) == ms


@pytest.mark.parametrize(
    "delay, words",
    [
        (-1, ">= 0"), (-0.001, ">= 0"), (math.nan, "finite"), (math.inf, "finite"), (-math.inf, "finite"),
        (MAX_MS / 1000 + 0.001, "49.7 days"), (10**12, "49.7 days"), (10**400, "out of range"),
        ("5", "number of seconds"), (None, "number of seconds"), (True, "number of seconds"),
    ],
)
def test_nack_delays_the_wire_cannot_carry_are_refused_with_the_range(delay, words):
    with pytest.raises(InvalidSettlement, match=words) as err:
        delay_ms(delay)
    assert isinstance(err.value, ValueError)  # except ValueError keeps working
    assert len(str(err.value)) < 200  # one line, even for a 400-digit int


def test_a_huge_int_beyond_repr_limits_still_gives_a_short_message():
    with pytest.raises(InvalidSettlement, match="too large to show"):
        lease_ms(10**5000)


@pytest.mark.parametrize("lease", [0, -1, 0.0004, math.nan, math.inf, 5e6, 10**9])
def test_leases_the_wire_cannot_carry_are_refused(lease):
    with pytest.raises(InvalidSettlement):
        lease_ms(lease)


def test_leases_the_wire_carries():
    assert lease_ms(0.001) == 1
    assert lease_ms(60) == 60000
    assert lease_ms(MAX_MS / 1000) == MAX_MS


def test_reject_reasons():
    assert reject_reason("bad payload") == "bad payload"
    assert reject_reason(ValueError("x")) == "x"
    assert reject_reason("é" * (MAX_REASON_BYTES // 2)) == "é" * (MAX_REASON_BYTES // 2)
    with pytest.raises(InvalidSettlement, match="65536 utf-8 bytes"):
        reject_reason("x" * (MAX_REASON_BYTES + 1))
    with pytest.raises(InvalidSettlement, match="unicode"):
        reject_reason("lone \ud800 surrogate")


def test_clip_reason_always_fits_the_wire():
    assert clip_reason("short") == "short"
    clipped = clip_reason("é" * MAX_REASON_BYTES)
    assert len(clipped.encode("utf-8")) <= MAX_REASON_BYTES and set(clipped) == {"é"}
    assert clip_reason("a\ud800b") == "a?b"
    reject_reason(clip_reason("\ud800" * 70000))  # what clip returns is always accepted


# ---------------------------------------------------------------- on a message
class Recorder:
    def __init__(self):
        self.calls = []

    def settled(self, msg, outcome, arg):
        self.calls.append((outcome, arg))

    def renewed(self, msg, lease):
        self.calls.append(("renew", lease))


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.nack(math.nan), lambda m: m.nack(math.inf), lambda m: m.nack(-5), lambda m: m.nack(5e6),
        lambda m: m.renew(math.nan), lambda m: m.renew(-1), lambda m: m.renew(1e7),
        lambda m: m.reject("x" * 70000), lambda m: m.reject("\udcff"),
    ],
)
def test_a_bad_argument_records_nothing_and_the_message_still_settles(call):
    rec = Recorder()
    msg = KmqMessage("orders", 0, 7, None, b"v", None, 0, rec, threading.Lock())
    with pytest.raises(InvalidSettlement):
        call(msg)
    assert not msg.settled and rec.calls == []
    msg.nack(1.5)
    assert msg.outcome == "nack" and rec.calls == [("nack", 1.5)]


def test_the_ack_buffer_refuses_values_a_marker_cannot_carry_at_append_time():
    buf = AckBuffer()
    buf.ack(0, 1)
    for bad in (lambda: buf.nack(0, 2, MAX_MS + 1), lambda: buf.nack(0, 2, -1), lambda: buf.renew(0, 2, 2**40),
                lambda: buf.reject(0, 2, "\ud800")):
        with pytest.raises(ValueError):
            bad()
    buf.ack(0, 2)
    drained = buf.drain()  # the good acks still drain into one END
    assert [(p, encode(m)) for p, m in drained.markers] == [(0, encode(End(((1, 2),))))]
    assert decode(encode(drained.markers[0][1])) == End(((1, 2),))


# ---------------------------------------------------------------- backoff
@pytest.mark.parametrize("count", [5000, 10**6, 10**400, 2**63])
def test_backoff_of_huge_delivery_counts_is_the_cap_without_overflow(count):
    assert BackoffConfig().delay(count) == 60.0
    assert backoff_delay(count, 1.0, 60.0, 2.0) == 60.0
    assert backoff_delay(count, 0.25, 2.0, 1.001) == 2.0


@pytest.mark.parametrize(
    "count, expected", [(0, 0.0), (-3, 0.0), (1, 1.0), (2, 2.0), (6, 32.0), (7, 60.0), (8, 60.0)]
)
def test_backoff_grows_then_caps(count, expected):
    assert backoff_delay(count, 1.0, 60.0, 2.0) == expected


def test_backoff_edges():
    assert backoff_delay(3, 1.0, 60.0, 1.0) == 1.0  # no growth
    assert backoff_delay(3, 5.0, 2.0, 2.0) == 2.0  # initial above the cap
    assert backoff_delay(3, 0.0, 60.0, 2.0) == 0.0
    assert backoff_delay(2, 1.0, 60.0, math.inf) == 60.0
    assert backoff_delay(1, 1.0, 60.0, math.inf) == 1.0
    assert backoff_delay(40, 1.0, 1e12, 2.0) == MAX_BACKOFF  # never more than a NACK can carry
    assert delay_ms(backoff_delay(10**6, 1.0, 1e12, 3.0)) == MAX_MS


# ---------------------------------------------------------------- headers
@pytest.mark.parametrize(
    "raw, count",
    [
        (None, 1), (b"3", 3), (b" 7 ", 7), (b"0", 1), (b"-5", 1), (b"+5", 1), (b"1e9", 1), (b"5_000", 1),
        (b"", 1), (b"\xff\xfe", 1), ("٣".encode(), 1), (b"5000", 5000), (b"1000000", 10**6),
        (str(MAX_DELIVERY_COUNT).encode(), MAX_DELIVERY_COUNT), (b"2147483648", MAX_DELIVERY_COUNT),
        (b"9" * 100_000, MAX_DELIVERY_COUNT), (b"0000000000000000000012", 12),
    ],
)
def test_delivery_counts_from_headers_are_clamped(raw, count):
    headers = None if raw is None else [("kmq-delivery-count", raw)]
    assert delivery_count_of(headers) == count


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("orders/0/17", ("orders", 0, 17)), ("a.b-c_d/12/0", ("a.b-c_d", 12, 0)),
        ("orders/0", None), ("orders/0/17/3", None), ("/0/1", None), ("orders/-1/5", None), ("orders/x/5", None),
        ("orders/1/5.0", None), ("orders/2147483648/1", None), ("orders/1/9223372036854775808", None),
        ("orders/1/" + "9" * 50, None), ("", None),
    ],
)
def test_parse_origin(text, parsed):
    assert parse_origin(text) == parsed


@pytest.mark.parametrize(
    "raw, origin",
    [
        (b"orders/0/17", "orders/0/17"),  # this queue's copy: trusted
        (b"payments/0/17", "orders/2/5"),  # another topic's origin (copied headers): own coordinates
        (b"orders__dlq/0/3", "orders/2/5"),
        (b"orders/zero/17", "orders/2/5"),
        (b"\xff\xfe", "orders/2/5"),
        (b"orders/0/17/extra", "orders/2/5"),
    ],
)
def test_origin_is_trusted_only_for_this_queue(raw, origin):
    assert origin_of([("kmq-origin", raw)], "orders", 2, 5) == origin


def test_the_guard_keys_raw_records_by_their_trusted_origin():
    from kafka.consumer.fetcher import ConsumerRecord

    from kmq.consumer.guard import _origin

    def record(offset, headers):
        return ConsumerRecord("orders", 2, 0, offset, 0, 0, None, b"v", headers, None, 0, 1, -1)

    assert _origin(record(5, [])) == "orders/2/5"
    assert _origin(record(6, [("kmq-origin", b"payments/0/1")])) == "orders/2/6"  # another topic's: not trusted
    assert _origin(record(7, [("kmq-origin", b"orders/0/1")])) == "orders/0/1"  # this queue's copy
    assert _origin("orders/1/1") == "orders/1/1"
