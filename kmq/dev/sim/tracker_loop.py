"""The tracker service's own main loop (``tracker.service.Tracker.step``) on a :class:`SimCluster`.

:class:`ServiceTrackerActor` builds a real :class:`~tracker.service.Tracker`
as production does: its constructor is given the parts (:class:`TrackerClients`,
a :class:`~kmq.client.parts.ClientFactory` of the simulated cluster's clients;
the virtual clock as its wall and monotonic clocks; :class:`FaultPlanPauses` as
its pause watch), and its :meth:`~tracker.service.Tracker.open` builds the
markers consumer, the log readers, the producer and the
:class:`~tracker.redeliver.Redeliverer` from them. So the search also runs the
loop around the redelivery step: applying markers, catch-up, committing marker
offsets, the step budget, and the membership rule (a frozen tracker drops its
view and re-reads from its commits).

A crash (``crash_at``, drawn by the world) loses the process: its producer's
unsent records and all in-memory state; it comes back ``down_for`` seconds
later and replays the markers from its committed offsets.

What is modelled instead: the markers partitions are assigned to the tracker
when it subscribes (no group, no rebalance), and the pause watch is answered
from the fault plan's :class:`~kmq.dev.sim.faults.MemberPause` spans of the
tracker (what the real watch thread would have seen).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry

from kmq.client.api import ClientCommitFailed, LogReader, Partition
from kmq.client.parts import ClientFactory
from kmq.config import KafkaConfig, QueueConfig
from kmq.dev.sim.consumer import SimConsumer
from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.downtime import Downtime
from kmq.dev.sim.producer import SimProducer
from tracker import service

__all__ = ["ServiceTrackerActor", "MarkersConsumer", "FaultPlanPauses", "TrackerClients"]


class FaultPlanPauses:
    """Answers the pause watch's question from the fault plan: the longest freeze of ``name`` that
    ended after ``since`` (or is going on now). Passed as the tracker's ``pauses``: nothing to
    start or stop, the plan is known in advance."""

    def __init__(self, cluster: SimCluster, name: str) -> None:
        self.cluster = cluster
        self.spans = cluster.faults.frozen_spans(name)

    def start(self) -> None:
        """No thread: the fault plan is the record of pauses."""

    def stop(self) -> None:
        """See :meth:`start`."""

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

    def subscribe(self, topics: Iterable[str], on_assigned: Callable[[set], None], on_revoked: Callable[[set], None],
                  commit_on_revoke: Callable[[set], Mapping[Partition, int]] | None = None,
                  on_commit_failed: Callable[[ClientCommitFailed], None] | None = None) -> None:
        """Every partition of ``topics`` is assigned at once (no group: nothing is ever revoked)."""
        counts = self.cluster.partition_counts()
        tps = [(topic, p) for topic in topics for p in range(counts[topic])]
        self.assign(tps)
        on_assigned(set(tps))

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


class TrackerClients(ClientFactory):
    """What :meth:`~tracker.service.Tracker.open` builds, on the simulated cluster: a
    :class:`MarkersConsumer` per process (``name#incarnation``), a :class:`SimProducer` per
    producer it asks for, and the two log readers it opens, in its order: ``reader`` (the queue's,
    which the search may replace to plant a defect), then ``hw_reader`` (the markers' look-ups).
    Topics are taken as aligned and of unknown ``max.message.bytes`` (the simulated logs take any
    record: ``tracker.max_request_size`` sizes the producer)."""

    def __init__(self, cluster: SimCluster, name: str, reader: LogReader, hw_reader: LogReader) -> None:
        self.cluster = cluster
        self.name = name
        self.incarnation = 0  # the process the next consumer belongs to
        self._readers = itertools.cycle((reader, hw_reader))
        self.producers: list[SimProducer] = []  # those of the current process

    def new_process(self, incarnation: int) -> None:
        """What is built from now on belongs to tracker process ``incarnation``."""
        self.incarnation = incarnation
        self.producers = []

    def group_consumer(self, kafka: KafkaConfig, group_id: str, assignor: str, max_records: int,
                       **overrides: Any) -> Any:
        return MarkersConsumer(self.cluster, f"{self.name}#{self.incarnation}", group_id)

    def producer(self, kafka: KafkaConfig, timeout_s: float | None = None, settle_on_flush: bool = False,
                 **overrides: Any) -> Any:
        # The simulated log keeps records, not batches: the compression has nothing to act on.
        producer = SimProducer(self.cluster, self.name, delivery_timeout=overrides["delivery_timeout"],
                               max_request_size=overrides["max_request_size"])
        self.producers.append(producer)
        return producer

    def open_log_reader(self, kafka: KafkaConfig, timeout_s: float = 10.0, fetch_wait_ms: int = 50,
                        **overrides: Any) -> Any:
        return next(self._readers)

    def require_aligned(self, kafka: KafkaConfig, queue: QueueConfig) -> Any:
        return self.cluster.partition_counts()

    def max_message_bytes(self, kafka: KafkaConfig, names: list[str]) -> dict[str, int | None]:
        return dict.fromkeys(names)


class ServiceTrackerActor:
    """``Tracker.step`` as an actor of :class:`~kmq.dev.sim.world.World` (same interface as its
    ``TrackerActor``: ``states``, ``max_in_flight``, ``busy``).

    :param reader: the tracker's queue log reader; ``hw_reader``: its markers look-up reader
        (both kept over restarts, as a reader keeps nothing between reads).
    """

    interval = 0.05

    def __init__(self, world: Any, reader: Any, hw_reader: Any, name: str = "tracker", crash_at: float | None = None,
                 down_for: float = 2.0) -> None:
        self.world = world
        self.name = name
        self.wake = 0.0
        self.clients = TrackerClients(world.cluster, name, reader, hw_reader)
        self.crash_at, self.down_for = crash_at, down_for
        self.downtime = Downtime()
        self.incarnation = 0
        self.max_in_flight: dict[int, int] = {}
        self.crashes: list[float] = []  # simulated times it was killed
        self.view_drops = 0  # kmq_tracker_stale_views_total, summed over its incarnations
        self._build()

    def _build(self) -> None:
        """A tracker process, opened as ``Tracker.run`` opens it (without the HTTP endpoints):
        nothing in memory, its markers partitions positioned from its commits."""
        c = self.world.cluster
        self.incarnation += 1
        self.clients.new_process(self.incarnation)
        self.tracker = service.Tracker(self.world.config, registry=CollectorRegistry(),
                                       clock=lambda: c.clock.now_ms() / 1000.0, clients=self.clients,
                                       monotonic=c.clock.monotonic,
                                       pauses=FaultPlanPauses(c, self.name))
        self.tracker.open(serve_http=False)

    def _restart(self) -> None:
        self._build()
        self.world.cluster.record(f"world tracker restarted as tracker#{self.incarnation}")

    def _crash(self) -> None:
        """SIGKILL: what the producer holds is lost (unwritten sends never happen), the state is gone."""
        c = self.world.cluster
        c.record(f"world tracker#{self.incarnation} crashes")
        self.crashes.append(c.t())
        self.view_drops += self._view_drops()
        for producer in self.clients.producers:
            producer.close(timeout=0.0)
        self.crash_at = None
        self.downtime.crashed(c.t(), self.down_for)

    @property
    def states(self) -> dict:
        """Each markers partition's :class:`PartitionState` (the current one: a dropped view is replaced)."""
        return {tp[1]: o.state for tp, o in self.tracker.partitions.items()}

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
        owned = self.tracker.partitions.values()
        return any(not o.caught_up or o.state.in_flight for o in owned)
