"""AsyncKmqConsumer.run's worker pool and async for over a ready backlog, without a broker.

A fake consumer hands out real KmqMessages from a real ReadyQueue; what each message was
settled with is recorded by its settler."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from kmq.consumer.aio import AsyncKmqConsumer
from kmq.consumer.ready_queue import ReadyQueue
from kmq.consumer.take_ahead import HOLD, MOST, TakeAhead
from kmq.core.message import ACK, NACK, REJECT, KmqMessage


class Settler:
    def __init__(self) -> None:
        self.outcomes: dict[int, str] = {}

    def settled(self, msg: KmqMessage, outcome: str, arg: object) -> None:
        self.outcomes[msg.offset] = outcome

    def renewed(self, msg: KmqMessage, lease: float | None) -> None:
        pass


class ReadyConsumer:
    """Stands in for KmqConsumer: ``n`` messages ready at once, in batches of ``batch``."""

    def __init__(self, n: int, batch: int = 100) -> None:
        self.settler = Settler()
        lock = threading.Lock()
        self.ready = ReadyQueue()
        for start in range(0, n, batch):
            self.ready.put([KmqMessage("q", 0, o, None, b"v", None, 0, self.settler, lock)
                            for o in range(start, min(n, start + batch))], 0.0)
        self.batch_size = 50
        self.queue = types.SimpleNamespace(name="q", lease=30.0, backoff=types.SimpleNamespace(delay=lambda n: 1.0))
        self.stopping = False
        self.taken = 0
        self.ahead = TakeAhead(self.take_chunk)

    def stop(self) -> None:
        self.stopping = True

    def close(self, timeout: float | None = None) -> None:
        """As KmqConsumer.close: what was taken ahead goes back (here: recorded, in order)."""
        self.given_back = []
        self.ahead.put_back(lambda msgs, leased_at, gen: self.given_back.extend(msgs) or True, self.given_back.extend)

    def raise_error(self) -> None:
        self.ready.raise_error()

    def take_chunk(self, timeout: float, max_records: int) -> tuple[list[KmqMessage], float, int]:
        out = self.ready.take_chunk(timeout, max_records, lambda: self.stopping)
        self.taken += len(out[0])
        return out

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[KmqMessage]:
        """As KmqConsumer.poll: what was taken ahead first, then the ready queue."""
        n = max_records or self.batch_size
        return self.ahead.take(n) or self.take_chunk(timeout, n)[0]


def _consumer(fake: ReadyConsumer) -> AsyncKmqConsumer:
    return AsyncKmqConsumer(None, poll_timeout=0.05, consumer=fake)


def test_run_settles_every_message_by_its_outcome_and_takes_no_more_than_free_slots():
    fake = ReadyConsumer(1000)
    c = _consumer(fake)
    most_out = 0
    running = 0

    async def handler(msg):
        nonlocal most_out, running
        running += 1
        most_out = max(most_out, fake.taken - len(fake.settler.outcomes))
        await asyncio.sleep(0)
        running -= 1
        if msg.offset == 999:
            c.stop()
        if msg.offset % 10 == 1:
            raise ValueError("nack me")
        if msg.offset % 10 == 2:
            raise KeyError("reject me")

    asyncio.run(c.run(handler, concurrency=4, reject_on=KeyError))
    outcomes = fake.settler.outcomes
    assert len(outcomes) == fake.taken  # nothing taken was left unsettled
    assert fake.taken >= 1000 - 3  # the stop came with the last message; at most the other 3 slots' takes after it
    assert {o: outcomes[o] for o in (0, 1, 2, 3)} == {0: ACK, 1: NACK, 2: REJECT, 3: ACK}
    # Taken by a free worker, with at most a take-ahead more while the workers keep up.
    assert most_out <= 4 + MOST - 1


def test_run_over_a_ready_backlog_lets_other_tasks_run(monkeypatch):
    # Handlers that never suspend over messages that are all ready: the workers must still yield.
    monkeypatch.setattr(AsyncKmqConsumer, "YIELD_EVERY", 0.0)
    fake = ReadyConsumer(200)
    c = _consumer(fake)
    ticks_seen: list[int] = []

    async def scenario():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        async def handler(msg):
            ticks_seen.append(ticks)
            if msg.offset == 199:
                c.stop()

        t = asyncio.create_task(ticker())
        await c.run(handler, concurrency=2)
        t.cancel()

    asyncio.run(scenario())
    assert len(ticks_seen) == 200
    assert ticks_seen[-1] > 50  # the ticker kept running while the backlog was handled


def test_the_workers_share_one_turn_so_other_tasks_wait_one_budget_not_one_per_worker(monkeypatch):
    """16 workers over a ready backlog, handlers that never suspend: once YIELD_EVERY is spent, all
    workers yield until the loop ran its other tasks, so another task waits one budget, not one
    budget per worker (80 ms with 16 workers and 5 ms). Time is a counter: each handler call is 1 ms."""
    import kmq.consumer.aio as aio_module

    clock = [0.0]
    monkeypatch.setattr(aio_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(AsyncKmqConsumer, "YIELD_EVERY", 0.005)
    fake = ReadyConsumer(2000)
    c = _consumer(fake)
    calls_between_ticks: list[int] = []

    async def scenario():
        calls = 0

        async def ticker():
            nonlocal calls
            while True:
                calls_between_ticks.append(calls)
                calls = 0
                await asyncio.sleep(0)

        async def handler(msg):
            nonlocal calls
            calls += 1
            clock[0] += 0.001
            if msg.offset == 1999:
                c.stop()

        t = asyncio.create_task(ticker())
        await c.run(handler, concurrency=16)
        t.cancel()

    asyncio.run(scenario())
    assert sum(calls_between_ticks) >= 1990
    assert max(calls_between_ticks) <= 6, max(calls_between_ticks)  # one 5 ms budget (+ the call that spent it)


def test_a_fetcher_error_met_by_a_worker_ends_run_with_it():
    fake = ReadyConsumer(10)
    fake.ready.fail(RuntimeError("fetcher failed"))
    c = _consumer(fake)
    handled = []

    async def handler(msg):
        handled.append(msg.offset)

    with pytest.raises(RuntimeError, match="fetcher failed"):
        asyncio.run(c.run(handler, concurrency=3))
    assert sorted(handled) == list(range(10))  # the ready messages first, then the error


def test_async_for_over_a_ready_backlog_takes_a_few_ahead_and_leaves_the_rest_for_close():
    fake = ReadyConsumer(300)
    c = _consumer(fake)
    ahead = []

    async def scenario():
        seen = []
        async for msg in c:
            ahead.append(fake.taken - len(seen) - 1)
            seen.append(msg.offset)
            await msg.ack()
            if len(seen) == 130:
                break
        return seen

    assert asyncio.run(scenario()) == list(range(130))
    assert set(fake.settler.outcomes.values()) == {ACK}
    # One lock per few dozen messages, never more than MOST taken ahead of the loop.
    assert 0 < max(ahead) < MOST and fake.taken > 130
    # What was taken ahead and never handed out is given back by close, in order.
    asyncio.run(c.close())
    assert [m.offset for m in fake.given_back] == list(range(130, fake.taken))
    assert len(fake.settler.outcomes) == 130


def test_a_loop_slower_than_the_hold_takes_one_message_at_a_time():
    fake = ReadyConsumer(20)
    c = _consumer(fake)
    ahead = []

    async def scenario():
        n = 0
        async for msg in c:
            ahead.append(fake.taken - n - 1)
            n += 1
            await msg.ack()
            await asyncio.sleep(HOLD * 1.5)  # each message outlasts the hold
            if n == 10:
                break

    asyncio.run(scenario())
    assert ahead == [0] * 10 and fake.taken == 10
