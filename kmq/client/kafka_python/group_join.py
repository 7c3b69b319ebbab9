"""Keep a group join that finished between two polls (a kafka-python 3.0 workaround).

kafka-python 3.0 runs JoinGroup -> SyncGroup as a task on its I/O thread. A
``poll(timeout_ms=N)`` shorter than the join (a broker holds a first JoinGroup
for ``group.initial.rebalance.delay.ms``, 3 s by default) gives up and leaves
the task running. When the task succeeds while no poll waits for it, the next
poll sees a finished task and a member still marked "rejoin needed", and sends
a fresh JoinGroup: the assignment the broker just gave is thrown away and the
join starts over (``BaseCoordinator.join_group_async``; still so in 3.1.0.dev).
A loop of short polls with work in between can lose every round this way:
reproduced as a consumer without an assignment after 30 s of 100 ms polls on a
loaded machine, each round costing a full join.

:func:`keep_finished_joins` completes such a task the way kafka-python does
when a poll is waiting for it (member stable, heartbeats on, the assignment
handed to the rebalance listener), before the next poll decides to rejoin.
The consumer must be polled from one thread, as kafka-python requires anyway.

A second defect of the same shape: a group leader whose metadata for the
subscribed topics changed after it assigned (partitions added, or the first
metadata answer arriving just after the first join, as on Apache Kafka) rejoins
without setting the coordinator's "rejoin needed" flag (the rule Apache Kafka's
Java client fixed as KAFKA-9815). Once its new assignment is computed, nothing
asks for a rejoin any more, so no poll completes the join left in flight: the
member stays REBALANCING with its partitions, every commit fails with
RebalanceInProgress, and no rebalance ever ends it (reproduced: a lone worker
on Apache Kafka 4.2 stuck for minutes after its second join). The same
workaround sets the flag when the metadata change is seen, as the Java client
does, so the join is awaited and kept like any other.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.structs import MemberState

__all__ = ["keep_finished_joins", "snapshot_subscribed_metadata", "COORDINATOR_ATTRIBUTES"]

log = logging.getLogger(__name__)

#: ``BaseCoordinator`` internals this workaround reads, writes or calls.
COORDINATOR_ATTRIBUTES = ("_join_task", "_lock", "_generation", "_enable_heartbeat", "_on_join_complete_async",
                          "join_group_async", "rejoining", "rejoin_needed", "state", "need_rejoin",
                          "_assignment_snapshot", "_metadata_snapshot", "_build_metadata_snapshot",
                          "_subscription", "_cluster")


def keep_finished_joins(consumer: Any) -> None:
    """Make ``consumer`` (a group ``kafka.KafkaConsumer``) keep a join that succeeded between polls.

    Installed on this one consumer's coordinator; other consumers of the process are untouched."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or getattr(coordinator, "_kmq_keeps_joins", False):
        return
    join_group_async = coordinator.join_group_async

    async def join_keeping_a_finished_one(timeout_ms: Any = None) -> bool:
        task = coordinator._join_task
        if task is not None and task.succeeded():
            generation = coordinator._generation
            log.debug("group %s: keeping the join (generation %s) that finished between polls",
                      coordinator.group_id, generation.generation_id)
            coordinator._join_task = None
            with coordinator._lock:
                coordinator.rejoining = False
                coordinator.rejoin_needed = False
                coordinator.state = MemberState.STABLE
                coordinator._enable_heartbeat()
            await coordinator._on_join_complete_async(generation.generation_id, generation.member_id,
                                                      generation.protocol, task.value)
        # A subscription or metadata change during the join still asks for a new one here.
        return await join_group_async(timeout_ms=timeout_ms)

    need_rejoin = coordinator.need_rejoin

    def need_rejoin_flagging_metadata_changes() -> bool:
        snapshot = coordinator._assignment_snapshot
        if snapshot is not None and snapshot != coordinator._metadata_snapshot and not coordinator.rejoin_needed:
            log.debug("group %s: the metadata of the subscribed topics changed since this leader assigned; "
                      "rejoining", coordinator.group_id)
            coordinator.rejoin_needed = True  # cleared only when the join completes
        return need_rejoin()

    coordinator.join_group_async = join_keeping_a_finished_one
    coordinator.need_rejoin = need_rejoin_flagging_metadata_changes
    coordinator._kmq_keeps_joins = True


def snapshot_subscribed_metadata(consumer: Any) -> None:
    """Take the subscribed topics' partitions from ``consumer``'s metadata cache now, just after
    ``subscribe``. kafka-python builds that snapshot only on the next metadata answer; a group leader
    joining before it assigns from an empty snapshot, sees the answer as a change, and rebalances the
    group a second time right after the first (on Apache Kafka, every new kafka-python member: an
    eager member gave all its partitions back). Call it once the topics are in the cache."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None:
        return
    coordinator._metadata_snapshot = coordinator._build_metadata_snapshot(coordinator._subscription,
                                                                          coordinator._cluster)
