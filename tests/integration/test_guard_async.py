"""AsyncIdempotencyGuard against a real Redis: the asyncio guard keeps the threaded guard's
rules (and keys), so a late original and its redelivered copy take effect once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from kmq import IdempotencyGuard
from kmq.aio import AsyncIdempotencyGuard, AsyncKmqConsumer
from kmq.client.kafka_python import clients
from kmq.consumer.guard import GuardUnavailable, InProgressElsewhere
from kmq.core.markers import End
from kmq.dev.broker import free_port
from tests.conftest import unique
from tests.helpers.workers import markers_by_partition

pytestmark = [pytest.mark.integration, pytest.mark.redis]


def msg(origin: str) -> SimpleNamespace:
    return SimpleNamespace(origin=origin)


def test_a_copy_in_progress_is_retried_a_done_one_skipped_and_a_failure_released(redis_url):
    async def main():
        guard = AsyncIdempotencyGuard(redis_url, ttl=60, lock_ttl=30, prefix=unique("kmq-test") + ":")
        entered, release = asyncio.Event(), asyncio.Event()
        effects: list[str] = []

        async def slow(m):
            entered.set()
            await release.wait()  # the loop keeps running other coroutines meanwhile
            effects.append("original")

        original = asyncio.create_task(guard.run(msg("orders/3/42"), slow))
        await asyncio.wait_for(entered.wait(), 10)
        assert await guard.state("orders/3/42") == "running"
        with pytest.raises(InProgressElsewhere):
            await guard.run(msg("orders/3/42"), lambda m: asyncio.sleep(0, effects.append("copy")))
        release.set()
        assert await original == (True, None)
        ran, _ = await guard.run(msg("orders/3/42"), lambda m: asyncio.sleep(0, effects.append("copy")))
        assert ran is False and effects == ["original"] and guard.skipped == 1

        async def boom(m):
            raise RuntimeError("downstream unavailable")

        with pytest.raises(RuntimeError):
            await guard.run(msg("orders/0/7"), boom)
        assert await guard.state("orders/0/7") is None
        await guard.close()

    asyncio.run(main())


def test_the_threaded_and_the_asyncio_guard_see_each_others_marks(redis_url):
    prefix = unique("kmq-test") + ":"
    threaded = IdempotencyGuard(redis_url, ttl=60, prefix=prefix)
    assert threaded.run(msg("orders/1/1"), lambda m: "done") == (True, "done")

    async def main():
        guard = AsyncIdempotencyGuard(redis_url, ttl=60, prefix=prefix)

        async def handler(m):
            return "again"

        assert await guard.run(msg("orders/1/1"), handler) == (False, None)
        assert await guard.run(msg("orders/1/2"), handler) == (True, "again")
        await guard.close()

    asyncio.run(main())
    assert threaded.state("orders/1/2") == "done"
    threaded.close()


def test_redis_down_is_a_clear_retriable_error():
    async def main():
        guard = AsyncIdempotencyGuard(f"redis://127.0.0.1:{free_port()}/0", ttl=60)
        with pytest.raises(GuardUnavailable, match="the message was not processed") as err:
            await guard.run(msg("orders/0/1"), lambda m: asyncio.sleep(0))
        assert err.value.retriable
        await guard.close()

    asyncio.run(main())


def test_a_redelivered_copy_is_acked_without_a_second_effect_on_asyncio(queue_topics, bootstrap, redis_url):
    cfg, q = queue_topics(partitions=1, consumer={"ack_flush_interval": "50ms"})
    p = clients.producer(cfg.kafka)
    p.send(q.name, value=b"pay 10")  # the original, offset 0
    p.send(q.name, value=b"other")  # offset 1
    # the tracker's redelivered copy of offset 0 (its lease had run out)
    p.send(q.name, value=b"pay 10", headers=[("kmq-delivery-count", b"2"), ("kmq-origin", f"{q.name}/0/0".encode())])
    p.flush()
    p.close()
    effects: list[str] = []

    async def main():
        guard = AsyncIdempotencyGuard(redis_url, ttl=60, prefix=unique("kmq-test") + ":")
        seen: list[int] = []
        async with AsyncKmqConsumer(cfg, queue=q.name) as consumer:
            async def handler(m):
                effects.append(m.origin)

            guarded = guard.wrap(handler)

            async def counted(m):
                seen.append(m.offset)
                await guarded(m)
                if len(seen) == 3:
                    consumer.stop()

            await consumer.run(counted, concurrency=1)
        skipped = guard.skipped
        await guard.close()
        return skipped

    assert asyncio.run(main()) == 1
    assert sorted(effects) == [f"{q.name}/0/0", f"{q.name}/0/1"]
    ended = {o for m in markers_by_partition(bootstrap, q.markers_topic)[0] if isinstance(m, End)
             for r in m.ranges for o in r.offsets()}
    assert ended == {0, 1, 2}  # the duplicate is settled too
