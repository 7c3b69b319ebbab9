"""Catch-up: a newly owned markers partition, from its assignment until redelivery may start.

A partition resumes from its committed marker offset and is *catching up* until its position
reaches a high-water mark read after the assignment (by the log reader: the group consumer keeps
an old mark for a partition assigned again to the same member); only then are its due messages
redelivered, so a restart never redelivers something whose END is still unread. A partition
re-read after a membership doubt (:mod:`tracker.membership`) also waits until the group accepts
a commit for it: the client commits with the generation it holds, so a member whose session
expired while it stood still is refused even before its next heartbeat tells it so, and does not
copy what the new owner copies. Where reading
actually resumed is checked against the committed offset: markers deleted by retention are logged
and counted (:mod:`kmq.core.retention`).

A tracker given thousands of partitions at once positions them and reads their ends at most
``per_step`` at a time, over several steps; the look-up answers partition by partition, so one
whose broker does not answer costs only itself a retry, with its own backoff, and a position the
broker does not answer is asked again next step.
"""

from __future__ import annotations

import logging
from typing import Callable

from kmq.client import ClientCommitFailed, GroupConsumerAdapter, LogReadError, Partition
from kmq.core.errors import BrokerUnavailable
from kmq.core.log_fields import log_fields
from kmq.core.retention import BELOW_LOG_START, resume_gap
from kmq.telemetry.metrics import TrackerMetrics
from tracker.partition import OwnedPartition, partition_names

__all__ = ["CatchUp"]

log = logging.getLogger(__name__)

# Caught-up partitions named one by one in the log; more in one step are summed up in one line.
_NAMED_ONE_BY_ONE = 10
# After a confirming commit failed (refused, or the coordinator unreachable): wait this long before
# the next one, instead of a blocking commit every step.
_CONFIRM_RETRY_MS = 1000


class CatchUp:
    """The partitions not caught up yet (:attr:`pending`) and the steps that bring them there.

    ``touched(owned)`` is the service's "this partition's state changed" (schedule, commit,
    publish); ``now_ms()`` its clock."""

    def __init__(self, metrics: TrackerMetrics, touched: Callable[[OwnedPartition], None],
                 now_ms: Callable[[], int], per_step: int) -> None:
        self.metrics = metrics
        self._touched = touched
        self._now_ms = now_ms
        self.per_step = per_step
        #: Owned partitions not positioned or not caught up yet.
        self.pending: set[Partition] = set()
        #: When a catch-up target was last read (ms; 0: never): the broker answered then.
        self.looked_up_ms = 0
        self._confirm_after_ms = 0  # no confirming commit before this (ms), after one that failed
        self._confirm_warned = False  # a failed confirmation was logged since the last one that passed

    def position_new(self, owned: dict[Partition, OwnedPartition], consumer: GroupConsumerAdapter) -> set[Partition]:
        """Seek newly assigned partitions to their committed marker offset; returns those positioned.

        kafka-python keeps the fetch position of a partition that is revoked and assigned again to
        the same member; its state was dropped at the revoke, so it must be replayed from the commit.
        Records fetched for it in the same poll came from the old position and are discarded, and so
        are a partition's records until it is positioned (the committed offsets may not be read:
        tried again next step)."""
        new = [o for o in map(owned.get, self.pending) if o is not None and not o.positioned]
        if not new:
            return set()
        new = sorted(new, key=lambda o: o.tp)[:self.per_step]
        try:
            committed = consumer.committed([o.tp for o in new])
        except BrokerUnavailable as exc:
            log.warning("committed marker offsets of %s not read (%s); trying again",
                        partition_names(o.tp for o in new), exc)
            return set()
        for o in new:
            off = committed.get(o.tp)
            if off is None:
                consumer.seek_to_beginning([o.tp])
            else:
                consumer.seek(o.topic, o.partition, off)
            o.positioned = True
            o.target = None
            o.state.position = off
            o.committed = off
            o.resume_from = off
            self._touched(o)
        return {o.tp for o in new}

    def clock_moved(self, by_ms: int) -> None:
        """The tracker's clock jumped by ``by_ms`` (negative: back): the times kept here move with it."""
        if self.looked_up_ms:
            self.looked_up_ms += by_ms
        if self._confirm_after_ms:
            self._confirm_after_ms += by_ms

    def check_resume(self, owned: OwnedPartition, resumed_at: int) -> None:
        """The first offset read after resuming should be the committed one; if the consumer's offset
        reset moved elsewhere, the committed offset is not in the log any more (see kmq.core.retention)."""
        gap = resume_gap(owned.resume_from, resumed_at)
        owned.resume_from = None
        if gap is None:
            return
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

    def update(self, owned: dict[Partition, OwnedPartition], consumer: GroupConsumerAdapter,
               hw_reader) -> list[OwnedPartition]:
        """Read the catch-up targets still missing (of partitions whose last look-up was answered),
        then enable redelivery where the position reached them; returns the partitions caught up
        just now."""
        self.read_targets(owned, hw_reader)
        behind = [o for o in map(owned.get, self.pending) if o is not None and o.positioned]
        unread: list[Partition] = []
        reached: list[OwnedPartition] = []
        for o in behind:
            if o.target is not None:
                try:
                    if self._reached(o, consumer):
                        reached.append(o)
                except BrokerUnavailable as exc:  # the position was not read: next step, like a target
                    unread.append(o.tp)
                    cause = exc
        caught = [o for o in reached if not o.doubted] + self._confirm([o for o in reached if o.doubted], consumer)
        for o in caught:
            o.caught_up = True
            o.read_through_ms = o.target_ms
            self.pending.discard(o.tp)
            self._touched(o)
        self._log_caught_up(caught)
        if unread:
            log.warning("position of %d partition(s) catching up not read (%s, e.g. %s); trying again",
                        len(unread), cause, partition_names(unread, 3))
        return caught

    def read_targets(self, owned: dict[Partition, OwnedPartition], hw_reader, failing: bool = False) -> None:
        """Look up the catch-up targets still missing, at most ``per_step``: of the partitions whose
        last look-up was answered, or (``failing``) of those whose last one was not and whose own
        backoff is over. The look-up answers partition by partition: one that gets no answer backs
        off on its own and is asked apart from the others (the service does that after serving the
        others, as each such look-up may wait out the reader's timeout)."""
        now = self._now_ms()
        fresh = dict(sorted((o.tp, o.committed) for o in map(owned.get, self.pending)
                            if o is not None and o.positioned and o.target is None
                            and bool(o.lookup_failures) == failing and o.recheck_ms <= now)[:self.per_step])
        if not fresh:
            return
        # Not consumer.highwater(): kafka-python keeps the mark seen before a rebalance for a partition
        # assigned again to the same member, and catch-up would end before ENDs written meanwhile.
        try:
            got = hw_reader.log_ends(fresh)
            ends, failed = got.ends, got.failed
        except LogReadError as exc:
            ends, failed = {}, {tp: str(exc) for tp in fresh}
        for tp, hw in ends.items():
            o = owned[tp]
            o.target, o.target_ms, o.lookup_failures = hw, now, 0
        if ends:
            self.looked_up_ms = now
        unanswered = [owned[tp] for tp in fresh if tp not in ends]
        if unanswered:
            answered_ms = self._now_ms()  # the backoff counts from the answer: the look-up may have waited long
            delay = max(o.lookup_failed(answered_ms) for o in unanswered)
            for o in unanswered:
                self.metrics.lookup_failures.labels(o.queue.label).inc()
            log.warning("catch-up target of %s not read (%s); asked again in %.1fs (kmq_tracker_lookup_failures_total)",
                        partition_names(o.tp for o in unanswered), next(iter(failed.values()), "no answer"), delay)

    def _log_caught_up(self, caught: list[OwnedPartition]) -> None:
        if len(caught) > _NAMED_ONE_BY_ONE:  # thousands of partitions at start-up: one line a step, not one each
            log.info("%d markers partition(s) caught up (%s ...): %d message(s) in flight; redelivery enabled; "
                     "%d still catching up", len(caught), partition_names((o.tp for o in caught), 3),
                     sum(o.state.in_flight for o in caught), len(self.pending))
            return
        for o in caught:
            log.info("%s[%d] caught up at marker offset %d: %d message(s) in flight; redelivery enabled",
                     o.topic, o.partition, o.state.position, o.state.in_flight,
                     extra=log_fields(o.queue.name, o.partition, markers_topic=o.topic,
                                      marker_offset=o.state.position, in_flight=o.state.in_flight))

    def _confirm(self, doubted: list[OwnedPartition], consumer: GroupConsumerAdapter) -> list[OwnedPartition]:
        """Commit the ``doubted`` partitions (re-read after a membership doubt, caught up to their
        targets) at their committable offsets; returns them if the group accepted, else none.

        The commit carries the generation the client holds: accepted, this member still owns them
        (the group moves a partition later only through a rebalance the listener sees, or after
        another pause, which is doubted again). Refused as fenced, another member owns them; the
        client rejoins the group at its next poll and the listener revokes them. Nothing is
        redelivered from them meanwhile: copies the new owner makes too would be duplicates."""
        if not doubted:
            return []
        now = self._now_ms()
        if now < self._confirm_after_ms:
            return []
        offsets = {o.tp: o.state.committable_offset() for o in doubted}
        names = partition_names(offsets)
        try:
            consumer.commit({tp: c for tp, c in offsets.items() if c is not None})
        except ClientCommitFailed as exc:
            self._confirm_after_ms = now + _CONFIRM_RETRY_MS  # the rejoin revokes them meanwhile, if refused
            if exc.rebalanced:
                self.metrics.fenced_commits.inc()
            if self._confirm_warned:
                return []
            self._confirm_warned = True
            if exc.rebalanced:
                log.warning("the group refused this tracker's commit of %s (%s): another tracker owns them now, and "
                            "nothing is redelivered from them; the client rejoins the group at its next poll", names, exc)
            else:
                log.warning("ownership of %s not confirmed: the commit failed (%s); nothing is redelivered from them "
                            "until a commit goes through, tried again every %gs", names, exc, _CONFIRM_RETRY_MS / 1000)
            return []
        for o in doubted:
            o.doubted = False
            if offsets[o.tp] is not None:
                o.committed = offsets[o.tp]
        self._confirm_warned = False
        log.info("the group accepted this tracker's commit of %s after the membership doubt: they are still its "
                 "own, and redelivery resumes", names)
        return doubted

    def _reached(self, owned: OwnedPartition, consumer: GroupConsumerAdapter) -> bool:
        """Whether the position reached the catch-up target."""
        if owned.resume_from is not None and owned.state.position == owned.resume_from:
            self._check_resume_position(owned, consumer)
        assert owned.target is not None  # update() asks for a partition with a target only
        pos = owned.state.position
        if pos is None and owned.target == 0:
            # An empty log (its end is 0, so its start too): nothing to replay, no position to ask for.
            pos = owned.state.position = 0
        if pos is None:
            pos = owned.state.position = consumer.position(owned.topic, owned.partition)
        return pos is not None and pos >= owned.target

    def _check_resume_position(self, owned: OwnedPartition, consumer: GroupConsumerAdapter) -> None:
        """Nothing read yet since resuming: check where the consumer actually is."""
        cur = consumer.position(owned.topic, owned.partition)
        if cur is not None and cur != owned.resume_from:
            # The consumer's offset reset moved the position before anything was read.
            self.check_resume(owned, cur)
            owned.state.position = cur
        elif owned.resume_from > owned.target:  # type: ignore[operator]  # both set: see _reached
            # Committed offset past the log end (topic recreated or truncated). Kafka's fetch would
            # reset to the log start on its own; do it explicitly rather than rely on the broker.
            consumer.seek_to_beginning([owned.tp])
            start = consumer.position(owned.topic, owned.partition)
            if start is None:
                # The client cannot tell the log start yet: asked again on the next look, and the
                # first record read after the seek tells the gap (check_resume on its offset).
                owned.state.position = None
                return
            self.check_resume(owned, start)
            owned.state.position = start
