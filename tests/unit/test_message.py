"""KmqMessage settle state: one terminal outcome, renew only while unsettled."""

from __future__ import annotations

import threading

import pytest

from kmq.core.errors import MessageAlreadySettled
from kmq.core.message import KmqMessage, ack_all, delivery_count_of, message_builder, offsets_by_partition, origin_of
from tests.helpers.messages import Recorder, make


@pytest.mark.parametrize(
    "first, second",
    [("ack", "ack"), ("ack", "nack"), ("nack", "reject"), ("reject", "ack"), ("abandon", "ack")],
)
def test_second_terminal_call_raises_and_reports_nothing(first, second):
    rec = Recorder()
    msg = make(settler=rec)
    getattr(msg, first)()
    with pytest.raises(MessageAlreadySettled, match=f"already settled \\({first}\\)"):
        getattr(msg, second)()
    assert rec.calls == [(5, first, {"ack": None, "nack": 0.0, "reject": "", "abandon": None}[first])]
    assert msg.outcome == first and msg.settled


def test_renew_while_unsettled_then_refused_after_ack():
    rec = Recorder()
    msg = make(settler=rec)
    msg.renew()
    msg.renew(lease=60.0)
    msg.ack()
    with pytest.raises(MessageAlreadySettled):
        msg.renew()
    assert rec.calls == [(5, "renew", None), (5, "renew", 60.0), (5, "ack", None)]


def test_arguments_are_validated_before_settling():
    msg = make()
    with pytest.raises(ValueError):
        msg.nack(delay=-1)
    with pytest.raises(ValueError):
        msg.renew(lease=0)
    assert not msg.settled
    msg.nack(delay=2.5)
    msg2 = make()
    msg2.reject("bad payload")
    assert msg2.outcome == "reject"


def test_concurrent_acks_settle_exactly_once():
    rec = Recorder()
    msg = make(settler=rec)
    errors = []
    barrier = threading.Barrier(8)

    def go():
        barrier.wait()
        try:
            msg.ack()
        except MessageAlreadySettled:
            errors.append(1)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rec.calls) == 1 and len(errors) == 7


@pytest.mark.parametrize(
    "headers, count, origin",
    [
        (None, 1, "orders/2/5"),
        ([("kmq-delivery-count", b"3"), ("kmq-origin", b"orders/0/17")], 3, "orders/0/17"),
        ([("kmq-delivery-count", b"junk")], 1, "orders/2/5"),
        ([("other", b"x"), ("kmq-delivery-count", b"0")], 1, "orders/2/5"),
    ],
)
def test_delivery_count_and_origin_from_headers(headers, count, origin):
    msg = make(headers=headers)
    assert msg.delivery_count == count
    assert msg.origin == origin
    assert delivery_count_of(headers) == count
    assert origin_of(headers, "orders", 2, 5) == origin


@pytest.mark.parametrize("given", [None, []])
def test_a_message_without_headers_reads_as_an_empty_list_it_may_change(given):
    msg = make(headers=given)
    # No list is held until ``headers`` is read (one object less per message in flight).
    assert msg._headers is None
    assert msg.headers == [] and msg.delivery_count == 1 and msg.origin == "orders/2/5"
    msg.headers.append(("trace", b"1"))  # the same list on every read, as before
    assert msg.headers == [("trace", b"1")]
    msg.headers = [("kmq-delivery-count", b"2")]
    assert msg.delivery_count == 2


def test_a_message_keeps_the_headers_it_was_given():
    given = [("kmq-delivery-count", b"4")]
    msg = make(headers=given)
    assert msg.headers is given and msg.delivery_count == 4


@pytest.mark.parametrize("key, value, headers", [
    (b"k", b"v" * 10, [("kmq-delivery-count", b"3")]),
    (None, None, None),
    (None, b"", []),
    (b"", b"payload", None),
])
def test_message_builder_makes_what_the_constructor_makes(key, value, headers):
    # The fetcher's builder sets the slots itself (no class call): every slot must come out as the
    # constructor sets it, so a slot added to KmqMessage without the builder fails here.
    settler, lock = Recorder(), threading.Lock()
    built = message_builder(settler, lock)("orders", 2, 7, key, value, headers, 1000)
    made = KmqMessage("orders", 2, 7, key, value, headers, 1000, settler, lock)
    assert type(built) is KmqMessage
    for slot in KmqMessage.__slots__:
        assert getattr(built, slot) == getattr(made, slot), slot
    built.ack()
    assert settler.calls == [(7, "ack", None)] and built.outcome == "ack"


class _Record:
    """A record with accessor methods, as confluent-kafka's ``Message``."""

    def __init__(self, offset: int, key: bytes | None = None, headers: list | None = None, err: object = None) -> None:
        self._offset, self._key, self._headers, self._err = offset, key, headers, err

    def error(self) -> object:
        return self._err

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def headers(self) -> list | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, 1000 + self._offset)


def test_message_builder_many_builds_a_poll_as_build_does_each_and_skips_errors():
    settler, lock = Recorder(), threading.Lock()
    build = message_builder(settler, lock)
    records = [_Record(5), _Record(6, b"k", [("h", b"1")]), _Record(7, err="broken"), _Record(8)]
    failed: list = []
    built = build.many(records, failed.append)  # type: ignore[attr-defined]
    assert records == [] and failed == ["broken"]
    assert [m.offset for m in built] == [5, 6, 8]
    for m, r in zip(built, [_Record(5), _Record(6, b"k", [("h", b"1")]), _Record(8)]):
        made = build(r.topic(), r.partition(), r.offset(), r.key(), r.value(), r.headers(), r.timestamp()[1])
        assert type(m) is KmqMessage
        for slot in KmqMessage.__slots__:
            assert getattr(m, slot) == getattr(made, slot), slot
    built[1].ack()
    assert settler.calls == [(6, "ack", None)]
def test_ack_all_acks_the_unsettled_in_order_and_returns_the_settled_ones():
    rec, lock = Recorder(), threading.Lock()
    msgs = [KmqMessage("orders", 2, o, None, b"v", None, 1000, rec, lock) for o in range(4)]
    msgs[1].reject("bad")
    assert ack_all(msgs) == [msgs[1]]
    assert rec.calls == [(1, "reject", "bad"), (0, "ack", None), (2, "ack", None), (3, "ack", None)]
    assert [m.outcome for m in msgs] == ["ack", "reject", "ack", "ack"]
    assert not lock.locked() and ack_all([]) == []


class _RunRecorder(Recorder):
    """A settler told of a run of plain acks at once (``settled_many``), as KmqConsumer's is."""

    def __init__(self, lock):
        super().__init__()
        self.lock, self.runs = lock, []

    def settled_many(self, msgs):
        assert self.lock.locked() and all(m.outcome == "ack" for m in msgs)  # every outcome set first
        self.runs.append([m.offset for m in msgs])


def test_ack_all_tells_a_settler_with_settled_many_of_its_run_at_once_and_any_other_of_each():
    lock = threading.Lock()
    runs, other = _RunRecorder(lock), Recorder()
    msgs = [KmqMessage("orders", 2, o, None, b"v", None, 1000, runs, lock) for o in range(6)]
    msgs[3] = KmqMessage("orders", 2, 3, None, b"v", None, 1000, other, lock)  # e.g. its lease ended
    msgs[1].reject("bad")
    # settled already, or listed twice: left as they are (the first listing stands)
    assert ack_all(msgs + [msgs[4]]) == [msgs[1], msgs[4]]
    assert runs.runs == [[0, 2, 4, 5]] and runs.calls == [(1, "reject", "bad")]
    assert other.calls == [(3, "ack", None)]
    assert [m.outcome for m in msgs] == ["ack", "reject", "ack", "ack", "ack", "ack"]
    assert not lock.locked()


def test_offsets_by_partition_keeps_each_partitions_order_whether_one_partition_or_interleaved():
    lock, rec = threading.Lock(), Recorder()

    def msgs(*parts_offsets: tuple[int, int]) -> list[KmqMessage]:
        return [KmqMessage("orders", p, o, None, b"v", None, 1000, rec, lock) for p, o in parts_offsets]

    assert offsets_by_partition([]) == {}
    assert offsets_by_partition(msgs((2, 5), (2, 3), (2, 9))) == {2: [5, 3, 9]}
    assert offsets_by_partition(msgs((1, 4), (0, 7), (1, 5), (0, 2))) == {1: [4, 5], 0: [7, 2]}
    assert offsets_by_partition(msgs((1, 4), (0, 7), (1, 5))) == {1: [4, 5], 0: [7]}  # first and last alike
