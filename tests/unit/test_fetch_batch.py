"""FetchBatch: one poll's records on their way to user code (pure, no I/O)."""

import threading

from kmq.consumer.fetch_batch import STARTING, FetchBatch, first_offsets
from kmq.core.message import KmqMessage


def _msgs(partition_offsets: dict[int, list[int]]) -> list[KmqMessage]:
    lock = threading.Lock()
    return [KmqMessage("q", p, o, None, b"xy", [], 0, None, lock) for p, offs in partition_offsets.items() for o in offs]


def test_of_groups_offsets_per_partition_in_fetch_order_with_spans_and_bytes():
    b = FetchBatch.of(_msgs({0: [1, 2, 3], 1: [5]}), now=7.0, gen=2)
    assert b.offsets == {0: [1, 2, 3], 1: [5]}
    assert b.spans == {0: (1, 3), 1: (5, 5)}
    assert b.nbytes == 8 and b.gen == 2 and b.state is STARTING
    assert b.fetched_at == b.leased_at == 7.0


def test_drop_takes_a_partition_out_of_messages_offsets_and_spans():
    b = FetchBatch.of(_msgs({0: [1, 2], 1: [5, 6], 2: [9]}), now=0.0, gen=0)
    out = b.drop({1, 2})
    assert [(m.partition, m.offset) for m in out] == [(1, 5), (1, 6), (2, 9)]
    assert [m.offset for m in b.messages] == [1, 2]
    assert b.offsets == {0: [1, 2]} and b.spans == {0: (1, 2)}


def test_first_offsets_is_the_smallest_offset_per_partition():
    assert first_offsets(_msgs({0: [4, 2, 3], 1: [7]})) == {0: 2, 1: 7}
