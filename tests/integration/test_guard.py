"""IdempotencyGuard against a real Redis: a late original and its redelivered copy
take effect once."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from kmq import IdempotencyGuard, KmqConsumer

from kmq.client.kafka_python import clients
from kmq.consumer.guard import InProgressElsewhere
from tests.conftest import unique
from tests.helpers.kafka import wait_until
from tests.helpers.workers import markers_by_partition
from kmq.core.markers import End

pytestmark = [pytest.mark.integration, pytest.mark.redis]


def msg(origin: str) -> SimpleNamespace:
    return SimpleNamespace(origin=origin)


def test_redelivered_copy_is_acked_without_a_second_effect(queue_topics, bootstrap, redis_url):
    cfg, q = queue_topics(partitions=1, consumer={"ack_flush_interval": "50ms"})
    p = clients.producer(cfg.kafka)
    p.send(q.name, value=b"pay 10")  # the original, offset 0
    p.send(q.name, value=b"other")  # offset 1
    # the tracker's redelivered copy of offset 0 (its lease had run out)
    p.send(q.name, value=b"pay 10", headers=[("kmq-delivery-count", b"2"), ("kmq-origin", f"{q.name}/0/0".encode())])
    p.flush()
    p.close()
    guard = IdempotencyGuard(redis_url, ttl=60, prefix=unique("kmq-test") + ":")
    effects: list[str] = []
    consumer = KmqConsumer(cfg, queue=q.name)
    seen: list = []

    def handler(m):
        effects.append(m.origin)

    def counted(m):
        seen.append(m.offset)
        guard.wrap(handler)(m)
        if len(seen) == 3:
            consumer.stop()

    consumer.run(counted, workers=1)
    consumer.close()
    assert sorted(effects) == [f"{q.name}/0/0", f"{q.name}/0/1"]
    assert guard.skipped == 1 and guard.state(f"{q.name}/0/0") == "done"
    ended = {o for m in markers_by_partition(bootstrap, q.markers_topic)[0] if isinstance(m, End) for r in m.ranges for o in r.offsets()}
    assert ended == {0, 1, 2}  # the duplicate is settled too
    guard.close()


def test_copy_arriving_while_the_original_is_in_progress_is_retried_not_dropped(redis_url):
    guard = IdempotencyGuard(redis_url, ttl=60, lock_ttl=30, prefix=unique("kmq-test") + ":")
    origin = "orders/3/42"
    entered, release = threading.Event(), threading.Event()
    effects: list[str] = []

    def slow(m):
        entered.set()
        release.wait(10)
        effects.append("original")

    t = threading.Thread(target=guard.run, args=(msg(origin), slow))
    t.start()
    assert entered.wait(10)
    assert guard.state(origin) == "running"
    # Not skipped yet: if the original's worker died now, skipping would lose the effect.
    with pytest.raises(InProgressElsewhere):
        guard.run(msg(origin), lambda m: effects.append("copy"))
    release.set()
    t.join(10)
    assert effects == ["original"] and guard.state(origin) == "done"
    ran, _ = guard.run(msg(origin), lambda m: effects.append("copy"))  # the retried copy
    assert ran is False and effects == ["original"] and guard.skipped == 1
    guard.close()


def test_failure_releases_the_claim_so_the_redelivery_runs(redis_url):
    guard = IdempotencyGuard(redis_url, ttl=60, prefix=unique("kmq-test") + ":")
    origin = "orders/0/7"

    def boom(m):
        raise RuntimeError("downstream unavailable")

    with pytest.raises(RuntimeError):
        guard.run(msg(origin), boom)
    assert guard.state(origin) is None
    assert guard.run(msg(origin), lambda m: "done") == (True, "done")
    assert guard.run(msg(origin), lambda m: "again") == (False, None)
    guard.close()


def test_done_mark_expires_after_ttl_and_a_stale_lock_lets_the_next_copy_in(redis_url):
    guard = IdempotencyGuard(redis_url, ttl=0.3, lock_ttl=0.3, prefix=unique("kmq-test") + ":")
    assert guard.begin(msg("o/0/1"))  # a worker that claimed and then crashed
    wait_until(lambda: guard.begin(msg("o/0/1")), 5, what="stale lock to expire")
    guard.done(msg("o/0/1"))
    assert guard.state("o/0/1") == "done"
    wait_until(lambda: guard.state("o/0/1") is None, 5, what="done mark to expire")
    guard.close()
