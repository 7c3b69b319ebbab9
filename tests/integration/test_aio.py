"""kmq.aio.AsyncKmqConsumer on the real broker: settlements on the markers topic and through a
real tracker, run() concurrency and failures, cancellation and close giving messages back,
and an event loop that Kafka I/O never blocks (broker stopped included). The README example
runs in test_readme_snippets.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time

import pytest

from kmq.aio import AsyncKmqConsumer, AsyncKmqMessage
from kmq.config import Config
from kmq.core.markers import End, Nack, Reject, Renew
from kmq.client.topics import ensure_topics
from tests.conftest import TEST_GROUP_TIMING, unique
from tests.helpers.kafka import own_broker, produce, read_all, wait_until
from tests.helpers.workers import committed, markers_by_partition
from tests.integration.tracker_util import running_tracker

pytestmark = pytest.mark.integration

QUEUE = {"lease": "2s", "max_deliveries": 3, "backoff": {"initial": "300ms", "max": "2s", "multiplier": 2.0}}
FAST_FLUSH = {"ack_flush_interval": "50ms"}


@pytest.fixture(autouse=True, params=["threaded", "aiokafka"])
def client(request, monkeypatch):
    """Every test twice: on the threaded bridge (the configured kafka.client) and with ``kafka.client:
    aiokafka`` (the consumer on the event loop; the tracker and the test's own clients stay on kafka-python)."""
    if request.param == "aiokafka":
        monkeypatch.setattr(sys.modules[__name__], "AsyncKmqConsumer", OnAiokafka)
    return request.param


class OnAiokafka(AsyncKmqConsumer):
    """``AsyncKmqConsumer`` with ``kafka.client: aiokafka``."""

    def __init__(self, cfg: Config, *args, **kwargs) -> None:
        super().__init__(on_aiokafka(cfg), *args, **kwargs)


def on_aiokafka(cfg: Config) -> Config:
    return dataclasses.replace(cfg, kafka=dataclasses.replace(cfg.kafka, client="aiokafka"))


async def take(consumer: AsyncKmqConsumer, n: int, timeout: float = 30.0) -> list[AsyncKmqMessage]:
    out: list[AsyncKmqMessage] = []
    async with asyncio.timeout(timeout):
        async for msg in consumer:
            out.append(msg)
            if len(out) == n:
                break
    return out


def ranges(markers: list, kind: type) -> dict[int, object]:
    """offset -> marker of ``kind`` covering it."""
    return {o: m for m in markers if isinstance(m, kind) for r in m.ranges for o in r.offsets()}


def test_settlements_reach_the_markers_topic_and_the_tracker_acts_on_them(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, queue=QUEUE, consumer=FAST_FLUSH, tracker={"tick": "50ms"})
    produce(cfg, q.name, 4, keys=b"%d")

    async def scenario() -> list[AsyncKmqMessage]:
        async with AsyncKmqConsumer(cfg, queue=q.name) as c:
            first = sorted(await take(c, 4), key=lambda m: m.offset)
            assert [m.delivery_count for m in first] == [1, 1, 1, 1]
            await first[0].ack()
            await first[1].nack(delay=0.2)
            await first[2].reject("bad payload")
            await first[3].renew(lease=30.0)
            # The tracker redelivers the nacked message: a copy with delivery count 2.
            copy = (await take(c, 1, timeout=30))[0]
            await copy.ack()
            await first[3].ack()
            return [*first, copy]

    with running_tracker(cfg):
        msgs = asyncio.run(scenario())
        dlq = wait_until(lambda: read_all(bootstrap, q.dlq_topic, timeout=2), 30, what="the rejected message in the DLQ")
    copy = msgs[4]
    assert copy.value == b"m1" and copy.delivery_count == 2 and copy.origin == f"{q.name}/0/1"
    assert [r.value for r in dlq] == [b"m2"]
    markers = markers_by_partition(bootstrap, q.markers_topic)[0]
    nacks, rejects, renews, ends = (ranges(markers, k) for k in (Nack, Reject, Renew, End))
    assert set(nacks) == {1} and nacks[1].delay_ms == 200
    assert set(rejects) == {2} and rejects[2].reason == "bad payload"
    assert 3 in renews and renews[3].lease_ms == 30000
    assert {0, 3, copy.offset} <= set(ends)


@pytest.mark.parametrize("hand_over", ["committed", "started"])
def test_run_processes_n_at_once_and_settles_by_outcome(queue_topics, bootstrap, hand_over):
    cfg, q = queue_topics(partitions=2, queue=QUEUE, consumer={**FAST_FLUSH, "hand_over": hand_over})
    produce(cfg, q.name, 24, keys=b"%d", partitions=2)
    n = 4

    class BadPayload(Exception):
        pass

    async def scenario() -> tuple[int, list[bytes]]:
        active = peak = 0
        all_busy = asyncio.Event()
        handled: list[bytes] = []
        async with AsyncKmqConsumer(cfg, queue=q.name) as c:

            async def handler(msg: AsyncKmqMessage) -> None:
                nonlocal active, peak
                active += 1
                peak = max(peak, active)
                if active == n:
                    all_busy.set()
                try:
                    await all_busy.wait()  # the first n wait for each other: n must run at once
                    handled.append(msg.value)
                    if len(handled) == 24:
                        c.stop()
                    if msg.value == b"m5":
                        raise RuntimeError("boom")
                    if msg.value == b"m6":
                        raise BadPayload("no schema")
                    if msg.value == b"m7":
                        await msg.nack(delay=1.0)  # settled by the handler: left alone
                finally:
                    active -= 1

            await asyncio.wait_for(c.run(handler, concurrency=n, reject_on=BadPayload), 60)
        return peak, handled

    peak, handled = asyncio.run(scenario())
    assert peak == n
    assert sorted(handled) == sorted(b"m%d" % i for i in range(24))
    markers = markers_by_partition(bootstrap, q.markers_topic)
    # m5 and m7 are on partition 1 (i % 2), offsets 2 and 3; m6 on partition 0, offset 3.
    nacks, ends = ranges(markers[1], Nack), ranges(markers[1], End)
    assert nacks[2].delay_ms == 300 and nacks[3].delay_ms == 1000  # backoff delay(1) = 300 ms; the handler's own
    assert ranges(markers[0], Reject)[3].reason == "BadPayload: no schema"
    assert set(ends) == set(range(12)) - {2, 3} and set(ranges(markers[0], End)) == set(range(12)) - {3}


def test_cancelling_run_waits_for_handlers_then_leaves_them_to_their_leases_and_gives_back_the_rest(
        queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, queue={"lease": "30s"}, consumer=FAST_FLUSH)
    produce(cfg, q.name, 20, keys=b"%d")
    started: list[int] = []

    async def scenario() -> None:
        two_running = asyncio.Event()
        async with AsyncKmqConsumer(cfg, queue=q.name) as c:

            async def hang(msg: AsyncKmqMessage) -> None:
                started.append(msg.offset)
                if len(started) == 2:
                    two_running.set()
                await asyncio.Event().wait()  # never returns

            runner = asyncio.create_task(c.run(hang, concurrency=2, drain_timeout=0.3))
            await asyncio.wait_for(two_running.wait(), 30)
            runner.cancel()
            with pytest.raises(asyncio.CancelledError):
                await runner

    asyncio.run(scenario())
    assert started == [0, 1]
    markers = markers_by_partition(bootstrap, q.markers_topic)[0]
    # The cancelled handlers' messages: no marker (their leases run out at the tracker). The 18 never
    # handed to a handler: committed back, not nacked, so they come again with the same delivery count.
    assert not ranges(markers, Nack) and not ranges(markers, End)
    assert committed(bootstrap, cfg.consumer.group_id, q.name) == {0: 2}

    async def next_member() -> list[AsyncKmqMessage]:
        async with AsyncKmqConsumer(cfg, queue=q.name) as c:
            got = await take(c, 18)
            for m in got:
                await m.ack()
            return got

    got = asyncio.run(next_member())
    assert sorted(m.offset for m in got) == list(range(2, 20)) and {m.delivery_count for m in got} == {1}


def test_cancelling_async_for_gives_back_never_handed_messages(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, consumer=FAST_FLUSH)
    produce(cfg, q.name, 30, keys=b"%d")

    async def scenario() -> None:
        five = asyncio.Event()

        async def consume() -> None:
            async with AsyncKmqConsumer(cfg, queue=q.name) as c:
                n = 0
                async for msg in c:
                    await msg.ack()
                    n += 1
                    if n == 5:
                        five.set()
                        await asyncio.Event().wait()  # cancelled here, with messages ready in the consumer

        task = asyncio.create_task(consume())
        await asyncio.wait_for(five.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert committed(bootstrap, cfg.consumer.group_id, q.name) == {0: 5}
    markers = markers_by_partition(bootstrap, q.markers_topic)[0]
    assert set(ranges(markers, End)) == set(range(5)) and not ranges(markers, Nack)

    async def next_member() -> list[AsyncKmqMessage]:
        async with AsyncKmqConsumer(cfg, queue=q.name) as c:
            got = await take(c, 25)
            for m in got:
                await m.ack()
            return got

    got = asyncio.run(next_member())
    assert sorted(m.offset for m in got) == list(range(5, 30)) and {m.delivery_count for m in got} == {1}


class Ticker:
    """Ticks every 10 ms on the loop and keeps the largest gap: a blocked loop shows as a long gap."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now

    def start(self) -> "Ticker":
        self._task = asyncio.create_task(self._tick())
        return self

    def reset(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@pytest.mark.slow
def test_the_event_loop_is_never_blocked_empty_topic_or_broker_stopped(tmp_path):
    broker = own_broker(tmp_path, durable=False).start()
    try:
        cfg = Config.from_dict({
            "kafka": {"bootstrap_servers": broker.bootstrap, **TEST_GROUP_TIMING, "connect_timeout": "2s"},
            "queues": [{"name": unique("q"), "lease": "5s"}],
            "consumer": {"group_id": unique("workers"), **FAST_FLUSH},
            "tracker": {"group_id": unique("tracker"), "http_port": 0},
        })
        q = cfg.queues[0]
        ensure_topics(cfg.kafka, q, 1)
        produce(cfg, q.name, 3000, keys=b"%d")

        async def scenario() -> dict[str, float]:
            gaps: dict[str, float] = {}
            ticker = Ticker().start()
            c = AsyncKmqConsumer(cfg, queue=q.name)
            await c.start()
            gaps["start"] = ticker.reset()
            held: list[AsyncKmqMessage] = []
            async with asyncio.timeout(60):  # a backlog: messages are ready faster than they are taken
                async for msg in c:
                    if len(held) < 3:
                        held.append(msg)  # acked while the broker is stopped, below
                    else:
                        await msg.ack()
                    if msg.offset == 2999:
                        break
            gaps["async for over a backlog"] = ticker.reset()
            # The topic is empty now: the consumer waits for records (the join happened above).
            waiting = asyncio.create_task(take(c, 1, timeout=60))
            await asyncio.sleep(3.0)
            gaps["empty topic"] = ticker.reset()
            broker.kill()  # the broker is gone while a poll waits and while settlements are made
            await asyncio.sleep(1.0)
            for m in held:
                await m.ack()
            await asyncio.sleep(4.0)  # the END write fails (delivery timeout 3 s) and goes to the retry store
            gaps["broker stopped"] = ticker.reset()
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            await c.close(timeout=1.0)  # off the loop, though it cannot reach the broker
            gaps["close, broker stopped"] = ticker.reset()
            await ticker.stop()
            return gaps

        t0 = time.monotonic()
        gaps = asyncio.run(scenario())
        print(f"largest event-loop gaps (s): { {k: round(v, 3) for k, v in gaps.items()} }, run {time.monotonic() - t0:.1f}s")
        assert all(g < 0.5 for g in gaps.values()), gaps
    finally:
        broker.stop()


def test_a_handler_that_never_returns_is_renewed_up_to_max_lease_then_redelivered(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, queue={"lease": "1s", "max_deliveries": 5},
                          consumer={"auto_renew": True, "max_lease": "3s", **FAST_FLUSH}, tracker={"tick": "50ms"})
    produce(cfg, q.name, 1, keys=b"%d")
    copies: list[AsyncKmqMessage] = []
    seen_at: list[float] = []

    async def scenario() -> None:
        async with AsyncKmqConsumer(cfg, queue=q.name) as c:

            async def handler(msg: AsyncKmqMessage) -> None:
                seen_at.append(time.monotonic())
                if msg.delivery_count == 1:
                    await asyncio.Event().wait()  # hangs: only its lease bounds it
                copies.append(msg)
                c.stop()

            await asyncio.wait_for(c.run(handler, concurrency=2, drain_timeout=0.2), 60)

    with running_tracker(cfg):
        asyncio.run(scenario())
    assert [(m.value, m.delivery_count) for m in copies] == [(b"m0", 2)]
    # Not after the 1 s lease but after max_lease (3 s from START, a little before the handler got it):
    # the running handler's lease was kept until then.
    assert seen_at[1] - seen_at[0] >= 2.5, seen_at
    markers = markers_by_partition(bootstrap, q.markers_topic)[0]
    renews = [m for m in markers if isinstance(m, Renew) and 0 in {o for r in m.ranges for o in r.offsets()}]
    assert len(renews) >= 2, markers  # renewed while the handler ran (lease 1 s, max_lease 3 s)


def test_close_from_another_task_lets_run_drain_its_handlers_first(queue_topics, bootstrap):
    cfg, q = queue_topics(partitions=1, consumer=FAST_FLUSH)
    produce(cfg, q.name, 10, keys=b"%d")

    async def scenario() -> None:
        two_running, release = asyncio.Event(), asyncio.Event()
        running = 0
        c = await AsyncKmqConsumer(cfg, queue=q.name).start()

        async def slow(msg: AsyncKmqMessage) -> None:
            nonlocal running
            running += 1
            if running == 2:
                two_running.set()
            await release.wait()

        runner = asyncio.create_task(c.run(slow, concurrency=2))
        await asyncio.wait_for(two_running.wait(), 30)
        closer = asyncio.create_task(c.close())  # e.g. a shutdown hook, while both handlers run
        # close() does not close the consumer under running handlers (it would take well under 2 s).
        done, _ = await asyncio.wait({closer}, timeout=2.0)
        assert not done and not runner.done()
        release.set()  # the handlers return: their acks must still be written
        await asyncio.wait_for(asyncio.gather(runner, closer), 60)

    asyncio.run(scenario())
    markers = markers_by_partition(bootstrap, q.markers_topic)[0]
    assert set(ranges(markers, End)) == {0, 1} and not ranges(markers, Nack)
    assert committed(bootstrap, cfg.consumer.group_id, q.name) == {0: 2}  # the 8 never handed: given back


def test_a_member_joining_mid_backlog_takes_partitions_and_nothing_is_lost(queue_topics, bootstrap):
    # The rebalance gives the first member's ready messages back (committed back to the first of
    # them, their leases handed off): every message is acked by one member or the other, none lost.
    cfg, q = queue_topics(partitions=2, queue={"lease": "30s"}, consumer=FAST_FLUSH)
    produce(cfg, q.name, 400, keys=b"%d", partitions=2)
    everything = {(p, o) for p in (0, 1) for o in range(200)}

    async def scenario() -> dict[str, set[tuple[int, int]]]:
        acked: dict[str, set[tuple[int, int]]] = {"first": set(), "second": set()}
        fifty, joined = asyncio.Event(), asyncio.Event()

        async def member(name: str) -> None:
            async with AsyncKmqConsumer(cfg, queue=q.name) as c:
                async for msg in c:
                    await msg.ack()
                    acked[name].add((msg.partition, msg.offset))
                    if name == "second":
                        joined.set()
                    elif len(acked["first"]) == 50:
                        fifty.set()
                        # The rest of the backlog waits in this member (fetched, ready) until the
                        # second one has a partition: the rebalance takes what is ready back.
                        await joined.wait()
                    if everything <= acked["first"] | acked["second"]:
                        break

        async with asyncio.timeout(90):
            first = asyncio.create_task(member("first"))
            await fifty.wait()
            second = asyncio.create_task(member("second"))
            done, _ = await asyncio.wait([first, second], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
            for t in (first, second):
                t.cancel()
            await asyncio.gather(first, second, return_exceptions=True)
        return acked

    acked = asyncio.run(scenario())
    assert everything <= acked["first"] | acked["second"]
    assert acked["second"] and len(acked["first"]) >= 50
    markers = markers_by_partition(bootstrap, q.markers_topic)
    ended = {(p, o) for p, ms in markers.items() for o in ranges(ms, End)}
    assert everything <= ended
