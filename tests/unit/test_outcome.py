"""The handler-outcome rule (kmq.core.outcome) and the places that use it: the thread pool
behind KmqConsumer.run, the asyncio run() and @kmq.marked settle alike."""

from __future__ import annotations

import asyncio
import logging
import threading
from types import SimpleNamespace

import pytest

from kmq.config import BackoffConfig
from kmq.consumer.handler_pool import run_handlers
from kmq.consumer.take_ahead import TakeAhead
from kmq.consumer.writer import marked
from kmq.core.errors import MessageAlreadySettled
from kmq.core.message import ACK, HEADER_DELIVERY_COUNT, NACK, REJECT, KmqMessage
from kmq.core.outcome import ACKED, HandlerOutcome, OutcomeRule, settle

BACKOFF = BackoffConfig(initial=1.0, max=60.0, multiplier=2.0)


class Poison(ValueError):
    pass


class Recorder:
    def __init__(self):
        self.calls = []

    def settled(self, msg, outcome, arg):
        self.calls.append((msg.offset, outcome, arg))


def message(offset=7, delivery=1, settler=None):
    headers = [(HEADER_DELIVERY_COUNT, str(delivery).encode())]
    return KmqMessage("orders", 0, offset, b"k", b"v", headers, 1000, settler or Recorder(), threading.Lock())


# ------------------------------------------------------------------ the rule
def test_a_return_acks_unless_the_handler_settled_the_message():
    rule = OutcomeRule(BACKOFF.delay)
    assert rule.returned(settled=False) == ACKED == HandlerOutcome(ACK)
    assert rule.returned(settled=True) is None


@pytest.mark.parametrize("delivery", [1, 2, 5, 40])
def test_an_exception_nacks_with_the_backoff_of_the_delivery_count(delivery):
    out = OutcomeRule(BACKOFF.delay, reject_on=Poison).failed(RuntimeError("db down"), delivery)
    assert (out.action, out.delay, out.reason) == (NACK, BACKOFF.delay(delivery), "")


@pytest.mark.parametrize("reject_on", [Poison, ValueError, (KeyError, Poison)])
def test_an_exception_of_reject_on_rejects_with_its_type_and_text(reject_on):
    out = OutcomeRule(BACKOFF.delay, reject_on).failed(Poison("field x missing"), 3)
    assert (out.action, out.reason) == (REJECT, "Poison: field x missing")


def test_a_reject_reason_is_cut_to_fit_the_marker():
    out = OutcomeRule(BACKOFF.delay, Poison).failed(Poison("é" * 40_000), 1)
    assert out.action == REJECT and len(out.reason.encode()) <= 0xFFFF


@pytest.mark.parametrize("bad", [ValueError("x"), "ValueError", (ValueError, 3), int])
def test_reject_on_that_is_not_exception_classes_is_refused_at_once(bad):
    with pytest.raises(TypeError, match="reject_on must be an exception class"):
        OutcomeRule(BACKOFF.delay, bad)


# ------------------------------------------------------------------ settle
def test_settle_makes_the_settlement_and_logs_failures_with_their_consequence(caplog):
    rule = OutcomeRule(BACKOFF.delay, Poison)
    acked, nacked, rejected = Recorder(), Recorder(), Recorder()
    with caplog.at_level(logging.WARNING, logger="kmq.core.outcome"):
        settle(message(settler=acked), rule.returned(False))
        settle(message(delivery=2, settler=nacked), rule.failed(RuntimeError("db down"), 2))
        settle(message(settler=rejected), rule.failed(Poison("bad"), 1))
    assert acked.calls == [(7, ACK, None)]
    assert nacked.calls == [(7, NACK, BACKOFF.delay(2))]
    assert rejected.calls == [(7, REJECT, "Poison: bad")]
    assert [r.getMessage() for r in caplog.records] == [
        "handler failed on orders/0/7 (RuntimeError: db down); nacked, redelivery in 2s",
        "handler rejected orders/0/7 (Poison: bad); it goes to the DLQ",
    ]


def test_a_handler_that_settled_and_then_raised_keeps_its_own_settlement(caplog):
    rec = Recorder()
    msg = message(settler=rec)
    msg.ack()
    with caplog.at_level(logging.WARNING, logger="kmq.core.outcome"):
        settle(msg, OutcomeRule(BACKOFF.delay).failed(RuntimeError("late"), 1))
        settle(msg, ACKED)  # settled by another thread meanwhile: nothing to do, no noise
    assert rec.calls == [(7, ACK, None)]
    assert [r.getMessage() for r in caplog.records] == [
        "handler failed on orders/0/7 (RuntimeError: late) after the message was settled; that settlement stands"]


# ------------------------------------------------------------------ the callers
def handler(msg):
    """Settles by the payload: the same decisions for every caller."""
    if msg.value == b"raise":
        raise RuntimeError("failed")
    if msg.value == b"poison":
        raise Poison("poison")
    if msg.value == b"self-nack":
        msg.nack(9.0)
    if msg.value == b"exit":
        raise KeyboardInterrupt  # not a handler failure: left to the lease


EXPECTED = {b"ok": (ACK, None), b"raise": (NACK, BACKOFF.delay(3)), b"poison": (REJECT, "Poison: poison"),
            b"self-nack": (NACK, 9.0)}


class Source:
    """A MessageSource (what run_handlers needs of a KmqConsumer) handing out fixed messages."""

    def __init__(self, msgs):
        self.queue = SimpleNamespace(name="orders", backoff=BACKOFF)
        self.batch_size = 10
        self.msgs = list(msgs)
        self.ahead = TakeAhead(self.take_chunk)

    @property
    def stopping(self):
        return not self.msgs

    def raise_error(self):
        pass

    def poll(self, timeout=0.0, max_records=None):
        out, self.msgs = self.msgs[:max_records], self.msgs[max_records:]
        return out

    def take_chunk(self, timeout, max_records):  # what AsyncKmqConsumer takes with
        return self.poll(timeout, max_records), 0.0, 0


def settled_by(payloads, rec):
    return {payloads[off]: (outcome, arg) for off, outcome, arg in rec.calls}


def test_kmq_consumer_run_pool_settles_by_the_rule_with_reject_on():
    rec = Recorder()
    payloads = list(EXPECTED)
    msgs = [KmqMessage("orders", 0, i, b"k", v, [(HEADER_DELIVERY_COUNT, b"3")], 1000, rec, threading.Lock())
            for i, v in enumerate(payloads)]
    run_handlers(Source(msgs), handler, workers=2, poll_timeout=0.01, reject_on=Poison)
    assert settled_by(payloads, rec) == EXPECTED


def test_marked_settles_by_the_rule_through_the_writer():
    rec = Recorder()

    class Writer:
        queue = SimpleNamespace(name="orders", backoff=BACKOFF, group=None)
        cfg = SimpleNamespace(consumer=SimpleNamespace(group_id="workers"), workers_group=lambda queue: "workers")

        def __init__(self):
            self.open = set()

        def _take(self, record):
            if record.offset not in self.open:
                raise MessageAlreadySettled("settled")
            self.open.discard(record.offset)

        def ack(self, record):
            self._take(record)
            rec.calls.append((record.offset, ACK, None))

        def nack(self, record, delay=0.0):
            self._take(record)
            rec.calls.append((record.offset, NACK, delay))

        def reject(self, record, reason=""):
            self._take(record)
            rec.calls.append((record.offset, REJECT, reason))

    writer = Writer()
    payloads = list(EXPECTED)
    records = [SimpleNamespace(topic="orders", partition=0, offset=i, value=v, headers=[(HEADER_DELIVERY_COUNT, b"3")])
               for i, v in enumerate(payloads)]
    writer.open = set(range(len(records)))

    @marked(writer, reject_on=Poison)  # type: ignore[arg-type]
    def handle(record):
        handler(SimpleNamespace(value=record.value, nack=lambda delay: writer.nack(record, delay)))

    for r in records:
        handle(r)
    assert settled_by(payloads, rec) == EXPECTED
    with pytest.raises(KeyboardInterrupt):
        handle(SimpleNamespace(topic="orders", partition=0, offset=99, value=b"exit", headers=[]))


def test_async_run_settles_by_the_rule_with_reject_on(monkeypatch):
    from kmq.consumer.aio import AsyncKmqConsumer

    rec = Recorder()
    payloads = list(EXPECTED)
    msgs = [KmqMessage("orders", 0, i, b"k", v, [(HEADER_DELIVERY_COUNT, b"3")], 1000, rec, threading.Lock())
            for i, v in enumerate(payloads)]
    source = Source(msgs)
    source.queue.lease = 5.0

    async def main():
        c = AsyncKmqConsumer(SimpleNamespace(), "orders", consumer=source)  # run() drives it through poll()

        async def async_handler(amsg):
            handler(amsg.message)

        await c.run(async_handler, concurrency=2, reject_on=Poison)

    asyncio.run(main())
    assert settled_by(payloads, rec) == EXPECTED
