"""The consumer's fetch pipeline as a pure state machine: fetch -> START -> commit -> hand over.

Pure, like :mod:`kmq.core.lease_state`: no Kafka import, no threads, no clock (``now`` is
passed in). The fetcher thread of :class:`~kmq.consumer.consumer.KmqConsumer` (the I/O
shell) feeds it events and executes the actions it returns, in order:

=================================  ====================================================
event                              actions it may return
=================================  ====================================================
``polled`` (a Kafka poll returned)  :class:`WriteStarts` for the new batch; :class:`Skip`
``start_answered``                  :class:`Commit`; or :class:`GiveBack` + :class:`SeekBack`
``commit_answered``                 :class:`HandOver`, the next :class:`Commit`, ...
``tick`` (time passes: timeouts)    as above
``commit_back`` (a revoke callback)  a :class:`CommitBack` (what to commit before they go)
``revoked`` / ``assigned``          :class:`GiveBack` (what the new owner fetches again)
``close_plan``                      a :class:`ClosePlan` (commit back, NACK, give back)
=================================  ====================================================

The protocol's two guarantees, each kept in one place:

* **A message is handed over only after Kafka acknowledged its START.** :class:`HandOver`
  is emitted only by :meth:`FetchPipeline._hand_over`, for ``STARTED`` batches: by default
  (``consumer.hand_over: committed``) those of a commit that succeeded
  (:meth:`FetchPipeline.commit_answered`), and :meth:`FetchPipeline._commit` puts only
  ``STARTED`` batches in a commit; with ``hand_over_started`` as soon as the START is
  acknowledged, in fetch order, with the commit still to come (one broker round trip less
  before user code; a commit that then fails lets the group deliver the batch again).
* **A commit never passes a record without a START.** Batches are committed in fetch order,
  each commit covers a prefix of the pending batches that are all ``STARTED``, and a START
  that fails (or is not answered in time) gives back its batch *and every later one* and
  seeks their partitions back (:meth:`FetchPipeline._give_back_all`).

Consumer groups of one queue (fan-out): another group's copy (:func:`~kmq.core.message.for_group`)
is skipped where it is fetched (:class:`Skip`): never STARTed, never handed over, its offset
committed past with the batch it came in (:class:`~kmq.consumer.fetch_batch.FetchBatch`
``spans``). A poll of skipped records only is a batch with nothing to START: committed in its turn.
The same look at each record's headers notes the scheduled ones (``kmq-not-before``): the
:class:`HandOver` names them, so the hand-over decides for those alone (:mod:`kmq.consumer.scheduled`).

Rebalances: a partition revoked after a batch was fetched is *stale* for that batch, even if
it is assigned to this member again (its position was then reset to the group's committed
offset, which an interim owner may have moved on). Stale records are never committed, sought
back to or committed back to: uncommitted ones are given back (the group delivers them
again), committed ones that never reached user code are NACKed on close (only the tracker
can redeliver them).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Iterable, Mapping

from kmq.config import KafkaConfig
from kmq.consumer.fetch_batch import GIVEN_BACK, START_FAILED, STARTED, STARTING, FetchBatch
from kmq.core.message import KmqMessage, for_group
from kmq.core.schedule import HEADER_NOT_BEFORE

__all__ = ["FetchPipeline", "ANSWER_POLL", "MAX_COMMIT_TRIES", "BACKPRESSURE_POLL", "PollStep", "WriteStarts", "Commit",
           "HandOver", "GiveBack", "SeekBack", "ClosePlan", "CommitBack", "Skip", "classify"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WriteStarts:
    """Send the batch's START markers (one per partition, ``batch.offsets``); report the
    answer with :meth:`FetchPipeline.start_answered`."""

    batch: FetchBatch


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit ``offsets`` (partition -> next offset) of the queue topic for ``batches``;
    report the answer with :meth:`FetchPipeline.commit_answered`."""

    offsets: dict[int, int]
    batches: tuple[FetchBatch, ...]


@dataclass(frozen=True, slots=True)
class Skip:
    """Records fetched for another consumer group of the queue (its copies): not delivered here, no
    marker, their offsets committed past with their batch. Only counted and logged."""

    messages: list[KmqMessage]


def classify(messages: list[KmqMessage], group: str | None) -> tuple[list[KmqMessage], list[KmqMessage],
                                                                    list[KmqMessage]]:
    """One look at the headers of a poll's ``messages``: those ``group`` (None: the default group)
    delivers, the copies of another group (``kmq-group``, :func:`~kmq.core.message.for_group`),
    and of the first the scheduled ones (a ``kmq-not-before`` header), each in fetch order."""
    if not any(m._headers for m in messages):  # no header, no copy, nothing scheduled: the common case
        return messages, [], []
    mine: list[KmqMessage] = []
    foreign: list[KmqMessage] = []
    scheduled: list[KmqMessage] = []
    for m in messages:
        headers = m._headers
        if not headers:
            mine.append(m)
        elif for_group(headers, group, m.topic, m.partition, m.offset):
            mine.append(m)
            if any(k == HEADER_NOT_BEFORE for k, _ in headers):
                scheduled.append(m)
        else:
            foreign.append(m)
    return mine, foreign, scheduled


@dataclass(frozen=True, slots=True)
class HandOver:
    """The batch's STARTs were acknowledged (and, unless handing over at START, its offsets
    committed): give ``messages`` to user code. The batch no longer holds them. ``scheduled``: those
    of them with a ``kmq-not-before`` header (noted at the poll), the only ones whose time is looked at."""

    batch: FetchBatch
    messages: list[KmqMessage] = field(default_factory=list, compare=False)
    scheduled: list[KmqMessage] = field(default_factory=list, compare=False)


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Messages that will not be handed over: out of the in-flight count and flow control, no marker."""

    messages: list[KmqMessage]
    why: str


@dataclass(frozen=True, slots=True)
class SeekBack:
    """Fetch these partitions again from ``offsets`` (partition -> first offset given back).
    ``start_failed``: the cause was a START marker (the marker producer may be stuck)."""

    offsets: dict[int, int]
    why: str
    start_failed: bool


@dataclass(frozen=True, slots=True)
class ClosePlan:
    """Closing: commit each partition in ``rewind`` back to its first never-handed offset (the
    group delivers those again), NACK ``nack`` (committed, never handed, of partitions this
    member no longer owns since they were fetched), then give back ``give_back`` (every
    never-handed message). ``handoff``: the offsets per partition that the commit back returns
    to the group, whose leases are handed off first (a RENEW with ``consumer.handoff_lease``).
    ``forward``: partitions without never-handed messages whose handed-over messages are not
    committed yet (handing over at START): committed on to after them, in the same commit."""

    rewind: dict[int, int]
    nack: list[KmqMessage]
    give_back: list[KmqMessage]
    handoff: dict[int, list[int]] = field(default_factory=dict)
    forward: dict[int, int] = field(default_factory=dict)

    @property
    def commit(self) -> dict[int, int]:
        """Everything closing commits: ``forward`` and ``rewind`` (partition -> next offset)."""
        return {**self.forward, **self.rewind}


@dataclass(frozen=True, slots=True)
class CommitBack:
    """Revoking partitions (inside the rebalance callback, while this member still owns them): commit
    ``offsets`` (partition -> next offset) before they go. ``rewind``: back to the first ready message
    (committed, never handed), so the group delivers the ready ones again, to the next owner, with
    the same delivery count; ``forward``: on past the messages handed over at START whose commit is
    not answered yet, or the next owner would poll them again while user code has them. ``handoff``:
    the offsets whose leases are handed off first (a RENEW with ``consumer.handoff_lease``): the
    ready ones and those of batches between START and commit, which the revocation gives back."""

    rewind: dict[int, int]
    forward: dict[int, int]
    handoff: dict[int, list[int]]

    @property
    def offsets(self) -> dict[int, int]:
        """Everything the callback commits (partition -> next offset)."""
        return {**self.forward, **self.rewind}


@dataclass(frozen=True, slots=True)
class PollStep:
    """What the fetcher does next: wait ``wait`` seconds for settlements without polling, or
    poll Kafka for up to ``max_records`` within ``timeout`` seconds, with every partition
    paused when ``pause_all`` (no room for a while: the poll only keeps the membership alive)."""

    wait: float
    max_records: int = 0
    timeout: float = 0.0
    pause_all: bool = False


_WAIT = PollStep(0.002)
#: The fetcher's poll timeout while batches wait for their START's or commit's answer. The shell
#: ends the wait as soon as one is answered where the client allows (kafka-python: the wait is on
#: an event the answer sets, as its own poll cannot be woken); otherwise each answer is seen up to
#: this late: at 5 ms, the pair added 11 ms to the p50 delivery latency on kafka-python (5,000
#: msg/s); at 1 ms, 5 ms, at no measurable cost in throughput (the polls return at once while
#: records are there).
ANSWER_POLL = 0.001

#: Failed commits of the same batches before they are given back and fetched again (~20 s).
MAX_COMMIT_TRIES = 40
#: Seconds without room (flow control) before the fetcher polls with all partitions paused:
#: a rebalance needs every member to poll (kafka-python rejoins inside poll), so a member must
#: not stop polling while its handlers are behind. Not on every blip: pausing parks buffered
#: fetches (see :func:`kmq.client.kafka_python.watchdog.unstrand_records`).
BACKPRESSURE_POLL = 0.5


class FetchPipeline:
    """Batches between their Kafka poll and user code, and the rebalance state they depend on.

    :param start_timeout: seconds a START may go unanswered before it counts as failed.
    :param commit_timeout: seconds a commit may go unanswered before it counts as failed.
    :param max_commit_tries: failed commits of the same batches before they are given back
        and fetched again (rather than stall their partitions).
    :param hand_over_started: hand a batch over once Kafka acknowledged its START, in fetch
        order, instead of once its commit succeeded (``consumer.hand_over: started``).
    :param backpressure_poll: seconds without room before the fetcher polls with every
        partition paused (a rebalance needs every member to poll).
    :param max_head_wait: seconds the oldest pending batch may wait for its START answer or
        commit before the fetcher stops fetching (polls with every partition paused) until it
        moves: batches fetched behind a stuck head cannot be handed over either, and each of
        their STARTs is a lease that, run out unhanded, becomes a copy. None: no limit.
    :param group: the queue's consumer group this consumer is in (``queues[].group``; None: the
        default group): the other groups' copies are skipped (:class:`Skip`).
    :param max_held: ``consumer.ordering: key``: messages held back for their key (not handed out
        yet) at which nothing more is fetched; held messages have a bound of their own, apart from
        flow control's. None: no such bound.
    """

    def __init__(self, start_timeout: float, commit_timeout: float, max_commit_tries: int = MAX_COMMIT_TRIES,
                 backpressure_poll: float = BACKPRESSURE_POLL, max_head_wait: float | None = None,
                 hand_over_started: bool = False, group: str | None = None, max_held: int | None = None) -> None:
        self.group = group
        self.max_held = max_held
        self.start_timeout = start_timeout
        self.hand_over_started = hand_over_started
        self.max_head_wait = max_head_wait
        self.commit_timeout = commit_timeout
        self.max_commit_tries = max_commit_tries
        self.backpressure_poll = backpressure_poll
        #: Batches not committed yet, in fetch order; all but those handed over at START
        #: (``FetchBatch.handed``, a prefix) are not handed over either.
        self.pending: deque[FetchBatch] = deque()
        #: Partitions assigned to this member (from the rebalance events).
        self.owned: set[int] = set()
        #: A commit failed and is retried: the fetcher polls longer meanwhile (that completes a rebalance).
        self.commit_retrying = False
        self._gen = 0  # revocation generation: +1 per revocation
        self._revoked_at: dict[int, int] = {}  # partition -> generation of its last revocation
        self._committing = 0  # head batches covered by the commit in flight (0: none)
        self._commit_sent_at = 0.0
        self._commit_tries = 0  # failed commits of the head batches so far, +1 for the one in flight
        self._await_poll = False  # a failed commit is retried only after the next Kafka poll
        self._blocked_since: float | None = None  # since when there is no room to fetch

    @classmethod
    def for_kafka(cls, kafka: KafkaConfig, lease: float | None = None, hand_over_started: bool = False,
                  group: str | None = None, max_held: int | None = None) -> "FetchPipeline":
        """The pipeline a consumer with these Kafka settings runs (its timeouts follow the client's);
        with the queue's ``lease``, no fetching while the oldest batch has waited half of it."""
        # A START write gets an answer (ack or timeout error) within the producer's delivery timeout.
        return cls(start_timeout=kafka.connect_timeout + 2.0,
                   commit_timeout=kafka.session_timeout + kafka.connect_timeout,
                   max_head_wait=None if lease is None else lease / 2, hand_over_started=hand_over_started,
                   group=group, max_held=max_held)

    # ------------------------------------------------------------ events
    def polled(self, messages: list[KmqMessage], now: float) -> list[Any]:
        """A Kafka poll returned ``messages`` (maybe none). The rebalance events that ran inside
        that poll must be reported first: the records belong to the assignment after them."""
        self._await_poll = False
        out: list[Any] = []
        if messages:
            mine, foreign, scheduled = classify(messages, self.group)
            batch = FetchBatch.of(mine, now, self._gen, foreign, scheduled)
            self.pending.append(batch)
            if foreign:
                out.append(Skip(foreign))
            if mine:
                out.append(WriteStarts(batch))
            else:  # nothing to START: committed past in its turn
                batch.state = STARTED
        self._advance(now, out)
        return out

    def start_answered(self, batch: FetchBatch, error: Any, now: float) -> list[Any]:
        """Kafka answered every START of ``batch``: ``error`` None means all acknowledged."""
        out: list[Any] = []
        if batch.state is STARTING:  # else given back meanwhile: nothing to do
            batch.state, batch.error = (STARTED, None) if error is None else (START_FAILED, error)
            self._advance(now, out)
        return out

    def commit_answered(self, error: Any, now: float) -> list[Any]:
        """The commit in flight succeeded (``error`` None) or failed."""
        out: list[Any] = []
        if not self._committing:
            return out
        if error is None:
            n, self._committing = self._committing, 0
            self._commit_tries = 0
            self.commit_retrying = False
            for _ in range(n):
                batch = self.pending.popleft()
                batch.state = GIVEN_BACK  # out of the pipeline: to user code
                if not batch.handed:
                    self._hand_over(batch, out)
        else:
            self._commit_failed(error, out)
        self._advance(now, out)
        return out

    def tick(self, now: float) -> list[Any]:
        """Time passed: a START or commit without an answer in time counts as failed."""
        out: list[Any] = []
        self._advance(now, out)
        return out

    def revoked(self, partitions: Iterable[int], rewound: Iterable[int] = ()) -> list[Any]:
        """``partitions`` were taken from this member. Their records in batches not committed yet
        are given back (their new owner fetches them again; its START takes over the lease);
        the commit in flight, if any, decides for its own batches (:meth:`commit_answered`),
        except for the partitions ``rewound``: committed back, before they went, to ready
        messages older than anything in flight, so the new owner fetches those batches too."""
        parts = set(partitions)
        if not parts:
            return []
        self._gen += 1
        for p in parts:
            self._revoked_at[p] = self._gen
        self.owned -= parts
        out: list[Any] = []
        back: list[KmqMessage] = []
        again = parts.intersection(rewound)
        emptied = False
        for i, batch in enumerate(self.pending):
            drop = again if i < self._committing else parts
            if drop.intersection(batch.spans):
                # A batch handed over at START has no messages left here (user code has them): only
                # its offsets go, which this member must not commit any more.
                back.extend(batch.drop(drop))
                if not batch.spans and i >= self._committing:
                    batch.state = GIVEN_BACK
                    emptied = True
        if emptied:
            kept = [b for i, b in enumerate(self.pending) if i < self._committing or b.state is not GIVEN_BACK]
            self.pending = deque(kept)
        if back:
            out.append(GiveBack(back, f"partitions {sorted(parts)} revoked before the commit"))
        return out

    def commit_back(self, partitions: Iterable[int], ready: Iterable[tuple[list[KmqMessage], int]]) -> CommitBack:
        """``partitions`` are about to be revoked (the rebalance callback, before :meth:`revoked`);
        ``ready``: their ready messages, taken out of the ready queue (``(messages, gen)`` groups,
        none of them stale). What to commit before they go (:class:`CommitBack`). Reads snapshots
        and changes nothing: safe from a rebalance callback on another thread (kafka-python's I/O
        thread), while the fetcher thread moves batches on; a batch handed over meanwhile keeps the
        hand-off lease only until lease keeping renews it."""
        mine = set(partitions)
        handoff: dict[int, list[int]] = {}
        for msgs, _gen in ready:
            for m in msgs:
                handoff.setdefault(m.partition, []).append(m.offset)
        rewind = {p: min(offs) for p, offs in handoff.items()}  # committed back to the first ready one
        forward = self.handed_ends(mine, rewind)
        # Batches between START and commit go back too (:meth:`revoked` gives them back): their leases
        # are handed off as well.
        for batch in list(self.pending):
            if batch.handed:
                continue  # user code has them: their leases are its own
            for p, offs in dict(batch.offsets).items():
                if p in mine and not self.stale(p, batch.gen):
                    handoff.setdefault(p, []).extend(offs)
        return CommitBack(rewind, forward, handoff)

    def assigned(self, partitions: Iterable[int]) -> None:
        """``partitions`` were assigned to this member (their positions are the group's committed offsets)."""
        self.owned.update(partitions)

    # ------------------------------------------------------------ decisions
    def next_poll(self, room: int, now: float, held: int = 0) -> PollStep:
        """The fetcher's next step, given ``room`` (records flow control lets it fetch; 0: none) and
        ``held`` (``consumer.ordering: key``: messages held back for their key, see ``max_held``)."""
        if self.max_held is not None and held >= self.max_held:
            room = 0
        if room > 0:
            self._blocked_since = None
        else:
            if self._blocked_since is None:
                self._blocked_since = now
            if not self.commit_retrying and (self.pending or now - self._blocked_since < self.backpressure_poll):
                return _WAIT  # handlers are behind: wait for settlements (or a START, a commit) without polling
        # Short polls while batches are between START and hand-over, so they move on soon; long
        # ones while a commit is retried: that is what lets kafka-python complete the rebalance.
        timeout = 0.5 if self.commit_retrying else ANSWER_POLL if self.pending else 0.1 if room > 0 else 0.05
        if self._head_stuck(now):
            return PollStep(0.0, 1, timeout, True)
        return PollStep(0.0, room if room > 0 else 1, timeout, room <= 0)

    def _head_stuck(self, now: float) -> bool:
        """The oldest pending batch has waited past ``max_head_wait`` (see the constructor)."""
        return (self.max_head_wait is not None and bool(self.pending)
                and now - self.pending[0].fetched_at > self.max_head_wait)

    def stale(self, partition: int, gen: int) -> bool:
        """Whether ``partition`` was revoked after something was fetched at generation ``gen``."""
        return self._revoked_at.get(partition, -1) > gen

    def handed_ends(self, partitions: Iterable[int], rewind: Mapping[int, int] | None = None) -> dict[int, int]:
        """Partition (of ``partitions``, not stale) -> the offset after the last message handed
        over at START whose commit has not succeeded yet: where a commit must go so the group does
        not deliver them again. The partitions of ``rewind`` (committed back to never-handed
        messages, which come after them, so that commit covers them) are left out. Empty unless
        ``hand_over_started``. Safe to call from a rebalance callback on another thread (it reads
        a snapshot)."""
        parts = set(partitions).difference(rewind or ())
        out: dict[int, int] = {}
        for b in list(self.pending):
            if not b.handed:
                break  # handed over in fetch order: the rest are not
            for p, (_first, last) in dict(b.spans).items():
                if p in parts and not self.stale(p, b.gen) and last >= out.get(p, 0):
                    out[p] = last + 1
        return out

    @property
    def commit_in_flight(self) -> bool:
        """A commit was sent and its answer is awaited (a commit past its timeout no longer is)."""
        return self._committing > 0

    @property
    def gen(self) -> int:
        """The current revocation generation (what a batch fetched now records)."""
        return self._gen

    def close_plan(self, ready: Iterable[tuple[list[KmqMessage], int]], assigned: set[int]) -> ClosePlan:
        """What closing does with the never-handed messages: ``ready`` (committed, waiting for
        user code: ``(messages, gen)`` groups) and the pending batches (not committed, or
        committing). ``assigned``: the partitions the Kafka client still holds. Pure: call it
        again after more rebalance events, the plan follows them."""
        owned = self.owned & assigned
        handoff: dict[int, list[int]] = {}
        nack: list[KmqMessage] = []
        back: list[KmqMessage] = []
        groups = [(msgs, gen, True) for msgs, gen in ready]
        groups += [(b.messages, b.gen, False) for b in self.pending]
        for msgs, gen, committed in groups:
            back.extend(msgs)
            for m in msgs:
                p = m.partition
                if p in owned and not self.stale(p, gen):
                    handoff.setdefault(p, []).append(m.offset)
                elif committed:
                    nack.append(m)
        rewind = {p: min(offs) for p, offs in handoff.items()}
        return ClosePlan(rewind, nack, back, handoff, self.handed_ends(owned, rewind))

    def closed(self) -> None:
        """Closing took everything out (after :meth:`close_plan` was carried out). The pipeline may
        be fed again afterwards (a consumer that left the group while its application stalled and
        joins again): nothing of the commits before is kept."""
        for batch in self.pending:
            batch.state = GIVEN_BACK
        self.pending.clear()
        self._committing = 0
        self._commit_tries = 0
        self.commit_retrying = False
        self._await_poll = False
        self._blocked_since = None

    # ------------------------------------------------------------ the machine
    def _advance(self, now: float, out: list[Any]) -> None:
        """Move the oldest batches along: a START answered -> commit (and, handing over at START,
        hand over); no answer in time -> failed."""
        pending = self.pending
        if self.hand_over_started:
            for b in pending:  # in fetch order: a batch waits for the STARTs of those before it
                if not b.handed:
                    if b.state is not STARTED:
                        break
                    self._hand_over(b, out)
        while pending:
            if self._committing:
                if now - self._commit_sent_at < self.commit_timeout:
                    return
                # kafka-python can lose a response across a broker restart: the future never completes.
                self._commit_failed(f"no answer within {self.commit_timeout:g}s", out)
                continue
            head = pending[0]
            if head.state is STARTING and now - head.fetched_at >= self.start_timeout:
                # kafka-python's producer can lose a batch across a broker restart: its future
                # never completes. Past the write timeout, the START counts as failed.
                head.state = START_FAILED
                head.error = f"no answer from Kafka within {self.start_timeout:g}s"
            if head.state is START_FAILED:
                self._give_back_all(f"START marker for {_spans([head])} failed ({head.error})", True, out)
                return
            if head.state is not STARTED or self._await_poll or self._commit(now, out):
                return

    @staticmethod
    def _hand_over(batch: FetchBatch, out: list[Any]) -> None:
        """The batch's messages go to user code (:class:`HandOver`); the batch keeps its offsets."""
        messages, batch.messages = batch.messages, []
        scheduled, batch.scheduled = batch.scheduled, []
        batch.handed = True
        if messages:
            out.append(HandOver(batch, messages, scheduled))

    def _commit(self, now: float, out: list[Any]) -> bool:
        """One commit for the STARTED batches at the head (commits are round trips, one at a time).
        False when there was nothing left in them to commit (they are dropped)."""
        pending = self.pending
        n = 1
        while n < len(pending) and pending[n].state is STARTED:
            n += 1
        batches = tuple(islice(pending, n))
        offsets: dict[int, int] = {}
        for b in batches:
            for p, (_first, last) in b.spans.items():
                if last >= offsets.get(p, 0):
                    offsets[p] = last + 1
        if not offsets:  # nothing left in them (stale partitions taken out): nothing to commit
            for _ in range(n):
                pending.popleft().state = GIVEN_BACK
            self._commit_tries = 0
            self.commit_retrying = False
            return False
        self._committing = n
        self._commit_sent_at = now
        self._commit_tries += 1
        out.append(Commit(offsets, batches))
        return True

    def _commit_failed(self, error: Any, out: list[Any]) -> None:
        """Whether a failed commit was applied is not certain (a rebalance may have raced it), so
        neither hand over nor seek back: commit again after the next poll, without the partitions
        revoked meanwhile. After ``max_commit_tries``, give everything back and fetch it again."""
        n, self._committing = self._committing, 0
        batches = list(islice(self.pending, n))
        what = _spans(batches)  # before the stale partitions are taken out: what the commit was for
        tries = self._commit_tries
        back: list[KmqMessage] = []
        for b in batches:
            stale = {p for p in b.spans if self.stale(p, b.gen)}
            if stale:
                back.extend(b.drop(stale))
        if back:
            out.append(GiveBack(back, "partitions revoked while their commit failed"))
        if tries >= self.max_commit_tries:
            # Still failing (~20 s of retries): give the batches back and fetch them again rather
            # than stall the partitions (a copy at worst if a failed commit did land).
            self._give_back_all(f"committing offsets {what} kept failing ({error})", False, out)
            return
        if not any(b.spans for b in batches):  # nothing left to commit: dropped after the next poll
            log.info("committing offsets %s failed (%s); those partitions were revoked meanwhile", what, error)
        elif tries == 1:
            log.warning("committing offsets %s failed (%s); retrying until it succeeds or the partitions are "
                        "revoked", what, error)
        elif tries % 50 == 0:
            log.warning("committing offsets %s still failing after %d tries (%s)", what, tries, error)
        self.commit_retrying = True
        self._await_poll = True

    def _give_back_all(self, why: str, start_failed: bool, out: list[Any]) -> None:
        """A START or commit failed: nothing pending is committed or handed over. Give it all back
        and seek each partition still ours back to its first record, so it is fetched (and
        STARTed) again; later batches go too, so no commit passes the failed records."""
        back: list[KmqMessage] = []
        first: dict[int, int] = {}
        handed: dict[int, tuple[int, int]] = {}
        for b in self.pending:
            b.state = GIVEN_BACK
            if b.handed:  # user code has them: neither given back nor fetched again
                handed = _spans([b], handed)
                continue
            back.extend(b.messages)
            for p, (lo, _hi) in b.spans.items():
                if p in self.owned and not self.stale(p, b.gen) and lo < first.get(p, lo + 1):
                    first[p] = lo
        if handed:
            log.warning("%s; offsets %s were handed over before their commit and stay uncommitted until a later "
                        "commit of their partitions covers them (if a partition moves first, the group delivers "
                        "them again)", why, handed)
        self.pending.clear()
        self._committing = 0
        self._commit_tries = 0
        self.commit_retrying = False
        self._await_poll = False
        if back or not handed:
            out.append(GiveBack(back, why))
        out.append(SeekBack(first, why, start_failed))


def _spans(batches: Iterable[FetchBatch], out: dict[int, tuple[int, int]] | None = None) -> dict[int, tuple[int, int]]:
    """Partition -> (first, last) offset over ``batches`` (for log lines), added to ``out``."""
    out = {} if out is None else out
    for b in batches:
        for p, (lo, hi) in b.spans.items():
            mine = out.get(p)
            out[p] = (min(lo, mine[0]), max(hi, mine[1])) if mine else (lo, hi)
    return out
