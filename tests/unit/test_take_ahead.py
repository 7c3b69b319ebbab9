"""TakeAhead: ready messages taken a few at a time for iteration, and put back on close (no I/O)."""

from __future__ import annotations

import threading

from kmq.consumer.keyed_ready import KeyedReadyQueue
from kmq.consumer.ready_queue import ReadyQueue
from kmq.consumer.take_ahead import HOLD, MOST, TakeAhead
from kmq.core.message import KmqMessage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _queue(n: int, batch: int = 1000, leased_at: float = 5.0, gen: int = 2) -> ReadyQueue:
    q = ReadyQueue()
    lock = threading.Lock()
    for start in range(0, n, batch):
        q.put([KmqMessage("q", 0, o, None, b"v", None, 0, None, lock) for o in range(start, min(n, start + batch))],
              leased_at, gen)
    return q


def _ahead(q, clock: Clock) -> tuple[TakeAhead, list[int]]:
    sizes: list[int] = []

    def take_chunk(timeout: float, n: int):
        sizes.append(n)
        return q.take_chunk(timeout, n, lambda: False)

    return TakeAhead(take_chunk, clock), sizes


def test_takes_double_while_the_taker_keeps_up_and_fall_back_to_one_after_a_slow_step():
    clock = Clock()
    ahead, sizes = _ahead(_queue(1000), clock)
    got = [ahead.next().offset for _ in range(127)]  # no time passes: every take used up at once
    assert got == list(range(127)) and sizes == [1, 2, 4, 8, 16, 32, 64]
    clock.now += HOLD / 2
    ahead.next()  # the 64 were used up within the hold: the next take is as big
    assert sizes[-1] == MOST
    for _ in range(MOST - 1):
        ahead.next()
    clock.now += HOLD * 2  # a slow step: the next take is one message
    assert ahead.next().offset == 191 and sizes[-1] == 1


def test_a_take_never_spans_two_ready_batches():
    clock = Clock()
    ahead, sizes = _ahead(_queue(10, batch=3), clock)
    assert [ahead.next().offset for _ in range(10)] == list(range(10))
    assert sizes == [1, 2, 4, 8, 16]  # got 1, 2 (batch 1), 3 (batch 2), 3 (batch 3), 1 (batch 4)


def test_put_back_returns_every_held_message_in_order_with_its_batchs_lease_start_and_generation():
    clock = Clock()
    q = _queue(20, batch=10, leased_at=7.5, gen=4)
    ahead, _ = _ahead(q, clock)
    for _ in range(4):
        ahead.next()  # takes of 1, 2 and 4 messages: 4, 5 and 6 held
    assert ahead.take(1)[0].offset == 4  # what poll() gets first
    refused = ahead.put_back(q.put_back)
    assert refused == [] and not ahead
    # Back at the head of the ready queue: closing drains them first, with their generation.
    drained = q.drain()
    assert [m.offset for msgs, _gen in drained for m in msgs] == list(range(5, 20))
    assert {gen for _msgs, gen in drained} == {4}


def test_a_queue_that_cannot_take_messages_back_gets_them_refused():
    ahead, _ = _ahead(_queue(10), Clock())
    ahead.next(), ahead.next()
    held = ahead.take(0)
    assert held == []
    refused = ahead.put_back(lambda msgs, leased_at, gen: False)
    assert [m.offset for m in refused] == [2] and not ahead


def test_the_keyed_queue_is_taken_one_message_at_a_time_so_nothing_is_held():
    q = KeyedReadyQueue()
    lock = threading.Lock()
    q.put([KmqMessage("q", 0, o, b"k%d" % o, b"x", None, 0, None, lock) for o in range(5)], 1.0)
    ahead, sizes = _ahead(q, Clock())
    assert [ahead.next().offset for _ in range(5)] == list(range(5)) and not ahead
    assert sizes[-1] > 1  # asked for more, given one: taking lets a key go, which cannot be undone


def test_a_message_goes_either_to_the_taker_or_back_never_both_nor_neither():
    # A close on another thread while the taker runs through what is held.
    for _ in range(20):
        q = _queue(2000, batch=2000)
        ahead, _ = _ahead(q, Clock())
        first = [ahead.next() for _ in range(64)]  # takes 1+2+...+64: 63 held after these
        taken = [m.offset for m in first]
        start = threading.Event()

        def taker() -> None:
            start.wait()
            while (m := ahead.take(1)):
                taken.append(m[0].offset)

        t = threading.Thread(target=taker)
        t.start()
        back: list[int] = []
        start.set()
        ahead.put_back(lambda msgs, leased_at, gen: back.extend(m.offset for m in msgs) or True)
        t.join()
        assert sorted(taken + back) == list(range(127)) and not set(taken) & set(back)
