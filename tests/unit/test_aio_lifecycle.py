"""AsyncKmqConsumer's start and close racing each other leave no consumer running.

The threaded consumer is built on a thread (it checks topics and joins the group, seconds
on a slow cluster), so close(), a second start() or a cancellation can come while it is
being built. A fake consumer stands in for KmqConsumer: its construction waits for the
test, which then says when it finishes."""

from __future__ import annotations

import asyncio
import threading

import pytest

import kmq.consumer.aio as aio_module
from kmq.consumer.aio import AsyncKmqConsumer
from kmq.core.errors import KmqError


class SlowConsumer:
    """Stands in for KmqConsumer: its construction blocks until ``release`` is set."""

    built: list["SlowConsumer"] = []
    entered = threading.Event()
    release = threading.Event()

    def __init__(self, cfg, queue, **kwargs) -> None:
        SlowConsumer.entered.set()
        assert SlowConsumer.release.wait(10), "the test never released the construction"
        self.closed = 0
        self.stopped = False
        SlowConsumer.built.append(self)

    def stop(self) -> None:
        self.stopped = True

    def close(self, timeout=None) -> None:
        self.closed += 1


@pytest.fixture
def slow(monkeypatch):
    SlowConsumer.built = []
    SlowConsumer.entered = threading.Event()
    SlowConsumer.release = threading.Event()
    monkeypatch.setattr(aio_module, "KmqConsumer", SlowConsumer)
    return SlowConsumer


async def _entered(slow) -> None:
    await asyncio.wait_for(asyncio.to_thread(slow.entered.wait, 10), 15)


def test_close_during_start_closes_the_consumer_start_was_building(slow):
    async def scenario():
        c = AsyncKmqConsumer(object(), "orders")
        starting = asyncio.create_task(c.start())
        await _entered(slow)
        closing = asyncio.create_task(c.close())
        await asyncio.sleep(0)  # close() has begun while the consumer is still being built
        slow.release.set()
        await asyncio.wait_for(closing, 10)
        assert [b.closed for b in slow.built] == [1]  # closed by the time close() returns
        with pytest.raises(KmqError, match="closed while it was starting"):
            await starting

    asyncio.run(scenario())
    assert [c.closed for c in slow.built] == [1]


def test_cancelling_start_closes_the_consumer_once_it_is_built(slow):
    async def scenario():
        c = AsyncKmqConsumer(object(), "orders")
        starting = asyncio.create_task(c.start())
        await _entered(slow)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting  # returns at once: the construction goes on on its thread
        assert c.stopping
        slow.release.set()
        await asyncio.wait_for(c.close(), 10)  # waits for the construction, which closes what it built
        assert [b.closed for b in slow.built] == [1]

    asyncio.run(scenario())
    assert [c.closed for c in slow.built] == [1]


def test_two_starts_at_once_build_one_consumer(slow):
    async def scenario():
        c = AsyncKmqConsumer(object(), "orders")
        first, second = asyncio.create_task(c.start()), asyncio.create_task(c.start())
        await _entered(slow)
        slow.release.set()
        assert await asyncio.wait_for(first, 10) is c and await asyncio.wait_for(second, 10) is c
        assert c.consumer is slow.built[0]
        await c.close()

    asyncio.run(scenario())
    assert [c.closed for c in slow.built] == [1]


def test_a_failed_start_can_be_retried(slow, monkeypatch):
    attempts = []

    class Unreachable(SlowConsumer):
        def __init__(self, cfg, queue, **kwargs):
            attempts.append(1)
            if len(attempts) == 1:
                raise KmqError("broker unavailable")
            super().__init__(cfg, queue, **kwargs)

    monkeypatch.setattr(aio_module, "KmqConsumer", Unreachable)
    slow.release.set()

    async def scenario():
        c = AsyncKmqConsumer(object(), "orders")
        with pytest.raises(KmqError, match="broker unavailable"):
            await c.start()
        assert await c.start() is c
        await c.close()

    asyncio.run(scenario())
    assert len(attempts) == 2 and [c.closed for c in slow.built] == [1]


def test_close_after_start_closes_once_and_start_after_close_is_refused(slow):
    slow.release.set()

    async def scenario():
        c = AsyncKmqConsumer(object(), "orders")
        await c.start()
        await c.close()
        await c.close()
        with pytest.raises(KmqError, match="closed"):
            await c.start()

    asyncio.run(scenario())
    assert [c.closed for c in slow.built] == [1]
