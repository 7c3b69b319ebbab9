"""ReadyQueue: the fetcher -> application hand-over of KmqConsumer (no I/O)."""

import threading

import pytest

from kmq.core.message import KmqMessage
from kmq.consumer.keyed_ready import KeyedReadyQueue
from kmq.consumer.ready_queue import ReadyQueue


def _msgs(*offsets: int) -> list[KmqMessage]:
    lock = threading.Lock()
    return [KmqMessage("q", 0, o, None, b"x", [], 0, None, lock) for o in offsets]


def test_take_splits_a_batch_and_keeps_the_rest_first_in_line():
    q = ReadyQueue()
    q.put(_msgs(1, 2, 3), 10.0)
    q.put(_msgs(4), 11.0)
    assert [m.offset for m in q.take(0, 2, lambda: False)] == [1, 2]
    assert [m.offset for m in q.take(0, 0, lambda: False)] == [3]  # 0: the whole (rest of the) batch
    assert [m.offset for m in q.take(0, 5, lambda: False)] == [4]
    assert q.take(0.01, 5, lambda: False) == []


def test_error_is_raised_only_once_ready_messages_are_used_up():
    q = ReadyQueue()
    q.put(_msgs(1), 0.0)
    q.fail(RuntimeError("fetcher died"))
    q.raise_error()  # still something ready: no raise
    assert [m.offset for m in q.take(0, 5, lambda: False)] == [1]
    with pytest.raises(RuntimeError, match="fetcher died"):
        q.take(1, 5, lambda: False)
    with pytest.raises(RuntimeError):
        q.raise_error()


def test_renewal_resets_only_batches_whose_lease_started_before_the_cut_and_drain_empties():
    q = ReadyQueue()
    q.put(_msgs(1, 2), 0.0, gen=3)
    q.put(_msgs(3), 20.0, gen=4)
    assert [m.offset for m in q.due_for_renewal(older_than=10.0, now=30.0)] == [1, 2]
    assert q.due_for_renewal(older_than=10.0, now=31.0) == []  # reset to 30: not due again
    assert [([m.offset for m in msgs], gen) for msgs, gen in q.drain()] == [([1, 2], 3), ([3], 4)]
    assert q.take(0, 5, lambda: False) == []


def test_takes_of_one_hand_one_message_at_a_time_and_leaves_the_rest_ready():
    q = ReadyQueue()
    q.put(_msgs(1, 2, 3), 10.0, gen=1)
    assert q.take(0, 1, lambda: False)[0].offset == 1
    assert q.take(0, 1, lambda: False)[0].offset == 2
    # Taken messages are no longer renewed as held ones, nor given back on close.
    assert [m.offset for m in q.due_for_renewal(older_than=20.0, now=30.0)] == [3]
    assert [([m.offset for m in msgs], gen) for msgs, gen in q.drain()] == [([3], 1)]
    assert q.take(0.01, 1, lambda: False) == []


def test_taken_records_what_user_code_took_with_its_lease_start_one_record_per_batch():
    q = ReadyQueue()
    first = _msgs(1, 2, 3, 4)
    q.put(first, 10.0)
    q.put(_msgs(5), 11.0)
    q.take(0, 1, lambda: False)
    q.take(0, 1, lambda: False)
    q.take(0, 1, lambda: False)
    records = q.taken()
    assert len(records) == 1  # consecutive takes of one batch: one record, not one per message
    msgs, lo, hi, leased_at = records[0]
    assert msgs is first and (lo, hi, leased_at) == (0, 3, 10.0)
    assert q.taken() == []
    q.due_for_renewal(older_than=10.0, now=12.0)  # the rest's lease restarts: a new record for it
    assert [m.offset for m in q.take(0, 0, lambda: False)] == [4]
    assert [(lo, hi, at) for _, lo, hi, at in q.taken()] == [(3, 4, 12.0)]


def test_a_stopped_queue_returns_at_once():
    assert ReadyQueue().take(30, 5, lambda: True) == []


def _on(partition: int, *offsets: int) -> list[KmqMessage]:
    lock = threading.Lock()
    return [KmqMessage("q", partition, o, None, b"x", [], 0, None, lock) for o in offsets]


def test_take_out_removes_the_revoked_partitions_ready_messages_and_keeps_the_rest_in_place():
    q = ReadyQueue()
    q.put(_on(0, 1, 2) + _on(1, 7, 8), 10.0, gen=2)
    assert [m.offset for m in q.take(0, 1, lambda: False)] == [1]  # handed over: not taken out
    q.put(_on(1, 9), 11.0, gen=1)  # fetched before partition 1's last revocation: stale
    q.put(_on(0, 3), 12.0, gen=2)
    out = q.take_out({1}, lambda p, gen: gen >= 2)
    assert [([m.offset for m in msgs], at, gen) for msgs, at, gen in out] == [([7, 8], 10.0, 2)]
    assert [m.offset for m in q.take(0, 0, lambda: False)] == [2]  # the rest of the first batch, first in line
    assert [m.offset for m in q.take(0, 0, lambda: False)] == [9]  # the stale one stays
    for msgs, at, gen in out:  # put back as they were (the commit back failed)
        q.put(msgs, at, gen)
    assert [m.offset for m in q.take(0, 0, lambda: False)] == [3]
    assert [m.offset for m in q.take(0, 0, lambda: False)] == [7, 8]
    assert q.take_out({0, 1}, lambda p, gen: True) == []
    records = q.taken()
    assert [(r[0][r[1]].offset, r[2] - r[1], r[3]) for r in records][:2] == [(1, 1, 10.0), (2, 1, 10.0)]


def test_a_chunk_comes_from_one_batch_with_its_lease_start_and_generation_and_goes_back_to_the_head():
    q = ReadyQueue()
    first, second = _msgs(1, 2, 3), _msgs(4, 5)
    q.put(first, 10.0, gen=2)
    q.put(second, 11.0, gen=3)
    msgs, leased_at, gen = q.take_chunk(0, 5, lambda: False)
    assert [m.offset for m in msgs] == [1, 2, 3] and (leased_at, gen) == (10.0, 2)  # never across batches
    assert q.put_back(msgs[1:], leased_at, gen)
    # Back at the head, as they were: closing drains them first, with their generation.
    assert [([m.offset for m in ms], g) for ms, g in q.drain()] == [([2, 3], 2), ([4, 5], 3)]
    assert q.take_chunk(0, 5, lambda: False) == ([], 0.0, 0)
    # Once drained (the close plan is made) nothing goes back: kept, it would be given back by nobody.
    assert not q.put_back(_msgs(6), 10.0, 2) and q.drain() == []


def test_the_keyed_queue_takes_one_message_per_chunk_and_cannot_take_one_back():
    # Taking a message lets its key go to user code: a taker must not take ahead there.
    q = KeyedReadyQueue()
    lock = threading.Lock()
    q.put([KmqMessage("q", 0, o, b"k%d" % o, b"x", None, 0, None, lock) for o in range(3)], 10.0)
    msgs, _leased_at, _gen = q.take_chunk(0, 5, lambda: False)
    assert [m.offset for m in msgs] == [0]
    assert not q.put_back(msgs, 10.0, 0) and q.put_back([], 10.0, 0)
    assert [m.offset for m in q.take(0, 5, lambda: False)] == [1, 2]
