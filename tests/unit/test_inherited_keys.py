"""kmq.core.inherited_keys: which keys a new owner of a partition inherits blocked, from the markers
and the queue records below the offset it starts at (consumer.ordering: key)."""

from __future__ import annotations

from kmq.core.inherited_keys import MarkerFold, QueueRecord, inherit
from kmq.core.markers import Closed, End, Nack, Outcome, Reject, Start


def fold_of(*markers) -> MarkerFold:
    fold = MarkerFold()
    for i, m in enumerate(markers):
        fold.apply(m, i, 1_000 + i)
    return fold


def rec(offset: int, key: bytes | None, origin: int | None = None) -> QueueRecord:
    return QueueRecord(offset, key, offset if origin is None else origin)


def test_an_open_start_below_the_start_offset_blocks_its_key():
    fold = fold_of(Start(((0, 4),), 3000), End(((0, 1), (2, 1))))  # 1 and 3 still open
    assert fold.lowest_unsettled(4) == 1
    got = inherit(fold, [rec(1, b"a"), rec(2, b"b"), rec(3, b"a")], start=4)
    assert got.keys == {b"a": [1, 3]}
    assert got.watch == {1: (b"a", 1), 3: (b"a", 3)}


def test_offsets_at_or_after_the_start_are_the_new_owners_own():
    fold = fold_of(Start(((0, 10),), 3000))
    assert fold.lowest_unsettled(0) is None
    assert inherit(fold, [rec(5, b"a")], start=5).keys == {}


def test_a_message_copied_by_the_tracker_blocks_its_key_until_the_copy_comes():
    fold = fold_of(Start(((0, 2),), 3000), Nack(((0, 1),)), End(((1, 1),)), Closed(((0, 1),), Outcome.REDELIVERED))
    assert fold.lowest_unsettled(2) == 0
    assert inherit(fold, [rec(0, b"a"), rec(1, b"a")], start=2).keys == {b"a": [0]}


def test_a_copy_already_settled_below_the_start_frees_its_origin():
    # 0 copied to 5, the old owner handled the copy (START + END) before the start offset 6.
    fold = fold_of(Start(((0, 5),), 3000), End(((1, 4),)), Closed(((0, 1),), Outcome.REDELIVERED),
                   Start(((5, 1),), 3000), End(((5, 1),)))
    records = [rec(o, b"a") for o in range(5)] + [rec(5, b"a", origin=0)]
    assert inherit(fold, records, start=6).keys == {}


def test_a_copy_still_open_below_the_start_blocks_by_its_origin():
    fold = fold_of(Start(((0, 5),), 3000), End(((1, 4),)), Closed(((0, 1),), Outcome.REDELIVERED),
                   Start(((5, 1),), 3000))
    records = [rec(o, b"a") for o in range(5)] + [rec(5, b"a", origin=0)]
    got = inherit(fold, records, start=6)
    assert got.keys == {b"a": [0]} and got.watch == {5: (b"a", 0)}


def test_rejected_dead_lettered_or_missing_deliveries_hold_nothing():
    fold = fold_of(Start(((0, 3),), 3000), Reject(((0, 1),), "bad"), Closed(((1, 1),), Outcome.DEAD_LETTERED),
                   Closed(((2, 1),), Outcome.MISSING))
    assert inherit(fold, [rec(0, b"a"), rec(1, b"b"), rec(2, b"c")], start=3).keys == {}


def test_null_keys_and_records_missing_from_the_read_hold_nothing():
    fold = fold_of(Start(((0, 3),), 3000))
    assert inherit(fold, [rec(0, None), rec(2, b"c")], start=3).keys == {b"c": [2]}


def test_settlements_read_later_release_the_watched_deliveries():
    fold = fold_of(Start(((0, 2),), 3000))
    got = inherit(fold, [rec(0, b"a"), rec(1, b"b")], start=2)
    assert set(got.watch) == {0, 1}
    fold.apply(End(((0, 1),)), 10, 2_000)
    fold.apply(Closed(((1, 1),), Outcome.REDELIVERED), 11, 2_001)
    assert fold.settled(0) and not fold.settled(1)  # 1's copy is still to come
    fold.apply(Start(((7, 1),), 3000), 12, 2_002)  # the new owner's own START is not about 1
    assert not fold.settled(1)


def test_bad_records_are_counted_and_passed():
    fold = MarkerFold(position=40)
    fold.skip(40)
    fold.apply(Start(((0, 1),), 3000), 41, 1)
    assert (fold.records, fold.bad, fold.position) == (2, 1, 42)


def test_a_copy_in_the_backlog_of_a_message_below_the_start_blocks_its_key_whatever_the_markers_say():
    # The markers window (from the tracker's commit) no longer shows 0: its copy waits at 9.
    fold = fold_of(Start(((5, 2),), 3000), End(((5, 2),)))
    got = inherit(fold, [rec(7, b"a"), rec(8, b"b"), rec(9, b"a", origin=0), rec(10, b"c", origin=8)], start=7)
    assert got.keys == {b"a": [0]}  # 8 is the new owner's own: its copy is ordered as usual
    assert got.watch == {}
