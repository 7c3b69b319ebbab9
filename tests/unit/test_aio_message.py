"""AsyncKmqMessage: the awaitable settlements record exactly what KmqMessage's do (no I/O)."""

from __future__ import annotations

import asyncio

import pytest

from kmq.aio import AsyncKmqMessage
from kmq.core.errors import InvalidSettlement, MessageAlreadySettled
from tests.helpers.messages import Recorder, make


def test_attributes_are_the_messages():
    msg = make(headers=[("kmq-delivery-count", b"3"), ("kmq-origin", b"orders/2/1")])
    a = AsyncKmqMessage(msg)
    assert (a.topic, a.partition, a.offset, a.key, a.value, a.timestamp) == ("orders", 2, 5, b"k", b"v", 1000)
    assert a.delivery_count == 3 and a.origin == "orders/2/1" and a.headers is msg.headers
    assert a.outcome is None and not a.settled and a.message is msg


@pytest.mark.parametrize("call, args, recorded", [
    ("ack", (), ("ack", None)),
    ("nack", (2.5,), ("nack", 2.5)),
    ("reject", ("bad",), ("reject", "bad")),
    ("abandon", (), ("abandon", None)),
])
def test_each_settlement_reaches_the_settler_once(call, args, recorded):
    rec = Recorder()
    a = AsyncKmqMessage(make(settler=rec))

    async def settle():
        await getattr(a, call)(*args)
        with pytest.raises(MessageAlreadySettled):
            await a.ack()

    asyncio.run(settle())
    assert rec.calls == [(5, *recorded)] and a.outcome == recorded[0]


def test_renew_and_invalid_arguments_leave_the_message_settleable():
    rec = Recorder()
    a = AsyncKmqMessage(make(settler=rec))

    async def go():
        await a.renew(30.0)
        with pytest.raises(InvalidSettlement):
            await a.nack(float("nan"))
        with pytest.raises(InvalidSettlement):
            await a.renew(-1)
        await a.ack()

    asyncio.run(go())
    assert rec.calls == [(5, "renew", 30.0), (5, "ack", None)]
