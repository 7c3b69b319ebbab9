"""A rolling restart of 2 real `kmq tracker run` processes while leases keep
expiring: every expired message is still redelivered (nothing lost), and no
redelivery comes later than the documented bound (docs/operations.md,
"Restarts and upgrades").

* static membership (``tracker.instance_id``): a restarted tracker gets its
  own partitions back without a group rebalance; the other tracker's
  partitions never pause. Bound: ``kafka.session_timeout``.
* dynamic membership (the default): every stop and start rebalances the whole
  group; both trackers' partitions pause. Bound: 2 x ``kafka.session_timeout``
  plus catch-up (measured side by side here; the figures are printed).

Lateness of a redelivery = the copy's timestamp minus the due time (START
marker time + lease); a few ticks when no tracker restarts.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from kmq.config import parse_duration
from kmq.core.markers import Start
from tests.helpers.kafka import produce, wait_until
from tests.integration.tracker_util import MarkerProducer, Tail, TrackerProcess, headers

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

LEASE_MS = 1000
PARTITIONS = 2


class LeaseFeeder:
    """Produces one message per partition and its START marker every ``interval`` (never acked)."""

    def __init__(self, bootstrap: str, queue, interval: float = 0.2) -> None:
        self.bootstrap, self.queue, self.interval = bootstrap, queue, interval
        self.markers = MarkerProducer(bootstrap, queue.markers_topic)
        self.due: dict[str, int] = {}  # origin "topic/partition/offset" -> due time (ms)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "LeaseFeeder":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in range(PARTITIONS):
                (meta,) = produce(self.bootstrap, self.queue.name, 1, partition=p)
                m = self.markers.send(p, Start([(meta.offset, 1)], lease_ms=LEASE_MS, owner="feeder"))
                self.due[f"{self.queue.name}/{p}/{meta.offset}"] = m.timestamp + LEASE_MS
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.markers.close()


def rolling_restart(cfg, tmp_path, static: bool) -> dict[int, float]:
    """Run 2 trackers, restart them one after the other; return the max lateness (s) per partition."""
    def config(i: int):
        tracker = dataclasses.replace(cfg.tracker, instance_id=f"tracker-{i}" if static else None)
        return cfg.replace(tracker=tracker)

    q = cfg.queues[0]
    trackers = [TrackerProcess(config(i), tmp_path) for i in range(2)]
    feeder = tail = None
    try:
        for t in trackers:
            t.wait_ready(60)
        tail = Tail(cfg.kafka.bootstrap_servers, q.name, partitions=range(PARTITIONS))
        feeder = LeaseFeeder(cfg.kafka.bootstrap_servers, q).start()
        seen: dict[str, int] = {}

        def redelivered() -> dict[str, int]:
            for rec in tail.poll():
                origin = headers(rec).get("kmq-origin")
                if origin is not None and origin not in seen:
                    seen[origin] = rec.timestamp
            return seen

        # Steady state before the restart: both partitions redelivering.
        wait_until(lambda: {o.split("/")[1] for o in redelivered()} == {str(p) for p in range(PARTITIONS)}, 30,
                   what="redeliveries on every partition")
        for i in range(2):
            assert trackers[i].terminate(30) == 0
            trackers[i].close()
            trackers[i] = TrackerProcess(config(i), tmp_path)
            trackers[i].wait_ready(60)
        feeder.stop()
        wanted = dict(feeder.due)
        wait_until(lambda: set(wanted) <= set(redelivered()), 60,
                   what=f"a redelivery of each of the {len(wanted)} expired messages")
        late: dict[int, float] = {}
        for origin in wanted:
            ts = seen[origin]
            p = int(origin.split("/")[1])
            late[p] = max(late.get(p, 0.0), (ts - wanted[origin]) / 1000)
        return late
    finally:
        if feeder is not None and not feeder._stop.is_set():
            feeder.stop()
        if tail is not None:
            tail.close()
        for t in trackers:
            t.close()


def test_rolling_restart_with_static_membership_keeps_redelivery_within_the_session_timeout(
        queue_topics, tmp_path, skip_on_tansu):
    skip_on_tansu("tansu 0.6 does not implement static membership (KIP-345): a member rejoining with its "
                  "group.instance.id starts rebalances that never settle (measured with kafka-python 3.0.12)")
    cfg, _ = queue_topics(PARTITIONS, queue={"lease": "1s", "max_deliveries": 1000})
    session = cfg.kafka.session_timeout
    late = rolling_restart(cfg, tmp_path, static=True)
    print(f"static membership: max lateness per partition {late} s (bound {session:g} s)")
    assert max(late.values()) <= session, late


def test_rolling_restart_with_dynamic_membership_loses_nothing_within_two_session_timeouts(queue_topics, tmp_path):
    cfg, _ = queue_topics(PARTITIONS, queue={"lease": "1s", "max_deliveries": 1000})
    session = cfg.kafka.session_timeout
    late = rolling_restart(cfg, tmp_path, static=False)
    print(f"dynamic membership: max lateness per partition {late} s (bound {2 * session:g} s + catch-up)")
    assert set(late) == set(range(PARTITIONS))
    assert max(late.values()) <= 2 * session + parse_duration("5s"), late
