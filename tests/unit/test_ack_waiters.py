"""Acks with a response: the future is resolved when the END covering the ack is acknowledged,
fails when that marker is given up; resolved per marker, not per message."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from kmq.config import Config
from kmq.consumer import marker_sender
from kmq.consumer.ack_buffer import AckBuffer
from kmq.consumer.ack_waiters import AckWaiters
from kmq.core.errors import MarkerWriteError, MessageAlreadySettled
from kmq.core.markers import End, Nack
from kmq.core.message import KmqMessage
from kmq.core.ranges import OffsetRange
from tests.helpers.kafka import wait_until


def test_drain_hands_out_the_futures_of_acks_with_a_response_with_their_end():
    buf = AckBuffer()
    fut: Future = Future()
    buf.settle(0, 5, "ack", fut)
    buf.settle(0, 6, "ack", None)
    drained = buf.drain()
    assert drained.markers == [(0, End((OffsetRange(5, 2),)))]
    assert drained.waiting == [(0, 5, fut)]
    assert buf.drain().waiting == []


def test_a_future_resolves_when_an_end_covering_its_offset_is_written_and_not_before():
    w = AckWaiters()
    a, b, c = Future(), Future(), Future()
    w.add([(0, 5, a), (0, 9, b), (1, 5, c)])
    w.written(0, Nack((OffsetRange(5, 1),), 0))  # not an END
    w.written(1, End((OffsetRange(0, 3),)))  # another partition's offsets
    assert not (a.done() or b.done() or c.done())
    w.written(0, End((OffsetRange(3, 4), OffsetRange(20, 1))))  # 3..6: covers 5, not 9
    assert a.result(0) is None and not b.done()
    assert len(w) == 2


def test_a_given_up_end_fails_its_futures_with_a_marker_write_error():
    w = AckWaiters()
    a, b = Future(), Future()
    w.add([(2, 1, a), (2, 2, b)])
    w.failed([(2, End((OffsetRange(1, 1),)), 0.0)], "not acknowledged within the retry budget")
    with pytest.raises(MarkerWriteError, match="retry budget"):
        a.result(0)
    w.fail_all("closed")
    with pytest.raises(MarkerWriteError, match="closed"):
        b.result(0)
    assert len(w) == 0


class _Settler:
    def __init__(self) -> None:
        self.calls: list = []

    def settled(self, msg, outcome, arg) -> None:
        self.calls.append((outcome, arg))

    def renewed(self, msg, lease) -> None: ...


def test_ack_with_response_settles_once_and_hands_its_future_to_the_settler():
    settler = _Settler()
    msg = KmqMessage("orders", 0, 3, None, b"v", None, 0, settler, threading.Lock())
    fut = msg.ack_with_response()
    assert msg.outcome == "ack" and settler.calls == [("ack", fut)] and not fut.done()
    with pytest.raises(MessageAlreadySettled):
        msg.ack_with_response()


class _Future:
    """kafka-python's send future, answered by the test."""

    def __init__(self) -> None:
        self.callbacks: list = []
        self.errbacks: list = []

    def add_both(self, fn, *args) -> None:
        self.callbacks.append((fn, args))
        self.errbacks.append((fn, args))

    def add_callback(self, fn, *args) -> None:
        self.callbacks.append((fn, args))

    def add_errback(self, fn, *args) -> None:
        self.errbacks.append((fn, args))

    def succeed(self) -> None:
        for fn, args in self.callbacks:
            fn(*args, None)

    def fail(self, exc: BaseException) -> None:
        for fn, args in self.errbacks:
            fn(*args, exc)


class _Producer:
    is_confluent = False

    def __init__(self) -> None:
        self.sent: list[_Future] = []

    def send(self, topic, value=None, key=None, partition=None):
        self.sent.append(_Future())
        return self.sent[-1]

    def flush(self, timeout=None) -> None: ...

    def close(self, timeout=None) -> None: ...


@pytest.fixture
def sender(monkeypatch):
    producer = _Producer()
    monkeypatch.setattr(marker_sender.client_api, "producer", lambda *a, **k: producer)
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "queues": [{"name": "orders"}]})
    waiters = AckWaiters()
    s = marker_sender.MarkerSender(cfg, cfg.queues[0], waiters=waiters)
    return s, producer, waiters


def test_the_sender_resolves_the_futures_when_its_end_is_acknowledged(sender):
    s, producer, waiters = sender
    fut: Future = Future()
    waiters.add([(0, 4, fut)])
    s.send(0, End((OffsetRange(0, 10),)))
    assert not fut.done()
    producer.sent[0].succeed()
    assert fut.result(0) is None


def test_an_end_not_acknowledged_by_close_fails_its_futures(sender):
    s, producer, waiters = sender
    fut: Future = Future()
    waiters.add([(0, 4, fut)])
    s.send(0, End((OffsetRange(4, 1),)))
    s.close(timeout=0)  # the producer never answered: reported lost
    with pytest.raises(MarkerWriteError):
        fut.result(0)


def test_an_end_given_up_after_the_retry_budget_fails_its_futures(monkeypatch):
    producer = _Producer()
    monkeypatch.setattr(marker_sender.client_api, "producer", lambda *a, **k: producer)
    cfg = Config.from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "queues": [{"name": "orders"}],
                            "consumer": {"marker_retry_budget": "1ms"}})
    waiters = AckWaiters()
    s = marker_sender.MarkerSender(cfg, cfg.queues[0], retry_interval=0.0, waiters=waiters)
    fut: Future = Future()
    waiters.add([(0, 4, fut)])
    s.send(0, End((OffsetRange(4, 1),)))
    failed = 0

    def round_() -> bool:  # every send fails (the broker is away); each round resends what is within budget
        nonlocal failed
        while failed < len(producer.sent):
            producer.sent[failed].fail(TimeoutError("no broker"))
            failed += 1
        s.resend_due(force=True)
        return fut.done()

    wait_until(round_, 5, what="the END given up")
    with pytest.raises(MarkerWriteError, match="retry_budget"):
        fut.result(0)
