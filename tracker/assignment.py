"""The markers partitions the group assigned to this tracker, and which of them a step visits.

:class:`Assignment` keeps each owned partition's :class:`~tracker.partition.OwnedPartition`
and the work a step owes them: its due time in a
:class:`~kmq.core.due_schedule.DueSchedule` (once caught up), and whether its commit and its
gauges are behind its state. Every change of a partition's state is followed by
:meth:`Assignment.touched`; a partition not touched is not visited (so idle cost does not grow
with the partitions).

It serves the group's rebalance callbacks (assigned: a fresh state that catches up,
:mod:`tracker.catch_up`; revoked: committed where it moved, then dropped), commits the
offsets that moved (:func:`~kmq.core.end_lookups.offsets_to_commit`), and drops the view
(every partition re-read from its committed offset) when the group refuses a commit or the
service doubts its membership. Its lines keep the service's logger name, ``tracker.service``.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from kmq.client import ClientCommitFailed, GroupConsumerAdapter, Partition
from kmq.config import QueueConfig
from kmq.core.due_schedule import DueSchedule
from kmq.core.end_lookups import offsets_to_commit
from kmq.core.lease_state import PartitionState
from kmq.core.log_fields import partitions_fields
from kmq.telemetry.metrics import TrackerMetrics
from tracker.catch_up import CatchUp
from tracker.partition import OwnedPartition, partition_names
from tracker.upgrades import publish_held

__all__ = ["Assignment", "log_by_queue"]

log = logging.getLogger("tracker.service")


class Assignment:
    """The owned partitions (:attr:`owned`, by ``(markers topic, partition)``) and the step's
    bookkeeping of them (module docstring). ``queues``: the configured queues;
    ``now_ms``: the tracker's clock; ``tick_ms``: how soon a partition behind its markers is
    looked at again; ``per_step``: partitions positioned or looked up in one step; ``new_state(q)``:
    a fresh lease state for a partition of queue ``q``."""

    def __init__(self, queues: Sequence[QueueConfig], metrics: TrackerMetrics, now_ms: Callable[[], int],
                 tick_ms: int, per_step: int, new_state: Callable[[QueueConfig], PartitionState]) -> None:
        self.new_state = new_state
        self._queues = {q.markers_topic: q for q in queues}
        self._queue_names = [q.label for q in queues]
        self.metrics = metrics
        self._now_ms = now_ms
        self._tick_ms = tick_ms
        self.owned: dict[Partition, OwnedPartition] = {}
        self.joined = False  # the group assigned partitions (maybe none) at least once
        # The per-step work visits these, not every owned partition.
        self.schedule: DueSchedule[Partition] = DueSchedule()  # caught-up partitions: next due time
        self.to_commit: set[Partition] = set()  # state changed since the last commit
        self.to_publish: set[Partition] = set()  # state changed since the last metrics update
        self.published_open: set[Partition] = set()  # had messages in flight at the last metrics update
        self.catch_up = CatchUp(metrics, self.touched, now_ms, per_step)

    def touched(self, owned: OwnedPartition) -> None:
        """``owned``'s state may have changed: schedule it at its next due time (once caught up), and
        commit and publish it at the next chance. Every change of a partition's state is followed by
        this call; a partition not touched is not visited by the step."""
        tp = owned.tp
        self.to_commit.add(tp)
        self.to_publish.add(tp)
        if owned.caught_up:
            self.schedule.set(tp, owned.next_visit_ms(self._now_ms(), self._tick_ms))

    def commit(self, consumer: GroupConsumerAdapter, force: bool = False) -> None:
        """Commit the partitions whose committable offset moved (``force``: every owned one)."""
        offsets = offsets_to_commit(self.owned, list(self.owned) if force else self.to_commit, force)
        committing = [(self.owned[tp], c) for tp, c in offsets.items()]  # a callback in commit() may revoke them
        if not offsets:
            self.to_commit.clear()
            return
        try:
            consumer.commit(offsets)
        except ClientCommitFailed as exc:
            if exc.rebalanced:
                # Fenced: the group moved on without us (e.g. after a pause). Our view is stale.
                self.metrics.fenced_commits.inc()
                log.warning("marker offset commit refused by the group (%s); the previous commit stays", exc)
                self.drop_view("the group refused a commit")
            else:
                # Not fatal: the previous commit stays, a new owner replays a little more.
                log.warning("marker offset commit failed (%s); a new owner would replay from the previous commit", exc)
            return
        for owned, c in committing:
            owned.committed = c
        self.to_commit.clear()

    def drop_view(self, why: str) -> None:
        """Forget every partition's state; each is re-read from its committed offset, and redelivered
        from only once the group accepted a commit for it (:class:`~tracker.catch_up.CatchUp`): the
        group decides whether it is still ours. Never a loss: the commit never passes an open START."""
        if not self.owned:  # e.g. the client learnt first that the session expired, and revoked them
            log.warning("%s: no partition is held any more, so there is no view to drop", why)
            return
        self.metrics.stale_views.inc()
        log.warning("%s: dropping the in-memory state of %d partition(s), re-reading them from the committed "
                    "offsets and redelivering nothing before the group accepts a commit for them", why,
                    len(self.owned))
        self.reread_all(doubted=True)

    def reread_all(self, doubted: bool) -> None:
        """Forget every partition's state: each is re-read from its committed offset and caught up to
        a log end read afresh before a lease is judged (as after an assignment); ``doubted``: and
        redelivered from only once the group accepted a commit for it."""
        for owned in self.owned.values():
            owned.state = self.new_state(owned.queue)
            owned.positioned = owned.caught_up = owned.at_end = False
            owned.doubted = owned.doubted or doubted
            owned.target = owned.committed = None
            owned.held = None  # met again when re-read, unless a newer tracker reads it
        publish_held(self.owned.values(), self.queue_names(), self.metrics)
        self.schedule.clear()
        self.catch_up.pending = set(self.owned)
        self.to_publish |= self.catch_up.pending

    def subscribe(self, consumer: GroupConsumerAdapter) -> None:
        """Subscribe ``consumer`` to the markers topics. The client calls back inside fetch() and close()
        (kafka-python on its I/O thread, while the main thread waits in that call)."""
        consumer.subscribe(sorted(self._queues), self.on_assigned, self.on_revoked,
                           commit_on_revoke=self.revoke_offsets, on_commit_failed=self.revoke_commit_failed)

    def on_assigned(self, assigned: set[Partition]) -> None:
        self.joined = True
        for tp in sorted(assigned):  # served in this order until each has been served once
            if tp in self.owned:
                self.owned[tp].doubted = False  # assigned in the group's current generation: ours
                continue
            q = self._queues[tp[0]]
            self.owned[tp] = OwnedPartition(q, tp, self.new_state(q))
            self.catch_up.pending.add(tp)
            self.to_publish.add(tp)
        log_by_queue("assigned markers partitions: %s", assigned, self._queues)

    def revoke_offsets(self, revoked: set[Partition]) -> dict[Partition, int]:
        """What to commit before ``revoked`` go (the client commits it): each one's committable
        offset, where it changed."""
        return offsets_to_commit(self.owned, revoked)

    def revoke_commit_failed(self, exc: ClientCommitFailed) -> None:
        if exc.rebalanced:
            self.metrics.fenced_commits.inc()
        log.warning("commit before revoke failed (%s); the new owner replays from the previous commit", exc)

    def on_revoked(self, revoked: set[Partition]) -> None:
        """Drop the revoked partitions' state (their offsets were committed just before, when changed)."""
        if not revoked:
            return
        m = self.metrics
        for tp in revoked:
            owned = self.owned.pop(tp, None)
            for held in (self.schedule, self.catch_up.pending, self.to_commit, self.to_publish,
                         self.published_open):
                held.discard(tp)
            if owned is None:
                continue
            labels = (owned.queue.label, str(owned.partition))
            for g in (m.in_flight, m.oldest_in_flight_seconds, m.marker_lag, m.failing_offsets, m.retention_used_ratio):
                try:
                    g.remove(*labels)
                except KeyError:
                    pass
        publish_held(self.owned.values(), self.queue_names(), self.metrics)
        log_by_queue("revoked markers partitions: %s (offsets committed, state dropped)", revoked, self._queues)

    def queue_names(self) -> list[str]:
        return self._queue_names


def log_by_queue(text: str, tps: set[Partition], queues: dict[str, QueueConfig]) -> None:
    """One INFO line per queue about its markers partitions ``tps``, with ``queue`` and ``partitions``
    as structured fields (kmq.core.log_fields); "none" when ``tps`` is empty."""
    if not tps:
        log.info(text, "none")
        return
    by_topic: dict[str, set[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, set()).add(partition)
    for topic in sorted(by_topic):
        q = queues.get(topic)
        log.info(text, partition_names((topic, p) for p in by_topic[topic]),
                 extra=partitions_fields(q.name if q is not None else topic, by_topic[topic], markers_topic=topic))
