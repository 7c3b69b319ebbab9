"""kmq.consumer.lease_expiry: a message whose lease ended in user code, unsettled, leaves flow
control (pure, time passed in). Before it, a handler that let 30 % of its messages time out
stopped its consumer for good once the unsettled ones filled the bound."""

from __future__ import annotations

import threading

from kmq.consumer.ack_buffer import AckBuffer
from kmq.consumer.flow import FlowControl, FlowLimits
from kmq.consumer.lease_expiry import LeaseExpiry
from kmq.consumer.leases import LateSettler
from kmq.core.markers import End, Nack
from kmq.core.message import KmqMessage

LOCK = threading.Lock()


class NoSettler:
    """The settler is not part of this test: a settlement only marks the message settled."""

    def settled(self, msg, outcome, arg) -> None:
        pass


def msgs(first: int, n: int, partition: int = 0) -> list[KmqMessage]:
    return [KmqMessage("q", partition, o, None, b"v", [], 0, NoSettler(), LOCK) for o in range(first, first + n)]


def settle(messages) -> None:
    for m in messages:
        m.ack()


def simulate(seconds: float, with_expiry: bool, lease: float = 2.0, unsettled_every: int = 3) -> int:
    """A consumer loop at 10 steps a second: fetch what flow control allows, let user code take it,
    settle all but every ``unsettled_every``-th message (the rest is left to time out). Returns
    how many messages were fetched."""
    fc = FlowControl(FlowLimits(lease=lease, max_messages=100, min_messages=100), now=0.0)
    expiry = LeaseExpiry(lease)
    fetched, t, offset = 0, 0.0, 0
    while t < seconds:
        room = fc.fetchable(t, partition_room=10_000, fetch_size=100, partition_cap=10_000)
        if room:
            batch = msgs(offset, room)
            offset += room
            fc.taken(room, room, t)
            fc.handed(room, t)
            expiry.handed(batch, 0, room, t, t)
            done = [m for m in batch if m.offset % unsettled_every]
            settle(done)
            fc.settled(len(done), len(done), t + 0.05)
            fetched += room
        t += 0.1
        if with_expiry:
            gone = expiry.expired(t)
            fc.expired(len(gone), len(gone), t)
    return fetched


def test_without_expiry_unsettled_messages_fill_the_bound_and_fetching_stops_for_good():
    assert simulate(30.0, with_expiry=False) == simulate(60.0, with_expiry=False)


def test_with_expiry_fetching_goes_on_at_the_rate_the_lease_allows():
    after_30s, after_60s = simulate(30.0, with_expiry=True), simulate(60.0, with_expiry=True)
    assert after_60s > after_30s * 1.8  # still fetching, at about the same pace


def test_an_unsettled_message_expires_once_its_lease_is_over_and_only_once():
    e = LeaseExpiry(lease=2.0, look_after=0.5)
    batch = msgs(0, 4)
    e.handed(batch, 1, 4, leased_at=10.0, now=10.2)  # user code took offsets 1..3
    settle(batch[1:2])
    assert e.expired(11.9) == []
    assert [m.offset for m in e.expired(12.0)] == [2, 3]
    assert e.expired(20.0) == []


def test_only_what_is_still_unsettled_when_first_looked_at_is_kept():
    e = LeaseExpiry(lease=30.0, look_after=0.5)
    batch = msgs(0, 1000)
    e.handed(batch, 0, 1000, leased_at=0.0, now=0.0)
    settle(batch[:990])
    assert e.expired(0.5) == [] and len(e) == 10  # memory follows what user code holds


def test_a_renewed_message_stays_until_its_new_deadline_and_a_settled_one_is_forgotten():
    e = LeaseExpiry(lease=2.0, look_after=0.1)
    batch = msgs(0, 3)
    e.handed(batch, 0, 3, leased_at=0.0, now=0.0)
    e.extend((0, 0), 7.0)  # msg.renew(7) (or consumer.auto_renew)
    e.extend((0, 1), 7.0)
    settle(batch[1:2])
    e.forget((0, 1))
    assert [m.offset for m in e.expired(2.0)] == [2]
    assert e.expired(6.9) == []
    assert [m.offset for m in e.expired(7.0)] == [0]
    assert e.extended == {}


def test_a_message_settled_after_its_lease_ended_still_gets_its_marker():
    buffer = AckBuffer()
    late = LateSettler("q", 2.0, buffer)
    m, n = KmqMessage("q", 0, 5, None, b"v", [], 0, late, LOCK), KmqMessage("q", 0, 6, None, b"v", [], 0, late, LOCK)
    m.ack()  # not an error: to the tracker, a late ack if it redelivered the message meanwhile
    n.nack(1.5)
    markers = [mk for _, mk in buffer.drain().markers]
    assert [[tuple(r) for r in mk.ranges] for mk in markers if isinstance(mk, End)] == [[(5, 1)]]
    assert [(mk.delay_ms, [tuple(r) for r in mk.ranges]) for mk in markers if isinstance(mk, Nack)] == [(1500, [(6, 1)])]
    assert late.settled_late == 2


def test_settled_messages_are_let_go_at_the_first_look_ten_milliseconds_on():
    """What user code took is looked at 10 ms later: a busy consumer's settled messages are not
    held (and visited by the cyclic collector) for a tenth of a second each."""
    e = LeaseExpiry(lease=30.0)
    taken = msgs(0, 1000)
    e.handed(taken, 0, 1000, leased_at=0.0, now=0.0)
    settle(taken[:990])
    e.look(0.005)
    assert len(e) == 1000  # not looked at yet
    e.look(0.010)
    assert len(e) == 10  # only the unsettled ones are kept
