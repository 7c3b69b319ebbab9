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


def _no_refusal(msgs: list[KmqMessage]) -> None:
    raise AssertionError(f"refused {msgs}")


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
    refused: list[KmqMessage] = []
    ahead.put_back(q.put_back, refused.extend)
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
    refused: list[KmqMessage] = []
    ahead.put_back(lambda msgs, leased_at, gen: False, refused.extend)
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

        def taker(ahead=ahead, start=start, taken=taken) -> None:
            start.wait()
            while (m := ahead.take(1)):
                taken.append(m[0].offset)

        t = threading.Thread(target=taker)
        t.start()
        back: list[int] = []
        start.set()
        ahead.put_back(lambda msgs, leased_at, gen, back=back: back.extend(m.offset for m in msgs) or True, _no_refusal)
        t.join()
        assert sorted(taken + back) == list(range(127)) and not set(taken) & set(back)


def _closing_in_the_take(q: ReadyQueue, close) -> TakeAhead:
    """A TakeAhead whose next take from ``q`` runs ``close(ahead)`` right after the ready queue
    handed the chunk over and before the taker keeps its rest: the instant another thread's
    ``KmqConsumer.close()`` can land in."""
    armed = threading.Event()

    def take_chunk(timeout: float, n: int):
        got = q.take_chunk(timeout, n, lambda: False)
        if armed.is_set():
            armed.clear()
            close(ahead)
        return got

    ahead = TakeAhead(take_chunk, Clock())
    ahead.arm = armed.set  # type: ignore[attr-defined]
    return ahead


def test_a_close_between_a_take_and_the_keeping_of_its_rest_gives_every_never_handed_message_back():
    q = _queue(200, batch=200, leased_at=7.5, gen=4)
    refused: list[KmqMessage] = []
    ahead = _closing_in_the_take(q, lambda a: a.put_back(q.put_back, refused.extend))
    handed = [ahead.next() for _ in range(63)]  # takes of 1, 2, ..., 32: all handed; the next takes 64
    assert [m.offset for m in handed] == list(range(63)) and not ahead
    ahead.arm()
    # The take of 64: the close lands before the taker hands the first on and keeps the 63 behind it.
    assert ahead.next() is None and not ahead and refused == []
    assert ahead.idle(0)  # nothing in progress: the fetcher may drain
    # Back in the ready queue with their batch's generation: closing gives them to the group.
    drained = q.drain()
    back = sorted(m.offset for msgs, _gen in drained for m in msgs)
    assert back == list(range(63, 200)) and {gen for _msgs, gen in drained} == {4}
    # No take starts once the close has begun, and a late keep goes back too (here: refused, the
    # close plan is made) rather than being held.
    assert ahead.next() is None
    late = [KmqMessage("q", 0, 500, None, b"v", None, 0, None, threading.Lock())]
    ahead.keep(late, 7.5, 4)
    assert not ahead and refused == late


def test_a_close_while_a_take_is_in_progress_waits_for_it_before_the_ready_queue_is_drained():
    q = _queue(200, batch=200)
    in_take, closed = threading.Event(), threading.Event()
    ahead = _closing_in_the_take(q, lambda a: (in_take.set(), closed.wait(5)))
    for _ in range(63):
        ahead.next()
    ahead.arm()
    taker = threading.Thread(target=ahead.next)
    taker.start()
    assert in_take.wait(5)
    ahead.put_back(q.put_back, _no_refusal)  # the closer, while the taker is between take and keep
    busy = not ahead.idle(0)  # the fetcher waits here before draining
    closed.set()
    assert ahead.idle(5)
    taker.join()
    assert sorted(m.offset for msgs, _gen in q.drain() for m in msgs) == list(range(63, 200)) and not ahead
    assert busy


def test_every_step_counts_as_a_take_also_one_served_from_what_was_taken_ahead():
    # The fetcher tells a stalled application by this count (consumer.max_poll_interval): a loop that
    # works through messages taken ahead is taking, though it reaches the ready queue rarely.
    clock = Clock()
    ahead, sizes = _ahead(_queue(10), clock)
    for _ in range(5):
        assert ahead.next() is not None
    assert ahead.takes == 5 and len(sizes) < 5
    q = ReadyQueue()
    idle = TakeAhead(lambda timeout, n: q.take_chunk(timeout, n, lambda: False), clock)
    assert idle.next() is None and idle.takes == 1  # a take that found nothing is a take too
