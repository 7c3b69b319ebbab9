"""Catch-up: the I/O shell of :class:`~kmq.core.catch_up_plan.CatchUpPlan`.

A partition resumes from its committed marker offset and is *catching up* until its position
reaches a high-water mark read after the assignment (by the log reader: the group consumer keeps
an old mark for a partition assigned again to the same member); only then are its due messages
redelivered, so a restart never redelivers something whose END is still unread. A partition
re-read after a membership doubt (:mod:`tracker.membership`) also waits until the group accepts
a commit for it: the client commits with the generation it holds, so a member whose session
expired while it stood still is refused even before its next heartbeat tells it so, and does not
copy what the new owner copies. Where reading actually resumed is checked against the committed
offset: markers deleted by retention are logged and counted (:mod:`kmq.core.retention`).

A tracker given thousands of partitions at once positions them and reads their ends at most
``per_step`` at a time, over several steps; the look-up answers partition by partition, so one
whose broker does not answer costs only itself a retry, with its own backoff, and a position the
broker does not answer is asked again next step.

Every decision (whom to seek, look up, compare, commit; what an answer means) is the plan's; here
its actions are carried out on the group consumer and the log reader, and its notices counted
and logged.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kmq.client import ClientCommitFailed, GroupConsumerAdapter, LogReadError, Partition
from kmq.core import catch_up_plan as plan
from kmq.core.catch_up_plan import CLOCK, OK, CatchUpPlan, Ends, Failed, Refused, Steps
from kmq.core.errors import BrokerUnavailable
from kmq.core.log_fields import log_fields
from kmq.core.retention import BELOW_LOG_START, ResumeGap
from kmq.telemetry.metrics import TrackerMetrics
from tracker.partition import OwnedPartition, partition_names

__all__ = ["CatchUp"]

log = logging.getLogger(__name__)

# Caught-up partitions named one by one in the log; more in one step are summed up in one line.
_NAMED_ONE_BY_ONE = 10
# The errors each read or seek may meet and the plan handles (a look-up's failure is the reader's).
_MAY_FAIL: dict[type, type[BaseException]] = {plan.ReadEnds: LogReadError, plan.ReadPosition: BrokerUnavailable,
                                              plan.Seek: BrokerUnavailable, plan.ReadCommitted: BrokerUnavailable}


class CatchUp:
    """The partitions not caught up yet (:attr:`pending`) and the steps that bring them there.

    ``touched(owned)`` is the service's "this partition's state changed" (schedule, commit,
    publish); ``now_ms()`` its clock."""

    def __init__(self, metrics: TrackerMetrics, touched: Callable[[OwnedPartition], None],
                 now_ms: Callable[[], int], per_step: int) -> None:
        self.metrics = metrics
        self._now_ms = now_ms
        self.plan = CatchUpPlan(per_step, touched)

    @property
    def pending(self) -> set[Partition]:
        """Owned partitions not positioned or not caught up yet."""
        return self.plan.pending  # type: ignore[return-value]  # the plan's partitions are the service's

    @pending.setter
    def pending(self, tps: set[Partition]) -> None:
        self.plan.pending = tps  # type: ignore[assignment]

    @property
    def looked_up_ms(self) -> int:
        """When a catch-up target was last read (ms; 0: never): the broker answered then."""
        return self.plan.looked_up_ms

    def position_new(self, owned: dict[Partition, OwnedPartition], consumer: GroupConsumerAdapter) -> set[Partition]:
        """Seek newly assigned partitions to their committed marker offset; returns those positioned.

        kafka-python keeps the fetch position of a partition that is revoked and assigned again to
        the same member; its state was dropped at the revoke, so it must be replayed from the commit.
        Records fetched for it in the same poll came from the old position and are discarded, and so
        are a partition's records until it is positioned (the committed offsets may not be read:
        tried again next step)."""
        positioned: set[Partition] = self._carry_out(self.plan.position(owned), consumer, None)
        return positioned

    def clock_moved(self, by_ms: int) -> None:
        """The tracker's clock jumped by ``by_ms`` (negative: back): the times kept here move with it."""
        self.plan.clock_moved(by_ms)

    def check_resume(self, owned: OwnedPartition, resumed_at: int) -> None:
        """The first offset read after resuming should be the committed one; if the consumer's offset
        reset moved elsewhere, the committed offset is not in the log any more (see kmq.core.retention)."""
        gap = plan.resumed(owned, resumed_at)
        if gap is not None:
            self._gap(owned, gap)

    def update(self, owned: dict[Partition, OwnedPartition], consumer: GroupConsumerAdapter,
               hw_reader: Any) -> list[OwnedPartition]:
        """Read the catch-up targets still missing (of partitions whose last look-up was answered),
        then enable redelivery where the position reached them; returns the partitions caught up
        just now."""
        self.read_targets(owned, hw_reader)
        caught: list[OwnedPartition] = self._carry_out(self.plan.reach(owned), consumer, hw_reader)
        return caught

    def read_targets(self, owned: dict[Partition, OwnedPartition], hw_reader: Any, failing: bool = False) -> None:
        """Look up the catch-up targets still missing, at most ``per_step``: of the partitions whose
        last look-up was answered, or (``failing``) of those whose last one was not and whose own
        backoff is over. The look-up answers partition by partition: one that gets no answer backs
        off on its own and is asked apart from the others (the service does that after serving the
        others, as each such look-up may wait out the reader's timeout)."""
        self._carry_out(self.plan.read_targets(owned, self._now_ms(), failing), None, hw_reader)

    # ------------------------------------------------------------ carrying out the plan's actions
    def _carry_out(self, steps: Steps, consumer: GroupConsumerAdapter | None, hw_reader: Any) -> Any:
        """Drive ``steps`` to its end, doing each action; returns what it returns."""
        try:
            action = next(steps)
            while True:
                action = steps.send(self._do(action, consumer, hw_reader))
        except StopIteration as done:
            return done.value

    def _do(self, action: Any, consumer: GroupConsumerAdapter | None, hw_reader: Any) -> Any:
        """Do ``action`` and return the plan's event for it: an error the action may meet (a broker
        that does not answer a read or a seek) is its :class:`~kmq.core.catch_up_plan.Failed`, a
        failed commit its ``Refused``; any other error is raised."""
        if action is CLOCK:
            return self._now_ms()
        kind = type(action)
        if kind not in _MAY_FAIL and kind is not plan.Commit:
            self._notice(action)
            return OK
        try:
            if kind is plan.ReadEnds:
                # Not consumer.highwater(): kafka-python keeps the mark seen before a rebalance for a
                # partition assigned again to the same member, and catch-up would end before ENDs
                # written meanwhile.
                got = hw_reader.log_ends(action.from_offsets)
                return Ends(got.ends, got.failed)
            assert consumer is not None  # the plan's position() and reach() read, seek and commit it
            if kind is plan.ReadPosition:
                return consumer.position(*action.tp)
            if kind is plan.Seek:
                if action.offset is None:
                    consumer.seek_to_beginning([action.tp])
                else:
                    consumer.seek(action.tp[0], action.tp[1], action.offset)
                return OK
            if kind is plan.ReadCommitted:
                return consumer.committed(action.tps)
            consumer.commit(action.offsets)
            return OK
        except ClientCommitFailed as exc:
            if kind is not plan.Commit:
                raise
            return Refused(exc, exc.rebalanced)
        except BrokerUnavailable as exc:
            if not isinstance(exc, _MAY_FAIL.get(kind, ())):
                raise
            return Failed(exc)

    def _notice(self, action: Any) -> None:
        """Count and log what the plan noticed."""
        kind = type(action)
        if kind is plan.CaughtUp:
            self._log_caught_up(action.partitions, action.pending)
        elif kind is plan.ResumedElsewhere:
            self._gap(action.partition, action.gap)
        elif kind is plan.TargetsUnread:
            for o in action.partitions:
                self.metrics.lookup_failures.labels(o.queue.label).inc()
            log.warning("catch-up target of %s not read (%s); asked again in %.1fs (kmq_tracker_lookup_failures_total)",
                        partition_names(o.tp for o in action.partitions), action.cause, action.delay_s)
        elif kind is plan.PositionsUnread:
            log.warning("position of %d partition(s) catching up not read (%s, e.g. %s); trying again",
                        len(action.tps), action.error, partition_names(action.tps, 3))
        elif kind is plan.CommittedUnread:
            log.warning("committed marker offsets of %s not read (%s); trying again",
                        partition_names(action.tps), action.error)
        elif kind is plan.ConfirmRefused:
            self._confirm_refused(action)
        elif kind is plan.Confirmed:
            log.info("the group accepted this tracker's commit of %s after the membership doubt: they are still its "
                     "own, and redelivery resumes", partition_names(action.tps))

    def _confirm_refused(self, action: plan.ConfirmRefused) -> None:
        names, exc = partition_names(action.tps), action.error
        if action.rebalanced:
            self.metrics.fenced_commits.inc()
        if not action.first:
            return
        if action.rebalanced:
            log.warning("the group refused this tracker's commit of %s (%s): another tracker owns them now, and "
                        "nothing is redelivered from them; the client rejoins the group at its next poll", names, exc)
        else:
            log.warning("ownership of %s not confirmed: the commit failed (%s); nothing is redelivered from them "
                        "until a commit goes through, tried again every %gs", names, exc,
                        plan.CONFIRM_RETRY_MS / 1000)

    def _gap(self, owned: OwnedPartition, gap: ResumeGap) -> None:
        """Reading of ``owned`` resumed elsewhere than at its committed offset: count it and say why."""
        q = owned.queue
        self.metrics.marker_offset_resets.labels(q.label, gap.kind).inc()
        if gap.kind == BELOW_LOG_START and gap.lost is not None:
            self.metrics.markers_lost.labels(q.label).inc(gap.lost.count)
            log.error("%s[%d]: committed marker offset %d is below the log start %d: markers %d..%d were deleted by "
                      "retention before the tracker closed them. Messages whose START was among them and that were "
                      "not acked will NOT be redelivered. See docs/operations.md (markers lost to retention)",
                      owned.topic, owned.partition, gap.committed, gap.resumed_at, gap.lost.first, gap.lost.last)
        else:
            log.warning("%s[%d]: committed marker offset %d is past the end of the markers log (topic recreated or "
                        "truncated?); replaying from offset %d", owned.topic, owned.partition, gap.committed,
                        gap.resumed_at)

    def _log_caught_up(self, caught: list[OwnedPartition], pending: int) -> None:
        if len(caught) > _NAMED_ONE_BY_ONE:  # thousands of partitions at start-up: one line a step, not one each
            log.info("%d markers partition(s) caught up (%s ...): %d message(s) in flight; redelivery enabled; "
                     "%d still catching up", len(caught), partition_names((o.tp for o in caught), 3),
                     sum(o.state.in_flight for o in caught), pending)
            return
        for o in caught:
            log.info("%s[%d] caught up at marker offset %d: %d message(s) in flight; redelivery enabled",
                     o.topic, o.partition, o.state.position, o.state.in_flight,
                     extra=log_fields(o.queue.name, o.partition, markers_topic=o.topic,
                                      marker_offset=o.state.position, in_flight=o.state.in_flight))
