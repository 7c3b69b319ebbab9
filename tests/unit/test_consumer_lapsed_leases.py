"""A message whose lease ended in user code is left to the tracker: consumer.auto_renew stops
renewing it. Before, the keeper went on renewing it after the consumer had given it up, so
after an abandon (a handler that gave up, ``kmq work --hang-rate``) the tracker saw a RENEW
every few seconds and redelivered nothing until consumer.max_lease (10 minutes by default).

The consumer's own step (``KmqConsumer._expire_leases``) over its real parts, without Kafka.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from kmq.consumer.ack_buffer import AckBuffer
from kmq.consumer.consumer import KmqConsumer
from kmq.consumer.flow import FlowControl, FlowLimits
from kmq.consumer.lease_expiry import LeaseExpiry
from kmq.consumer.leases import LateSettler
from kmq.consumer.ready_queue import ReadyQueue
from kmq.core.lease import SETTLED_WITHIN, LeaseSchedule
from kmq.core.message import KmqMessage, unsettled
from kmq.telemetry.metrics import ConsumerMetrics
from tests.helpers.messages import Recorder

LEASE = 1.0


def _consumer(schedule: LeaseSchedule) -> SimpleNamespace:
    buffer = AckBuffer()
    return SimpleNamespace(
        _ready=ReadyQueue(), _expiry=LeaseExpiry(LEASE), _lock=threading.Lock(), _inflight=defaultdict(int),
        _late=LateSettler("q", LEASE, buffer), _schedule=schedule, _keys=None, _tracing=None,
        _expired_logged=False, flow=FlowControl(FlowLimits(lease=LEASE), now=0.0),
        metrics=ConsumerMetrics(CollectorRegistry()), queue=SimpleNamespace(name="q"), buffer=buffer)


def test_a_message_whose_lease_ended_in_user_code_is_no_longer_renewed_automatically():
    schedule = LeaseSchedule(LEASE, 600.0, 0.25)
    c = _consumer(schedule)
    msg = KmqMessage("q", 0, 7, None, b"v", [], 0, None, c._lock)
    schedule.track(msg, 0.0)  # the consumer's schedule keys are its messages
    c._inflight[0] = 1
    c._ready.put([msg], leased_at=0.0)
    assert c._ready.take(0.0, 1, lambda: False)[0] is msg  # handed over; its lease started at 0.0
    KmqConsumer._expire_leases(c, 0.1)  # the fetcher records what was taken
    KmqConsumer._expire_leases(c, 5.0)  # nobody renewed it in time: the consumer gives it up
    assert c._inflight[0] == 0 and msg._settler is c._late
    assert msg not in schedule  # so the keeper renews it no more


def test_a_batch_is_tracked_for_renewal_only_if_unsettled_just_after_user_code_took_it():
    schedule = LeaseSchedule(LEASE, 600.0, 0.25, unsettled=unsettled)
    c = _consumer(schedule)
    batch = [KmqMessage("q", 0, o, None, b"v", [], 0, Recorder(), c._lock) for o in range(4)]
    schedule.track_soon(batch, 0.0, 0.0, until_taken=True)  # as the hand-over does
    c._ready.put(batch, leased_at=0.0)
    schedule.look(0.2)
    assert not schedule.tracked  # waiting to be taken: not looked at (nothing settles meanwhile)
    taken = c._ready.take(0.0, 2, lambda: False)  # poll(max_records): the batch in parts
    KmqConsumer._expire_leases(c, 0.2)  # the fetcher tells the schedule what was taken
    schedule.look(0.3)
    assert not schedule.tracked  # the grace starts at the take of the batch's last message
    taken += c._ready.take(0.0, 2, lambda: False)
    KmqConsumer._expire_leases(c, 0.3)
    for m in taken[:3]:
        m.ack()
    schedule.look(0.3 + SETTLED_WITHIN)
    assert list(schedule.tracked) == [batch[3]]  # only the one still unsettled costs an entry
