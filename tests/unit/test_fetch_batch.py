"""FetchBatch: one commit for several batches whose STARTs are answered (pure, no I/O)."""

import threading

from kmq.consumer.fetch_batch import FetchBatch, first_offsets
from kmq.core.message import KmqMessage


class _Done:
    def __init__(self, done: bool) -> None:
        self.is_done = done


def _batch(partition_offsets: dict[int, list[int]], done: bool = True) -> FetchBatch:
    lock = threading.Lock()
    msgs = [KmqMessage("q", p, o, None, b"x", [], 0, None, lock) for p, offs in partition_offsets.items() for o in offs]
    spans = {p: (o[0], o[-1]) for p, o in partition_offsets.items()}
    b = FetchBatch(msgs, {p: list(o) for p, o in partition_offsets.items()}, spans, 0.0)
    b.futures = [(p, [], _Done(done)) for p in partition_offsets]
    return b


def test_absorb_merges_offsets_spans_and_futures_so_one_commit_covers_both():
    a = _batch({0: [1, 2], 1: [5]})
    b = _batch({0: [3, 4], 2: [9]}, done=False)
    a.absorb(b)
    assert a.offsets == {0: [1, 2, 3, 4], 1: [5], 2: [9]}
    assert a.spans == {0: (1, 4), 1: (5, 5), 2: (9, 9)}
    assert [m.offset for m in a.messages] == [1, 2, 5, 3, 4, 9]
    assert len(a.futures) == 4  # one START per partition per fetched batch
    assert not a.started()  # the absorbed START is still unanswered
    assert first_offsets(a.messages) == {0: 1, 1: 5, 2: 9}


def test_started_only_when_every_start_is_answered():
    assert _batch({0: [1]}).started()
    assert not _batch({0: [1]}, done=False).started()
