"""The independent ledger: origins, acks, redeliveries, dead letters, loss."""

from __future__ import annotations

from kmq.core import markers as m
from kmq.core.ledger import Ledger


def _marker(mk, p=0):
    return m.encode_key(p), m.encode(mk), p


def test_ack_redelivery_and_dlq_accounting():
    led = Ledger("q")
    for off in range(5):
        led.add_queue_record(0, off, [("app", b"x")])
    led.add_marker_record(*_marker(m.Start([(0, 5)], 1000, "w")))
    led.add_marker_record(*_marker(m.End([(0, 2)])))  # 0, 1 acked
    # 2 timed out and was redelivered as offset 5; 3 was rejected to the DLQ; 4 still open
    led.add_marker_record(*_marker(m.Closed([(2, 1)], m.Outcome.REDELIVERED)))
    led.add_queue_record(0, 5, [("app", b"x"), ("kmq-origin", b"q/0/2"), ("kmq-delivery-count", b"2")])
    led.add_marker_record(*_marker(m.End([(5, 1)])))
    led.add_dlq_record(0, 0, [("kmq-origin", b"q/0/3"), ("kmq-dlq-reason", b"rejected")])
    led.add_marker_record(b"\x00", b"garbage", 0)
    snap = led.snapshot()
    assert (snap.produced, snap.deliveries, snap.acked, snap.redelivered, snap.dead_lettered) == (5, 6, 3, 1, 1)
    assert snap.dlq_reasons == {"rejected": 1} and snap.bad_markers == 1
    assert snap.open == 1 and led.unsettled() == ["q/0/4"]
    assert snap.duplicates == 0


def test_end_before_queue_record_resolves_later_and_duplicates_count():
    led = Ledger("q")
    led.add_marker_record(*_marker(m.End([(0, 1)])))
    assert led.snapshot().acked == 0
    led.add_queue_record(0, 0, None)
    assert led.snapshot().acked == 1
    # a redelivered copy acked too: one message, one duplicate
    led.add_queue_record(0, 1, [("kmq-origin", b"q/0/0")])
    led.add_marker_record(*_marker(m.End([(1, 1)])))
    led.add_marker_record(*_marker(m.End([(1, 1)])))  # the same delivery acked twice counts once
    snap = led.snapshot()
    assert (snap.acked, snap.duplicates, snap.open) == (1, 1, 0)


def test_poison_both_acked_and_dead_is_reported():
    led = Ledger("q")
    led.add_queue_record(1, 7, None)
    led.add_marker_record(*_marker(m.End([(7, 1)]), p=1))
    led.add_dlq_record(0, 0, [("kmq-origin", b"q/1/7"), ("kmq-dlq-reason", b"timeout")])
    led.add_dlq_record(0, 1, [("kmq-origin", b"q/1/7"), ("kmq-dlq-reason", b"timeout")])
    assert led.acked_and_dead() == {"q/1/7"}
    assert led.dlq_duplicates() == {"q/1/7": 2}
