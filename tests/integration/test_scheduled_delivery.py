"""Scheduled delivery (``kmq-not-before``) against a real broker and a real tracker.

A message produced with :func:`kmq.schedule` reaches user code no earlier than its time and, here,
no later than its time plus ``BOUND`` seconds (measured against the wall clock), with delivery
count 1, although the tracker and the worker were restarted while it waited.
"""

from __future__ import annotations

import time

import pytest

import kmq
from kmq.client.kafka_python import clients
from kmq.consumer.consumer import KmqConsumer
from kmq.core.markers import Nack, decode
from kmq.ops.status import collect
from kmq.ops.trace_reader import trace
from tests.helpers.kafka import read_all, wait_until
from tests.integration.tracker_util import running_tracker

pytestmark = pytest.mark.integration

#: The delay of each try: the message must still be waiting when the tracker and the worker are up
#: again. On a loaded machine the first run and the restarts can take longer than the first delay;
#: the scenario then runs again, on a new queue, with the next one.
DELAYS = (12.0, 24.0, 48.0)
#: Seconds after its time within which the message must reach user code. What it is made of: the
#: tracker's tick and copy (well under 1 s), a restarted tracker's catch-up (a replayed NACK counts
#: from when it was read, at most 60 s after it was written: here the restart takes a few seconds),
#: and the worker's fetch, START and commit of the copy. Generous for a loaded 2-core test machine.
BOUND = 30.0


class _DueBeforeRestarted(Exception):
    """The message came due before the tracker and the worker were up again: this try proves nothing."""


def _uncounted_nacks(bootstrap: str, markers_topic: str) -> list:
    return [mk for r in read_all(bootstrap, markers_topic, timeout=2)
            if isinstance(mk := decode(r.value), Nack) and not mk.counted]


def _scheduled_across_restarts(queue_topics, bootstrap: str, kafka_client: str, delay: float) -> None:
    """One try: schedule a message ``delay`` seconds ahead, restart the tracker and the worker
    while it waits, check it arrives after its time. Raises :class:`_DueBeforeRestarted` when the
    restarts were not done before its time."""
    cfg, q = queue_topics(partitions=1, queue={"lease": "30s", "backoff": {"initial": "100ms"}},
                          consumer={"ack_flush_interval": "50ms"}, kafka={"client": kafka_client})
    headers = kmq.schedule(delay)
    due_ms = int(headers[0][1])
    p = clients.producer(cfg.kafka)
    p.send(q.name, key=b"later", value=b"scheduled", headers=headers + [("app", b"kept")])
    p.send(q.name, key=b"now", value=b"plain")
    p.flush()
    p.close()

    def still_waiting(step: str, margin_ms: float = 0) -> None:
        late_ms = time.time() * 1000 - (due_ms - margin_ms)
        if late_ms >= 0:
            raise _DueBeforeRestarted(f"{step} {late_ms / 1000:.1f}s too late for a delay of {delay:g}s")

    got: list = []

    def poll(c: KmqConsumer) -> None:
        for m in c.poll(timeout=0.2):
            got.append((m.value, m.delivery_count, time.time() * 1000, dict(m.headers)))
            m.ack()

    with running_tracker(cfg):
        with KmqConsumer(cfg, queue=q.name) as c:
            # The plain message comes at once; the scheduled one is STARTed and given back until its time.
            # Or its time came first (a loaded machine): then this try is over, checked below.
            wait_until(lambda: poll(c) or (got and _uncounted_nacks(bootstrap, q.markers_topic))
                       or len(got) >= 2 or time.time() * 1000 >= due_ms, 30,
                       what="the plain message, and the scheduled one given back")
    assert not [g for g in got if g[0] == b"scheduled" and g[2] < due_ms], "delivered before its time"
    still_waiting("the first tracker and worker stopped")
    assert [g[:2] for g in got] == [(b"plain", 1)]
    [held] = _uncounted_nacks(bootstrap, q.markers_topic)
    assert abs(held.delay_ms - (due_ms - time.time() * 1000)) < delay * 1000
    [t] = trace(cfg, q.name, origin=f"{q.name}/0/0", tracker_group=cfg.tracker.group_id,
                workers_group=cfg.consumer.group_id)
    scheduled = [r.scheduled for r in collect(cfg, q.name)]  # kmq status
    still_waiting("the restarts began", margin_ms=1000)  # trace and status ran before its time, too
    assert t.state == "scheduled", t.to_dict()
    assert scheduled == [1]

    # Tracker and worker restarted while it waits: the NACK in the markers keeps the schedule.
    with running_tracker(cfg), KmqConsumer(cfg, queue=q.name) as c:
        still_waiting("the tracker and the worker were up again")
        wait_until(lambda: poll(c) or len(got) >= 2, delay + BOUND + 30, what="the scheduled message")
        wait_until(lambda: c.in_flight() == {}, 30, what="the ack")
    value, count, arrived_ms, seen_headers = got[1]
    assert value == b"scheduled" and count == 1
    assert due_ms <= arrived_ms <= due_ms + BOUND * 1000, f"arrived {(arrived_ms - due_ms) / 1000:+.1f}s from its time"
    assert seen_headers["app"] == b"kept" and seen_headers["kmq-delivery-count"] == b"1"
    assert read_all(bootstrap, q.dlq_topic, timeout=2) == []


def test_a_scheduled_message_arrives_after_its_time_with_delivery_count_1_across_restarts(
        queue_topics, bootstrap, kafka_client):
    missed = []
    for delay in DELAYS:
        try:
            _scheduled_across_restarts(queue_topics, bootstrap, kafka_client, delay)
            return
        except _DueBeforeRestarted as exc:
            missed.append(str(exc))
    raise AssertionError(f"the restarts never happened before the message was due: {missed}")
