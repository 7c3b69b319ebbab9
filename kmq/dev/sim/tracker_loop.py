"""The tracker service's own main loop (``tracker.service.Tracker.step``) on a :class:`SimCluster`.

:class:`ServiceTrackerActor` builds a real :class:`~tracker.service.Tracker`
and gives it what ``open`` would build against Kafka, on the simulated
cluster: a markers consumer, the log readers, the producer and the
:class:`~tracker.redeliver.Redeliverer`, and the virtual clock as its wall
and monotonic clocks. So the search also runs the loop around the redelivery
step: applying markers, catch-up, committing marker offsets, the step budget,
and the membership rule (a frozen tracker drops its view and re-reads from
its commits).

A crash (``crash_at``, drawn by the world) loses the process: its producer's
unsent records and all in-memory state; it comes back ``down_for`` seconds
later and replays the markers from its committed offsets.

What is modelled instead: the markers partitions are assigned to the tracker
(no group, no rebalance listener), and the pause watch is answered from the
fault plan's :class:`~kmq.dev.sim.faults.MemberPause` spans of the tracker
(what the real watch thread would have seen).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from kmq.client.api import Partition
from kmq.dev.sim.consumer import SimConsumer
from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.downtime import Downtime
from tracker import service
from tracker.membership import MembershipCheck

__all__ = ["ServiceTrackerActor", "MarkersConsumer", "FaultPlanPauses"]

_MAX_POLL_INTERVAL_S = 300.0


class FaultPlanPauses:
    """Answers the pause watch's question from the fault plan: the longest freeze of ``name`` that
    ended after ``since`` (or is going on now)."""

    def __init__(self, cluster: SimCluster, name: str) -> None:
        self.cluster = cluster
        self.spans = cluster.faults.frozen_spans(name)

    def longest_since(self, since: float) -> float:
        now = self.cluster.clock.monotonic()
        return max((min(until, now) - at for at, until in self.spans if until > since and at < now), default=0.0)


class MarkersConsumer:
    """The markers consumer as ``Tracker.step`` calls it through the client seam
    (:class:`~kmq.client.api.GroupConsumerAdapter`): a :class:`SimConsumer` that is assigned every
    markers partition and commits to ``group``, plus the group look-ups the tracker makes."""

    def __init__(self, cluster: SimCluster, name: str, group: str) -> None:
        self.cluster = cluster
        self.group = group
        self.sim = SimConsumer(cluster, name, group_id=group)

    def assign(self, tps: list[Partition]) -> None:
        self.sim.assign(list(tps), offsets={})

    def fetch(self, timeout: float, max_records: int) -> list:
        return self.sim.fetch(timeout, max_records)

    def committed(self, tps: list[Partition]) -> dict[Partition, int | None]:
        return {tp: self.cluster.groups.committed(self.group, tp) for tp in tps}

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self.sim.seek(topic, partition, offset)

    def seek_to_beginning(self, tps: list[Partition]) -> None:
        for topic, partition in tps:
            self.sim.seek(topic, partition, self.cluster.log(topic, partition).log_start)

    def position(self, topic: str, partition: int) -> int | None:
        return self.sim.position(topic, partition)

    def highwater(self, topic: str, partition: int) -> int | None:
        return self.sim.highwater(topic, partition)

    def commit(self, offsets: dict[Partition, int]) -> None:
        self.sim.commit(dict(offsets))  # a fenced commit raises ClientCommitFailed(rebalanced=True), as the seam does

    def close(self) -> None:
        self.sim.close()


class ServiceTrackerActor:
    """``Tracker.step`` as an actor of :class:`~kmq.dev.sim.world.World` (same interface as its
    ``TrackerActor``: ``states``, ``max_in_flight``, ``busy``)."""

    interval = 0.05

    def __init__(self, world: Any, reader: Any, hw_reader: Any, new_producer: Any, new_redeliverer: Any,
                 name: str = "tracker", crash_at: float | None = None, down_for: float = 2.0) -> None:
        self.world = world
        self.name = name
        self.wake = 0.0
        self._parts = (reader, hw_reader, new_producer, new_redeliverer)
        self.crash_at, self.down_for = crash_at, down_for
        self.downtime = Downtime()
        self.incarnation = 0
        self.max_in_flight: dict[int, int] = {}
        self.crashes: list[float] = []  # simulated times it was killed
        self.view_drops = 0  # kmq_tracker_stale_views_total, summed over its incarnations
        self._build()

    def _build(self) -> None:
        """A tracker process: nothing in memory, its markers partitions positioned from its commits."""
        world, c = self.world, self.world.cluster
        reader, hw_reader, new_producer, new_redeliverer = self._parts
        self.incarnation += 1
        self.tracker = t = service.Tracker(world.config, registry=CollectorRegistry(),
                                           clock=lambda: c.clock.now_ms() / 1000.0)
        t._mono = c.clock.monotonic
        kafka = world.config.kafka
        t._membership = MembershipCheck(kafka.session_timeout, kafka.heartbeat_interval, _MAX_POLL_INTERVAL_S,
                                        FaultPlanPauses(c, self.name), c.clock.monotonic)  # type: ignore[arg-type]
        t._consumer = self.consumer = MarkersConsumer(c, f"{self.name}#{self.incarnation}", f"{self.name}-group")
        t._reader, t._hw_reader = reader, hw_reader
        t._producer = self.producer = new_producer()
        t._redeliverer = new_redeliverer(self.producer, t.metrics, t._now_ms)
        t._next_commit = t._next_metrics = 0.0
        q = world.queue
        tps = [(q.markers_topic, p) for p in range(world.workload.partitions)]
        self.consumer.assign(tps)
        t._on_assigned(set(tps))

    def _restart(self) -> None:
        self._build()
        self.world.cluster.record(f"world tracker restarted as tracker#{self.incarnation}")

    def _crash(self) -> None:
        """SIGKILL: what the producer holds is lost (unwritten sends never happen), the state is gone."""
        c = self.world.cluster
        c.record(f"world tracker#{self.incarnation} crashes")
        self.crashes.append(c.t())
        self.view_drops += self._view_drops()
        self.producer.close(timeout=0.0)
        self.crash_at = None
        self.downtime.crashed(c.t(), self.down_for)

    @property
    def states(self) -> dict:
        """Each markers partition's :class:`PartitionState` (the current one: a dropped view is replaced)."""
        return {tp[1]: o.state for tp, o in self.tracker._owned.items()}

    def step(self) -> None:
        c = self.world.cluster
        if not self.downtime.up(c.t(), self._restart):
            return
        if self.crash_at is not None and c.t() >= self.crash_at:
            self._crash()
            return
        self.tracker.step(0.0)
        for p, state in self.states.items():
            self.max_in_flight[p] = max(self.max_in_flight.get(p, 0), state.in_flight)

    def _view_drops(self) -> int:
        return int(self.tracker.metrics.registry.get_sample_value("kmq_tracker_stale_views_total") or 0)

    def views_dropped(self) -> int:
        """Times the tracker dropped its view so far (the metric, over every incarnation)."""
        return self.view_drops + (0 if self.downtime.down else self._view_drops())

    def busy(self) -> bool:
        if self.downtime.down or self.crash_at is not None:
            return True
        owned = self.tracker._owned.values()
        return any(not o.caught_up or o.state.in_flight for o in owned)
