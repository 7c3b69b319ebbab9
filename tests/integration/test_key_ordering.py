"""``consumer.ordering: key`` on the real broker with a real tracker: many keys, handlers that fail
(nack, the tracker copies the message back) or reject at random; per key, the order in which
handlers completed messages is offset order and nothing is lost. With ``ordering: none`` the same
scenario completes some key out of order (the copy of a nacked message comes after its key's later
messages), so the check can fail."""

from __future__ import annotations

import random
import threading
import zlib
from typing import Callable

import pytest

from kmq.consumer.consumer import KmqConsumer
from tests.helpers.kafka import read_all, wait_until
from tests.helpers.keyed import keys_out_of_order, produce_keyed
from tests.integration.tracker_util import running_tracker

pytestmark = pytest.mark.integration

KEYS, PER_KEY = 24, 8
QUEUE = {"lease": "5s", "max_deliveries": 5, "backoff": {"initial": "100ms", "max": "500ms", "multiplier": 2.0}}


def fate(value: bytes, delivery: int) -> str:
    """Deterministic per message and delivery: fail on an early delivery, reject a few, else ok."""
    h = zlib.crc32(value + b"/%d" % delivery)
    if value.endswith(b"/3") and h % 4 == 0:
        return "reject"
    return "fail" if delivery <= 2 and h % 4 == 1 else "ok"


@pytest.mark.parametrize("ordering", ["key", "none"])
def test_per_key_completion_order_through_nacks_and_rejects(queue_topics, bootstrap, ordering):
    cfg, q = queue_topics(partitions=2, queue=QUEUE,
                          consumer={"ack_flush_interval": "50ms", "ordering": ordering})
    values = produce_keyed(cfg.kafka, q.name, KEYS, PER_KEY)
    rejected = {v for v in values if fate(v, 1) == "reject"}
    lock = threading.Lock()
    completed: dict[bytes, list[int]] = {}  # key -> sequence numbers in the order handlers completed them
    out: dict[bytes, int] = {}  # key -> messages of it in a handler right now
    most_at_once = [0]
    errors: list[BaseException] = []
    rng = random.Random(7)

    class Poison(ValueError):
        pass

    def handle(msg) -> None:
        with lock:
            out[msg.key] = out.get(msg.key, 0) + 1
            most_at_once[0] = max(most_at_once[0], out[msg.key])
            pause = rng.random() * 0.01
        try:
            threading.Event().wait(pause)  # handlers of different lengths: completion order can differ
            f = fate(msg.value, msg.delivery_count)
            if f == "reject":
                raise Poison("bad")
            if f == "fail":
                raise RuntimeError("try again")
            with lock:
                completed.setdefault(msg.key, []).append(int(msg.value.split(b"/")[1]))
        finally:
            with lock:
                out[msg.key] -= 1

    def run(consumer: KmqConsumer) -> None:
        try:
            consumer.run(handle, workers=8, reject_on=Poison)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    def all_done() -> bool:
        if errors:
            raise errors[0]
        with lock:
            return sum(len(set(v)) for v in completed.values()) == KEYS * PER_KEY - len(rejected)

    with running_tracker(cfg), KmqConsumer(cfg, queue=q.name) as consumer:
        runner = threading.Thread(target=run, args=(consumer,), daemon=True)
        runner.start()
        try:
            wait_until(all_done, 90, what="every message acked or rejected")
            dlq = wait_until(lambda: len(read_all(bootstrap, q.dlq_topic, timeout=2)) >= len(rejected) and
                             read_all(bootstrap, q.dlq_topic, timeout=2), 30, what="the rejected messages in the DLQ")
        finally:
            consumer.stop()
            runner.join(30)
    assert not errors and not runner.is_alive()
    assert {r.value for r in dlq} == rejected
    expected = {b"k%d" % k: [i for i in range(PER_KEY) if b"k%d/%d" % (k, i) not in rejected] for k in range(KEYS)}
    firsts = {key: list(dict.fromkeys(seqs)) for key, seqs in completed.items()}  # first completion of each
    assert {k: sorted(v) for k, v in firsts.items()} == expected, "a message lost or completed twice"
    out_of_order = sorted(k for k, v in firsts.items() if v != expected[k])
    if ordering == "key":
        assert out_of_order == [], f"keys completed out of offset order: {out_of_order}"
        assert most_at_once[0] == 1
    else:
        assert out_of_order, "ordering: none completed every key in order: the scenario cannot tell them apart"


def test_asyncio_run_keeps_key_order_and_runs_keys_in_parallel(queue_topics, bootstrap):
    import asyncio

    from kmq.aio import AsyncKmqConsumer

    cfg, q = queue_topics(partitions=1, queue=QUEUE, consumer={"ack_flush_interval": "50ms", "ordering": "key"})
    produce_keyed(cfg.kafka, q.name, 4, 6)

    async def scenario() -> tuple[dict[bytes, list[int]], int, int]:
        completed: dict[bytes, list[int]] = {}
        out: dict[bytes, int] = {}
        most_per_key = most_at_once = 0
        async with AsyncKmqConsumer(cfg, queue=q.name) as c:

            async def handler(msg) -> None:
                nonlocal most_per_key, most_at_once
                out[msg.key] = out.get(msg.key, 0) + 1
                most_per_key = max(most_per_key, out[msg.key])
                most_at_once = max(most_at_once, sum(out.values()))
                try:
                    await asyncio.sleep(0.005)  # let other keys' handlers start meanwhile
                    if msg.value == b"k1/2" and msg.delivery_count == 1:
                        raise RuntimeError("try again")  # nacked: its copy must come before k1/3
                    completed.setdefault(msg.key, []).append(int(msg.value.split(b"/")[1]))
                    if sum(map(len, completed.values())) == 24:
                        c.stop()
                finally:
                    out[msg.key] -= 1

            await asyncio.wait_for(c.run(handler, concurrency=8), 60)
        return completed, most_per_key, most_at_once

    with running_tracker(cfg):
        completed, most_per_key, most_at_once = asyncio.run(scenario())
    assert completed == {b"k%d" % k: list(range(6)) for k in range(4)}
    assert most_per_key == 1 and most_at_once > 1


def test_per_key_order_holds_when_a_rebalance_moves_a_partition_to_a_second_consumer(queue_topics):
    """The first consumer is in a handler of message 30 of some keys, with later messages of those
    keys committed and waiting for it, when the second one joins and takes a partition: the second
    starts after them and must not hand a later message of such a key until the first one settled
    the earlier ones (it still hands them out after the revocation). The first consumer's gated
    handlers finish once the second one completed a message of another key."""
    cfg, q = queue_topics(partitions=2, queue=QUEUE, consumer={
        "ack_flush_interval": "50ms", "ordering": "key", "max_outstanding_messages": 100})
    keys, per_key = 24, 60
    gated = {b"k%d/30" % k for k in range(6)}
    values = produce_keyed(cfg.kafka, q.name, keys, per_key)
    lock = threading.Lock()
    done: list[bytes] = []
    errors: list[BaseException] = []
    in_gate = threading.Semaphore(0)
    second_completed = threading.Event()

    def handler(second: bool) -> Callable:
        def handle(msg) -> None:
            if not second and msg.value in gated:
                in_gate.release()
                second_completed.wait(30)  # bounded: the test fails on order, not on a hang
            with lock:
                done.append(msg.value)
            if second:
                second_completed.set()
        return handle

    def run(consumer: KmqConsumer, second: bool) -> None:
        try:
            consumer.run(handler(second), workers=8)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    def all_done() -> bool:
        if errors:
            raise errors[0]
        with lock:
            return len(set(done)) >= len(values)

    with running_tracker(cfg), KmqConsumer(cfg, queue=q.name) as first, KmqConsumer(cfg, queue=q.name) as second:
        runners = [threading.Thread(target=run, args=(c, i == 1), daemon=True) for i, c in enumerate((first, second))]
        runners[0].start()
        try:
            assert in_gate.acquire(timeout=60), "the first consumer never reached a gated message"
            runners[1].start()  # joins the group: one partition moves to it
            wait_until(all_done, 120, what="every message completed")
        finally:
            second_completed.set()
            first.stop()
            second.stop()
            for r in runners:
                r.join(30)
    assert not errors
    with lock:
        completed = list(done)
    assert set(completed) == set(values)
    assert keys_out_of_order(completed) == []
