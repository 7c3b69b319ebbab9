"""The consumer's fetcher step: the fetch pipeline's I/O shell, one poll at a time.

:class:`Fetcher` feeds :class:`~kmq.consumer.fetch_pipeline.FetchPipeline` its events and carries
out the actions it returns, on the parts it is given (:class:`FetcherParts`): the group consumer
(a :class:`~kmq.client.GroupConsumerAdapter`), the marker writer (STARTs, the hand-off RENEWs), the
ready queue (what a revocation commits back) and the application side (the hand-over). One step is
:meth:`Fetcher.answers` (the STARTs and the commit Kafka answered, and the time) then
:meth:`Fetcher.poll` (one Kafka poll within the room flow control gives, the rebalance callbacks
that ran inside it, then its records). It starts no thread and never sleeps (the waits it asks for
are returned): :class:`~kmq.consumer.consumer.KmqConsumer`'s fetcher thread runs it in a loop, the
simulator's worker (:mod:`kmq.dev.sim.worker`) one step per turn on simulated clients and a virtual
clock, with a marker writer of its own (the real one sends from threads of its own).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from kmq.client import ClientCommitFailed
from kmq.consumer.fetch_batch import STARTING, FetchBatch
from kmq.consumer.fetch_pipeline import (ClosePlan, Commit, FetchPipeline, GiveBack, HandOver, SeekBack, Skip,
                                         WriteStarts)
from kmq.consumer.give_back import give_back, give_back_on_close, nack_refused
from kmq.core.errors import MarkerWriteError
from kmq.core.log_fields import partitions_fields
from kmq.core.message import KmqMessage
from kmq.telemetry.metrics import ConsumerMetrics

__all__ = ["Fetcher", "FetcherParts"]

log = logging.getLogger(__name__)


def _no_rest(_seconds: float) -> None:
    """A fetcher on a virtual clock does not wait after a seek back: its clock moves between steps."""


@dataclass
class FetcherParts:
    """What a :class:`Fetcher` works with.

    :param topic: the queue topic; ``label`` names the queue in metrics.
    :param writer: the marker writer (:class:`~kmq.consumer.writer.MarkerWriter` or one with its
        ``send_starts``, ``wait_starts``, ``hand_off``, ``replace_producer``, ``flush_buffer`` and ``owner``).
    :param ready: the ready queue (``take_out`` and ``put``: a revocation commits its messages back;
        ``drain``: :meth:`Fetcher.nack_left_behind`).
    :param build: what the group consumer builds each fetched record into.
    :param hand_over: gives a :class:`HandOver`'s messages to user code.
    :param fetched: counts a new batch outstanding, before its STARTs go.
    :param wake: set when a START or commit is answered; the group consumer may end its wait on it.
    :param rest: waits after a seek back (a broker outage: do not spin).
    :param stage_hook: :data:`~kmq.consumer.consumer.StageHook`.
    :param observe: called with each action before it is carried out (the simulator's invariants).
    :param on_assigned: ``(partitions, gen)`` after an assignment was reported to the pipeline.
    :param handoff_wait: seconds a revoke callback waits for the hand-off RENEW.
    :param starve_after: seconds without records before the client's fetch state is unstuck.
    :param max_poll_wait: the longest a poll waits for records (a virtual clock moves between steps: 0).
    :param commit_back_closing: a revocation while closing commits back the never-handed messages
        drained for the close (not with ``consumer.ordering: key``, whose held messages stay in the plan).
    :param session_timeout: ``kafka.session_timeout``: how long closing waits for a rebalance.
    """

    topic: str
    label: str
    pipeline: FetchPipeline
    writer: Any
    ready: Any
    build: Callable[..., KmqMessage]
    hand_over: Callable[[HandOver], None]
    fetched: Callable[[FetchBatch], None]
    metrics: ConsumerMetrics
    wake: threading.Event
    monotonic: Callable[[], float] = time.monotonic
    rest: Callable[[float], Any] = _no_rest
    stage_hook: Callable[[str, dict], None] | None = None
    observe: Callable[[Any], None] | None = None
    on_assigned: Callable[[set[int], int], None] | None = None
    handoff_wait: float = 2.0
    starve_after: float = 1.0
    max_poll_wait: float = math.inf
    commit_back_closing: bool = True
    session_timeout: float = 10.0


class Fetcher:
    """The fetch pipeline's I/O shell (see the module docstring); ``consumer`` is the group consumer,
    not subscribed yet. Only the thread that steps it touches ``consumer``, except the rebalance
    callbacks, which run inside its polls (kafka-python: on the client's I/O thread)."""

    def __init__(self, parts: FetcherParts, consumer: Any) -> None:
        self.parts = parts
        self.pipeline = parts.pipeline
        #: The group consumer; None while out of the group (:meth:`leave`).
        self.consumer: Any = consumer
        self._topic = parts.topic
        self._writer = parts.writer
        self._hook = parts.stage_hook
        self._monotonic = parts.monotonic
        self._do: dict[type, Callable[[Any], None]] = {
            WriteStarts: self._write_starts, Commit: self._send_commit, HandOver: self._hand_over,
            GiveBack: self._give_back, SeekBack: self._seek_back, Skip: self._skip}
        self._todo: deque = deque()  # actions decided, not carried out yet
        self._running = False  # carrying out actions
        self._commit: Any = None  # the commit in flight (the client's future)
        #: Rebalance callbacks not reported to the pipeline yet, in callback order:
        #: (assigned?, partitions, partitions committed back before their revocation).
        self._rebalances: deque[tuple[bool, set[int], set[int]]] = deque()
        self._paused = False  # every assigned partition paused (no room for a while)
        #: Ready batches taken out for the commit back before a revocation (:meth:`_commit_on_revoke`).
        self._rewound: list[tuple[list[KmqMessage], float, int]] = []
        self._forwarded: dict[int, int] = {}  # handed over at START, committed on by the revoke callback
        #: Closing: the never-handed messages drained for the close plan (None before the close).
        self._closing: list[tuple[list[KmqMessage], int]] | None = None
        self._fed_at = self._monotonic()  # last poll that returned records (or had no room to)

    # ------------------------------------------------------------ one step
    def subscribe(self) -> None:
        """Join the group (at the next poll) with the rebalance callbacks of this fetcher."""
        self.consumer.subscribe([self._topic], self._assigned, self._revoked,
                                commit_on_revoke=self._commit_on_revoke, on_commit_failed=self._commit_back_failed)
        self._fed_at = self._monotonic()

    def answers(self, now: float) -> None:
        """Report the STARTs and the commit Kafka answered, and the time (for the timeouts)."""
        pipeline = self.pipeline
        for b in list(pipeline.pending):
            if b.state is STARTING and b.handle is not None and all(f.is_done for _, _, f in b.handle):
                try:
                    self._writer.wait_starts(b.handle, timeout=0)
                except MarkerWriteError as exc:
                    self.run(pipeline.start_answered(b, exc, now))
                    continue
                self.parts.metrics.marker_write_seconds.observe(now - b.fetched_at)
                if self._hook:
                    self._hook("started", b.spans)
                self.run(pipeline.start_answered(b, None, now))
        commit = self._commit
        if commit is not None and commit.is_done:
            self._commit = None
            self.run(pipeline.commit_answered(commit.exception if commit.failed() else None, now))
        self.run(pipeline.tick(now))

    def poll(self, room: int, held: int = 0) -> float:
        """Poll Kafka once, as the pipeline decides given ``room`` (records flow control lets it fetch)
        and ``held`` (messages held back for their key), and carry out what follows. Returns the
        seconds to wait for settlements instead (nothing polled), else 0."""
        kc, pipeline, clock = self.consumer, self.pipeline, self._monotonic
        step = pipeline.next_poll(room, clock(), held)
        if step.wait:
            return step.wait
        self._apply_pauses(kc, all_paused=step.pause_all)
        records = kc.fetch(min(step.timeout, self.parts.max_poll_wait), step.max_records, self.parts.build,
                           self.parts.wake)
        if records or step.pause_all:
            self._fed_at = clock()
        elif clock() - self._fed_at > self.parts.starve_after:
            kc.recover_starved()  # e.g. kafka-python's lost fetch responses
            self._fed_at = clock()
        self.feed_rebalances()  # they ran inside that poll: its records belong to the assignment after them
        self.run(pipeline.polled(records, clock()))
        return 0.0

    def run(self, actions: list) -> None:
        """Carry out the pipeline's actions in order. An action that feeds an event back (a START
        that cannot even be sent) queues that event's actions behind the ones already decided."""
        self._todo.extend(actions)
        if self._running:
            return
        self._running = True
        observe = self.parts.observe
        try:
            while self._todo:
                action = self._todo.popleft()
                if observe is not None:
                    observe(action)
                self._do[type(action)](action)
        finally:
            self._running = False
            self._todo.clear()

    # ------------------------------------------------------------ the pipeline's actions
    def _write_starts(self, action: WriteStarts) -> None:
        """Count the fetched messages outstanding and send their STARTs (no wait)."""
        b = action.batch
        if self._hook:
            self._hook("polled", b.spans)
        member = self.consumer.member_id()
        if member:
            self._writer.owner = member  # the writer clips it to the marker field (255 UTF-8 bytes)
        self.parts.fetched(b)
        try:
            b.handle = self._writer.send_starts(b.offsets)
            for _p, _r, fut in b.handle:
                fut.add_both(self._answered)
        except MarkerWriteError as exc:
            self.run(self.pipeline.start_answered(b, exc, self._monotonic()))

    def _answered(self, *_result: Any) -> None:
        """A START or commit was answered (on the client's thread): the fetcher carries on at once."""
        self.parts.wake.set()

    def _send_commit(self, action: Commit) -> None:
        try:
            self._commit = self.consumer.commit_async({(self._topic, p): o for p, o in action.offsets.items()})
            self._commit.add_both(self._answered)
        except ClientCommitFailed as exc:
            self.run(self.pipeline.commit_answered(exc, self._monotonic()))

    def _hand_over(self, action: HandOver) -> None:
        if self._hook:
            self._hook("handed" if self.pipeline.hand_over_started else "committed", action.batch.spans)
        self.parts.hand_over(action)

    def _skip(self, action: Skip) -> None:
        """Copies made for another consumer group of the queue: counted, never delivered here."""
        label = self.parts.label
        self.parts.metrics.copies_skipped.labels(label).inc(len(action.messages))
        if log.isEnabledFor(logging.DEBUG):
            m = action.messages[0]
            log.debug("%s: skipped %d copy(ies) of other consumer groups (first %s/%d/%d)", label,
                      len(action.messages), m.topic, m.partition, m.offset)

    def _give_back(self, action: GiveBack) -> None:
        log.info("%s: %d message(s) given back to the group (%s)", self._topic, len(action.messages), action.why)
        give_back(action.messages)

    def _seek_back(self, action: SeekBack) -> None:
        """Nothing of what was pending was handed over or committed: fetch it (and START it) again."""
        kc = self.consumer
        assigned = {p for t, p in kc.assignment() if t == self._topic}
        for p, off in action.offsets.items():
            if p in assigned:  # a revoked partition is polled again by its new owner
                try:
                    kc.seek(self._topic, p, off)
                except ClientCommitFailed as exc:  # revoked meanwhile: same as above
                    log.info("%s: %s", self._topic, exc)
        parts = sorted(action.offsets)
        log.warning("%s: %s; partitions %s go back to offsets %s and are fetched again", self._topic,
                    action.why, parts, [action.offsets[p] for p in parts])
        if action.start_failed:
            # After a broker restart kafka-python's idempotent producer was seen to leave every later
            # send pending for ever; a new producer costs one connection and rules that out.
            self._writer.replace_producer("a START marker failed")
        self.parts.rest(0.5)  # a broker outage: do not spin

    def _apply_pauses(self, kc: Any, all_paused: bool) -> None:
        """Pause every partition (long without room) or resume them all. While paused, each poll
        pauses the assignment again: partitions a rebalance added arrive unpaused."""
        if all_paused:
            assigned = kc.assignment()
            if assigned:
                kc.pause(assigned)
            self._paused = True
        elif self._paused:
            assigned = kc.assignment()
            if assigned:
                kc.resume(assigned)
            self._paused = False

    # ------------------------------------------------------------ rebalance callbacks (inside a poll)
    def _commit_on_revoke(self, partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Before ``partitions`` go, while this member still owns them: the offsets to commit
        (:meth:`FetchPipeline.commit_back <kmq.consumer.fetch_pipeline.FetchPipeline.commit_back>`
        decides). Runs inside the fetcher's poll (kafka-python: on its I/O thread); the ready
        messages taken out are out of the ready queue until :meth:`_revoked` gives them back, or
        :meth:`_commit_back_failed` returns them."""
        mine = {p for t, p in partitions if t == self._topic}
        if not mine:
            return {}
        pipeline = self.pipeline
        # A batch fetched before an earlier revocation of its partition is stale: an interim owner
        # may have committed past it, and committing back below that would deliver its messages again.
        groups = self.parts.ready.take_out(mine, lambda p, gen: not pipeline.stale(p, gen))
        if self._closing and self.parts.commit_back_closing:
            groups += self._take_out_closing(mine)
        self._rewound.extend(groups)
        plan = pipeline.commit_back(mine, [(msgs, gen) for msgs, _, gen in groups])
        self._forwarded = plan.forward
        if plan.handoff:
            # Acknowledged before the commit back, so before any next owner can fetch them and START.
            self._writer.hand_off(plan.handoff, self.parts.handoff_wait)
        return {(self._topic, p): o for p, o in plan.offsets.items()}

    def _take_out_closing(self, mine: set[int]) -> list[tuple[list[KmqMessage], float, int]]:
        """A revocation while closing (the polls that let a rebalance complete): the never-handed
        messages of ``mine`` already drained for the close are committed back now, as a revocation
        does with the ready queue; left in the close plan they could only be NACKed (copies)."""
        out, rest = [], []
        for msgs, gen in self._closing or []:
            gone = {p for p in mine if not self.pipeline.stale(p, gen)}
            kept = [m for m in msgs if m.partition not in gone]
            if len(kept) < len(msgs):
                out.append(([m for m in msgs if m.partition in gone], 0.0, gen))
            if kept:
                rest.append((kept, gen))
        self._closing = rest
        return out

    def _commit_back_failed(self, exc: Exception) -> None:
        """The commit back before a revocation failed: the messages stay this member's (ready again)."""
        groups, self._rewound = self._rewound, []
        forwarded, self._forwarded = self._forwarded, {}
        log.warning("%s: committing offsets back before a revocation failed (%s); %d ready message(s) of the "
                    "revoked partitions stay with this member%s", self._topic, exc, sum(len(g[0]) for g in groups),
                    f"; messages handed over before their commit (partition -> up to offset {forwarded}) may be "
                    "delivered again by the partitions' next owner" if forwarded else "")
        for msgs, leased_at, gen in groups:
            if self._closing is not None:  # drained for the close: back into its plan
                self._closing.append((msgs, gen))
            else:
                self.parts.ready.put(msgs, leased_at, gen)

    def _revoked(self, partitions: set[tuple[str, int]]) -> None:
        # Runs inside the fetcher's poll (kafka-python may run it on its own I/O thread): only queue it.
        mine = {p for t, p in partitions if t == self._topic}
        groups, self._rewound = self._rewound, []
        self._forwarded = {}
        back = [m for msgs, _, _ in groups for m in msgs]
        rewound = {m.partition for m in back}
        if back:
            give_back(back)
            log.info("%s: %d ready message(s) of revoked partitions %s given back to the group (offsets "
                     "committed back to their first)", self._topic, len(back), sorted(rewound))
        if mine:
            self._rebalances.append((False, mine, rewound))
            log.info("%s: partitions %s revoked", self._topic, sorted(mine), extra=partitions_fields(self._topic, mine))

    def _assigned(self, partitions: set[tuple[str, int]]) -> None:
        mine = {p for t, p in partitions if t == self._topic}
        self._rebalances.append((True, mine, set()))
        log.info("%s: assigned partitions %s", self._topic, sorted(mine), extra=partitions_fields(self._topic, mine))

    def feed_rebalances(self) -> None:
        """Report the rebalance callbacks to the pipeline, in the order they ran (fetcher thread)."""
        while self._rebalances:
            assigned, parts, rewound = self._rebalances.popleft()
            if assigned:
                self.pipeline.assigned(parts)
                if self.parts.on_assigned is not None:
                    self.parts.on_assigned(parts, self.pipeline.gen)
            else:
                self.run(self.pipeline.revoked(parts, rewound))

    # ------------------------------------------------------------ leaving the group
    def give_back_unhanded(self, drained: list[tuple[list[KmqMessage], int]]) -> None:
        """Closing (or leaving the group): the never-handed messages ``drained`` from the ready queue
        and the pending batches go back to the group
        (:func:`kmq.consumer.give_back.give_back_on_close`); a revocation during the polls this
        takes still commits its partitions' share back (:meth:`_take_out_closing`)."""
        kc = self.consumer
        self._closing = drained

        def plan(assigned: set[int]) -> ClosePlan:
            self.feed_rebalances()  # the polls that complete a rebalance can revoke partitions
            return self.pipeline.close_plan(self._closing or [], assigned)

        if give_back_on_close(kc, self._topic, plan, lambda: self._apply_pauses(kc, all_paused=True),
                              self.parts.session_timeout,
                              lambda offsets: self._writer.hand_off(offsets, self.parts.handoff_wait)):
            self._writer.flush_buffer()
        self.pipeline.closed()

    def left(self) -> None:
        """The group consumer was closed after :meth:`give_back_unhanded` (the application stalled):
        nothing fetched so far may be committed, sought or committed back to any more."""
        self.feed_rebalances()  # the close's own revocations
        self.run(self.pipeline.revoked(set(self.pipeline.owned)))
        self._closing, self._rewound, self._forwarded, self._commit, self._paused = None, [], {}, None, False
        self.consumer = None

    def join(self, consumer: Any) -> None:
        """Join the group again with a new group consumer (after :meth:`left`)."""
        self.consumer = consumer
        try:
            self.subscribe()
        except BaseException:
            self.consumer = None
            raise

    def nack_left_behind(self) -> None:
        """Closing out of the group (after :meth:`left`): messages taken ahead for iteration and put
        back into the ready queue by the close belong to partitions given up; only the tracker can
        redeliver them (nacked)."""
        plan = self.pipeline.close_plan(self.parts.ready.drain(), set())
        if plan.nack:
            nack_refused(self._topic, plan.nack)
            self._writer.flush_buffer()
        give_back(plan.give_back)
