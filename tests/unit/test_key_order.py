"""kmq.core.key_order: which ready message may go to user code (consumer.ordering: key)."""

from __future__ import annotations

from hypothesis import example, given, settings, strategies as st

from kmq.core.key_order import KeyOrder, Released


def order_with(*msgs: tuple[int, bytes | None]) -> KeyOrder:
    """Messages (offset, key) of partition 0, added in offset order; the item is the offset."""
    o: KeyOrder = KeyOrder()
    for off, key in msgs:
        o.add(off, 0, off, key)
    return o


def test_one_message_per_key_at_a_time_in_offset_order():
    o = order_with((0, b"a"), (1, b"b"), (2, b"a"), (3, b"a"), (4, b"b"))
    assert o.take(10) == [0, 1]  # the first of each key; 2, 3, 4 held
    assert o.held == 3 and o.blocked_keys() == 2
    assert o.take(10) == []
    o.settled(0, 0, final=True)
    assert o.take(10) == [2]
    o.settled(0, 1, final=True)
    o.settled(0, 2, final=True)
    assert o.take(10) == [4, 3]  # in the order they became free
    assert o.held == 0


def test_null_keys_are_each_their_own_key():
    o = order_with((0, None), (1, None), (2, b"a"))
    assert o.take(10) == [0, 1, 2]
    assert o.held == 0 and o.blocked_keys() == 0


def test_different_partitions_are_different_keys():
    o: KeyOrder = KeyOrder()
    o.add("p0", 0, 5, b"a")
    o.add("p1", 1, 5, b"a")
    assert o.take(10) == ["p0", "p1"]


def test_a_nacked_message_blocks_its_key_until_its_copy_which_goes_first():
    o = order_with((0, b"a"), (1, b"a"), (2, b"b"))
    assert o.take(10) == [0, 2]
    o.settled(0, 0, final=False, deadline=100.0)  # nacked: the tracker copies it
    assert o.take(10) == []  # 1 waits for the copy of 0
    assert o.state_of(0, b"a") == (None, 0)
    o.add("copy-of-0", 0, 7, b"a", origin=0)
    assert o.take(10) == ["copy-of-0"]  # ahead of 1, though it came after it
    o.settled(0, 7, final=True)
    assert o.take(10) == [1]


def test_a_copy_that_fails_again_keeps_the_key_blocked():
    o = order_with((0, b"a"), (1, b"a"))
    o.take(1)
    o.settled(0, 0, final=False, deadline=100.0)
    o.add("c1", 0, 5, b"a", origin=0)
    assert o.take(5) == ["c1"]
    o.settled(0, 5, final=False, deadline=200.0)
    assert o.take(5) == []
    o.add("c2", 0, 6, b"a", origin=0)
    assert o.take(5) == ["c2"]
    o.settled(0, 6, final=True)  # e.g. dead-lettered at its last delivery: the rest go on
    assert o.take(5) == [1]


def test_a_copy_that_arrives_while_its_original_is_still_out_goes_first():
    o = order_with((0, b"a"), (1, b"a"))
    assert o.take(5) == [0]
    o.add("copy", 0, 9, b"a", origin=0)  # the tracker's clock ran out before ours
    o.settled(0, 0, final=False, deadline=50.0)
    assert o.take(5) == ["copy"]


def test_the_wait_for_a_copy_is_bounded():
    o = order_with((0, b"a"), (1, b"a"))
    o.take(1)
    o.settled(0, 0, final=False, deadline=30.0)
    assert o.expire(29.9) == []
    assert o.take(5) == []
    assert o.expire(30.0) == [Released(0, b"a", 0)]
    assert o.take(5) == [1]
    o.settled(0, 1, final=True)
    o.add("late copy", 0, 9, b"a", origin=0)  # not awaited any more: an ordinary message
    assert o.take(5) == ["late copy"]


def test_a_late_ack_of_an_expired_message_releases_its_key():
    o = order_with((0, b"a"), (1, b"a"))
    o.take(1)
    o.settled(0, 0, final=False, deadline=30.0)  # its lease ran out in user code
    assert o.settled_late(0, b"a", 0)
    assert o.take(5) == [1]
    assert not o.settled_late(0, b"a", 0)


def test_a_key_with_nothing_left_is_forgotten():
    o = order_with((0, b"a"))
    o.take(1)
    o.settled(0, 0, final=True)
    assert o._keys == {} and o._out == {}


def test_settling_a_message_never_taken_is_ignored():
    o = order_with((0, b"a"))
    assert not o.settled(0, 0, final=True)
    assert o.take(1) == [0]


# ------------------------------------------------------------------ the model
# A partition's log with keys; handlers take, then ack, nack (-> the tracker appends a copy
# later) or reject at random; a key may be released by its deadline. Per key, the messages
# settled for good (by origin) come in offset order unless a deadline released the key, never two
# of a key are out at once, and once the copies are in and everything is acked, nothing is lost.

ops = st.lists(st.tuples(st.sampled_from(["add", "take", "ack", "nack", "reject", "copy", "expire"]),
                         st.integers(0, 3), st.integers(0, 50)), max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops)
# A key released by its deadline while awaiting the copy of 0, then 1 failed too: the copy of 0 came
# first and sorts first. It used to wait for the copy of 1 behind it, so the key was stuck until the
# next deadline.
@example(script=[("add", 1, 0), ("add", 1, 0), ("take", 0, 1), ("nack", 0, 0), ("expire", 0, 9), ("take", 0, 1),
                 ("nack", 0, 0)])
def test_model_per_key_order_and_nothing_lost(script):
    o: KeyOrder = KeyOrder()
    log: list[tuple[bytes, int]] = []  # offset -> (key, origin)
    out: dict[int, tuple[bytes, int]] = {}  # offset out in user code -> (key, origin)
    copies_due: list[tuple[bytes, int]] = []
    done: dict[bytes, list[int]] = {}  # key -> origins settled for good, in order
    released: set[bytes] = set()  # keys a deadline released (order may break there, by design)
    now = 0.0

    def append(key: bytes, origin: int | None) -> None:
        off = len(log)
        log.append((key, off if origin is None else origin))
        o.add(off, 0, off, key, origin)

    def take(n: int) -> None:
        for off in o.take(n):
            key, origin = log[off]
            assert key not in {k for k, _ in out.values()}, "two messages of one key out at once"
            out[off] = (key, origin)

    def settle(i: int, final: bool) -> None:
        if not out:
            return
        off = sorted(out)[i % len(out)]
        key, origin = out.pop(off)
        o.settled(0, off, final, deadline=now + 10)
        if final:
            done.setdefault(key, []).append(origin)
        else:
            copies_due.append((key, origin))

    for op, k, n in script:
        now += 1
        key = b"k%d" % k
        if op == "add":
            append(key, None)
        elif op == "take":
            take(n)
        elif op in ("ack", "reject"):
            settle(n, True)
        elif op == "nack":
            settle(n, False)
        elif op == "copy" and copies_due:
            append(*copies_due.pop(n % len(copies_due)))
        elif op == "expire":
            now += n
            released.update(r.key for r in o.expire(now))
    # Drain: copies arrive, everything is acked.
    for _ in range(len(log) * 2 + 10):
        while copies_due:
            append(*copies_due.pop(0))
        take(1000)
        for off in list(out):
            settle(sorted(out).index(off), True)
    assert not out and o.held == 0 and o.ready == 0
    firsts = {off for off, (_, origin) in enumerate(log) if origin == off}
    assert sorted(x for origins in done.values() for x in origins) == sorted(firsts), "lost or duplicated"
    for key, origins in done.items():
        if key not in released:
            assert origins == sorted(origins), f"{key!r} settled out of order: {origins}"


def test_a_copy_that_arrives_before_its_original_was_handed_goes_right_after_it():
    o = order_with((0, b"a"), (1, b"a"))
    o.add("copy", 0, 9, b"a", origin=0)  # e.g. the original was given back and its START's lease ran out
    assert o.take(5) == [0]
    o.settled(0, 0, final=False, deadline=50.0)
    assert o.take(5) == ["copy"]
    o.settled(0, 9, final=True)
    assert o.take(5) == [1]


def test_a_late_copy_goes_before_the_later_messages_still_waiting():
    o = order_with((0, b"a"), (5, b"a"), (6, b"a"))
    assert o.take(5) == [0]
    o.settled(0, 0, final=True)  # 5 is runnable now
    o.add("late copy of 2", 0, 9, b"a", origin=2)
    assert o.take(5) == ["late copy of 2"]


ops_with_zombies = st.lists(st.tuples(
    st.sampled_from(["add", "take", "ack", "nack", "copy", "early_copy", "lapse", "late_ack", "expire"]),
    st.integers(0, 2), st.integers(0, 50)), max_size=150)


@settings(max_examples=300, deadline=None)
@given(ops_with_zombies)
def test_model_with_early_copies_and_late_acks_keeps_first_completions_in_order(script):
    """Also: copies of messages not handed yet (a give-back whose START lapsed), leases that run out
    in user code (the handler goes on: a zombie) and late acks. Duplicates are allowed; per key the
    first final settlement of each origin comes in origin order (no deadline release here) and
    every origin is settled for good."""
    o: KeyOrder = KeyOrder()
    log: list[tuple[bytes, int]] = []
    out: dict[int, tuple[bytes, int]] = {}
    zombies: dict[int, tuple[bytes, int]] = {}
    copies_due: list[tuple[bytes, int]] = []
    first_done: dict[bytes, list[int]] = {}
    done: set[int] = set()

    def append(key: bytes, origin: int | None) -> None:
        off = len(log)
        log.append((key, off if origin is None else origin))
        o.add(off, 0, off, key, origin)

    def finish(key: bytes, origin: int) -> None:
        if origin not in done:
            done.add(origin)
            first_done.setdefault(key, []).append(origin)

    def pick(d: dict, i: int) -> int | None:
        return sorted(d)[i % len(d)] if d else None

    for op, k, n in script:
        key = b"k%d" % k
        if op == "add":
            append(key, None)
        elif op == "take":
            for off in o.take(n):
                assert log[off][0] not in {kk for kk, _ in out.values()}, "two of one key out at once"
                out[off] = log[off]
        elif op == "ack" and out:
            off = pick(out, n)
            kk, origin = out.pop(off)
            o.settled(0, off, True)
            finish(kk, origin)
        elif op == "nack" and out:
            off = pick(out, n)
            kk, origin = out.pop(off)
            o.settled(0, off, False, deadline=1e9)
            copies_due.append((kk, origin))
        elif op == "lapse" and out:  # the lease ran out; the handler goes on; the tracker copies it
            off = pick(out, n)
            zombies[off] = out.pop(off)
            o.settled(0, off, False, deadline=1e9)
            copies_due.append(zombies[off])
        elif op == "late_ack" and zombies:
            kk, origin = zombies.pop(pick(zombies, n))
            o.settled_late(0, kk, origin)
            finish(kk, origin)
        elif op == "copy" and copies_due:
            append(*copies_due.pop(n % len(copies_due)))
        elif op == "early_copy":
            waiting = [i for i in range(len(log)) if i not in out and log[i][1] not in done
                       and log[i][0] == key and log[i][1] == i]
            if waiting:
                append(key, waiting[0])
        elif op == "expire":
            assert o.expire(0.0) == []  # deadlines are far: nothing released by time here
    for _ in range(len(log) * 3 + 10):
        while copies_due:
            append(*copies_due.pop(0))
        for off in o.take(10_000):
            out[off] = log[off]
        for off in sorted(out):
            kk, origin = out.pop(off)
            o.settled(0, off, True)
            finish(kk, origin)
        for off in sorted(zombies):
            kk, origin = zombies.pop(off)
            o.settled_late(0, kk, origin)
            finish(kk, origin)
    assert o.held == 0 and o.ready == 0
    assert done == {i for i, (_, origin) in enumerate(log) if origin == i}, "an origin never settled for good"
    for key, origins in first_done.items():
        assert origins == sorted(origins), f"{key!r}: first completions out of order: {origins}"


def test_a_held_partition_hands_nothing_of_a_key_until_it_is_inherited():
    o: KeyOrder = KeyOrder()
    o.hold(0)
    o.add(10, 0, 10, b"a")
    o.add(11, 0, 11, b"b")
    o.add("n", 0, 12, None)
    o.add("p1", 1, 10, b"a")
    assert o.take(10) == ["n", "p1"]  # null keys and other partitions are not held
    assert o.held == 2
    assert o.inherit(0, {b"a": [3]}, deadline=50.0) == 1
    assert o.take(10) == [11]  # b inherited nothing; a waits for the copy of 3
    assert o.inherited_keys() == 1 and o.inherited_origins(0) == {3}
    o.add("copy-of-3", 0, 13, b"a", origin=3)
    assert o.take(10) == ["copy-of-3"]  # the earlier owner's message first
    assert o.inherited_keys() == 0
    o.settled(0, 13, final=True)
    assert o.take(10) == [10]


def test_an_inherited_origin_settled_in_the_markers_releases_its_key():
    o: KeyOrder = KeyOrder()
    o.hold(0)
    o.add(10, 0, 10, b"a")
    o.inherit(0, {b"a": [3, 5]}, deadline=50.0)
    assert o.take(10) == []
    assert o.inherited_settled(0, b"a", 5) and o.take(10) == []  # 3 still open
    assert not o.inherited_settled(0, b"a", 5)
    assert o.inherited_settled(0, b"a", 3)
    assert o.take(10) == [10]


def test_copies_of_inherited_origins_go_in_origin_order():
    o: KeyOrder = KeyOrder()
    o.hold(0)
    o.inherit(0, {b"a": [3, 5]}, deadline=50.0)
    o.add(10, 0, 10, b"a")
    o.add("copy-of-5", 0, 11, b"a", origin=5)
    assert o.take(10) == []  # 3 first
    o.add("copy-of-3", 0, 12, b"a", origin=3)
    assert o.take(10) == ["copy-of-3"]
    o.settled(0, 12, final=True)
    assert o.take(10) == ["copy-of-5"]
    o.settled(0, 11, final=True)
    assert o.take(10) == [10]


def test_the_wait_for_an_inherited_origin_is_bounded():
    o: KeyOrder = KeyOrder()
    o.hold(0)
    o.add(10, 0, 10, b"a")
    o.inherit(0, {b"a": [3], b"z": [4]}, deadline=50.0)
    assert o.expire(49.0) == [] and o.take(10) == []
    assert sorted(o.expire(50.0), key=lambda r: r.key) == [Released(0, b"a", 3), Released(0, b"z", 4)]
    assert o.take(10) == [10]
    assert o.inherited_keys() == 0 and o.blocked_keys() == 0


def test_a_message_of_this_owner_inherited_from_itself_is_released_by_its_own_ack():
    o = order_with((3, b"a"), (4, b"a"))
    assert o.take(1) == [3]  # out in user code when the partition is assigned again
    o.hold(0)
    o.inherit(0, {b"a": [3, 4]}, deadline=50.0)
    o.settled(0, 3, final=True)
    assert o.take(10) == [4]  # its own held message is origin 4 itself
    assert o.inherited_keys() == 0
