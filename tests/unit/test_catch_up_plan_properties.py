"""kmq.core.catch_up_plan over random histories of a markers log and its broker: committed offsets
read or not, offsets below the log start or past its end, log ends answered in part, positions the
client cannot tell yet or does not answer, markers appended and read, membership doubts, confirming
commits accepted or refused, time passing. No I/O: each action is answered from a model of the log.

At every step:

* at most ``per_step`` partitions are positioned or looked up at a time, the first ones in
  partition order; a partition is sought to its committed offset (the log start if none);
* a look-up asks only positioned partitions without a target, from their committed offsets, those
  whose last look-up was answered apart from those whose last one was not (``failing``), never one
  before its own backoff ended;
* a partition is caught up only once its position reached a log end read after its last seek, its
  read-through time is the time of that look-up, and one re-read after a membership doubt only once
  the group accepted a commit of its committable offset; a confirming commit waits the retry time
  after one that failed, and only the first failure of a series is to be logged;
* reading that resumed elsewhere than at the committed offset is noticed, with both offsets;
* the partitions pending are exactly those not caught up;

and once the broker answers everything, every partition catches up within a bounded number of steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.config import Config
from kmq.core import catch_up_plan as plan
from kmq.core.catch_up_plan import CLOCK, CONFIRM_RETRY_MS, CatchUpPlan, Ends, Failed, Refused
from kmq.core.errors import BrokerUnavailable, LogReadError
from kmq.core.lease_state import PartitionState
from tracker.partition import OwnedPartition

PER_STEP = 3
Q = Config.from_dict({"queues": [{"name": "q", "lease": "1s"}]}).queues[0]


@dataclass
class Log:
    """The markers log of each partition as the broker and the group consumer see it."""

    start: dict
    end: dict
    committed: dict  # the group's committed offsets (None: none)
    pos: dict = field(default_factory=dict)  # the consumer's position, once sought
    seq: int = 0  # counts the actions: orders seeks and look-ups
    sought: dict = field(default_factory=dict)  # tp -> seq of its last seek to its committed offset
    sought_at: dict = field(default_factory=dict)  # tp -> the committed offset it was last positioned at
    asked: dict = field(default_factory=dict)  # tp -> (seq, ask time, log end then) of its last answered look-up


@dataclass
class Answers:
    """Which answers a step's broker gives: drawn (a random history) or all good (the broker is back)."""

    data: st.DataObject | None

    def draw(self, strategy, good, label):
        return good if self.data is None else self.data.draw(strategy, label=label)


class History:
    def __init__(self, n: int, data: st.DataObject) -> None:
        tps = [("q__markers", p) for p in range(n)]
        start = {tp: data.draw(st.integers(0, 3), label="log start") for tp in tps}
        end = {tp: start[tp] + data.draw(st.integers(0, 6), label="log length") for tp in tps}
        committed = {tp: data.draw(st.none() | st.integers(max(0, start[tp] - 2), end[tp] + 3), label="committed")
                     for tp in tps}
        self.log = Log(start, end, committed)
        self.now = 1_000
        self.touched: list = []
        self.plan = CatchUpPlan(PER_STEP, self.touched.append)
        self.owned = {tp: OwnedPartition(Q, tp, PartitionState(Q.backoff.delay, Q.max_deliveries)) for tp in tps}
        self.plan.pending = set(self.owned)
        self.unconfirmed: set = set()  # re-read after a doubt, no commit of it accepted since
        self.notices: list = []
        self.confirm_after = 0
        self.warned = False

    # ------------------------------------------------------------ the log's side of each action
    def answer(self, action, answers: Answers, failing: bool = False):
        log, owned = self.log, self.owned
        log.seq += 1
        if action is CLOCK:
            self.now += answers.draw(st.integers(0, 300), 0, "time passes meanwhile")
            return self.now
        if isinstance(action, plan.ReadCommitted):
            waiting = sorted(tp for tp in self.plan.pending if not owned[tp].positioned)
            assert action.tps == waiting[:PER_STEP]
            if answers.draw(st.booleans(), False, "committed offsets not read"):
                return Failed(BrokerUnavailable("coordinator away"))
            return {tp: log.committed[tp] for tp in action.tps}
        if isinstance(action, plan.Seek):
            o = owned[action.tp]
            if o.positioned:  # the check before comparing: a committed offset past the log end
                assert action.offset is None and o.resume_from is not None and o.resume_from > o.target
            else:
                assert action.offset == log.committed[action.tp]
                log.sought_at[action.tp] = action.offset
                log.sought[action.tp] = log.seq
            log.pos[action.tp] = log.start[action.tp] if action.offset is None else action.offset
            return plan.OK
        if isinstance(action, plan.ReadPosition):
            how = answers.draw(st.sampled_from(["known", "unknown", "failed"]), "known", "position")
            if how == "failed":
                return Failed(BrokerUnavailable("leader away"))
            return log.pos[action.tp] if how == "known" else None
        if isinstance(action, plan.ReadEnds):
            return self.ends(action, answers, failing)
        if isinstance(action, plan.Commit):
            return self.commit(action, answers)
        self.notices.append(action)
        self.check_notice(action)
        return plan.OK

    def ends(self, action: plan.ReadEnds, answers: Answers, failing: bool):
        log = self.log
        assert 0 < len(action.from_offsets) <= PER_STEP
        for tp, committed in action.from_offsets.items():
            o = self.owned[tp]
            assert tp in self.plan.pending and o.positioned and o.target is None
            assert committed == o.committed
            assert bool(o.lookup_failures) == failing, "a failing partition asked with the others, or the reverse"
            assert o.recheck_ms <= self.now, "asked again before its backoff ended"
        if answers.draw(st.booleans(), False, "look-up failed"):
            return Failed(LogReadError("no leader"))
        answered = answers.draw(st.sets(st.sampled_from(sorted(action.from_offsets))), set(action.from_offsets),
                                "answered")
        for tp in answered:
            log.asked[tp] = (log.seq, self.now, log.end[tp])
        return Ends({tp: log.end[tp] for tp in answered},
                    {tp: "not leader" for tp in action.from_offsets if tp not in answered})

    def commit(self, action: plan.Commit, answers: Answers):
        assert self.now >= self.confirm_after, "a confirming commit before the retry time"
        for tp, offset in action.offsets.items():
            o = self.owned[tp]
            assert o.doubted and o.state.position >= o.target and offset == o.state.committable_offset()
        how = answers.draw(st.sampled_from(["accepted", "fenced", "failed"]), "accepted", "commit")
        if how == "accepted":
            self.unconfirmed -= set(action.offsets)
            for tp, offset in action.offsets.items():
                self.log.committed[tp] = offset
            return plan.OK
        self.confirm_after = self.now + CONFIRM_RETRY_MS
        return Refused(BrokerUnavailable("refused"), how == "fenced")

    def check_notice(self, notice) -> None:
        if isinstance(notice, plan.ConfirmRefused):
            assert notice.first == (not self.warned), "every refusal logged, or the first not"
            self.warned = True
        elif isinstance(notice, plan.Confirmed):
            self.warned = False
        elif isinstance(notice, plan.ResumedElsewhere):
            gap = notice.partition.tp, notice.gap
            assert gap[1].committed == self.log.sought_at[gap[0]] and gap[1].resumed_at != gap[1].committed
        elif isinstance(notice, plan.TargetsUnread):
            assert all(o.recheck_ms > self.now and o.lookup_failures for o in notice.partitions)

    # ------------------------------------------------------------ the service's side
    def drive(self, steps, answers: Answers, failing: bool = False):
        try:
            action = next(steps)
            while True:
                action = steps.send(self.answer(action, answers, failing))
        except StopIteration as done:
            return done.value

    def read_markers(self, answers: Answers, positioned_before: set) -> None:
        """A fetch: a position outside the log resets to its start (as the consumer's offset reset
        does); positioned partitions read some markers, the first read checked against the commit."""
        log = self.log
        for tp in positioned_before:
            if tp not in log.pos:
                continue
            if not log.start[tp] <= log.pos[tp] <= log.end[tp]:
                log.pos[tp] = log.start[tp]
            read = answers.draw(st.integers(0, log.end[tp] - log.pos[tp]), log.end[tp] - log.pos[tp], "read")
            if not read:
                continue
            o = self.owned[tp]
            if o.resume_from is not None:
                gap = plan.resumed(o, log.pos[tp])
                if gap is not None:
                    self.check_notice(plan.ResumedElsewhere(o, gap))
            log.pos[tp] += read
            o.state.position = log.pos[tp]

    def doubt(self) -> None:
        """What the service's drop_view does: every partition re-read, redelivered from only once the
        group accepted a commit for it."""
        for o in self.owned.values():
            o.state = PartitionState(Q.backoff.delay, Q.max_deliveries)
            o.positioned = o.caught_up = False
            o.doubted = True
            o.target = o.committed = None
        self.plan.pending = set(self.owned)
        self.unconfirmed = set(self.owned)

    def step(self, answers: Answers) -> None:
        positioned_before = {tp for tp, o in self.owned.items() if o.positioned}
        self.drive(self.plan.position(self.owned), answers)
        self.read_markers(answers, positioned_before)
        pending = set(self.plan.pending)
        self.drive(self.plan.read_targets(self.owned, self.now), answers)
        caught = self.drive(self.plan.reach(self.owned), answers)
        self.check_caught(caught, pending)
        self.drive(self.plan.read_targets(self.owned, self.now, failing=True), answers, failing=True)
        assert self.plan.pending == {tp for tp, o in self.owned.items() if not o.caught_up}

    def check_caught(self, caught: list, pending: set) -> None:
        assert {o.tp for o in caught} == {tp for tp in pending if self.owned[tp].caught_up}
        for o in caught:
            seq, ask_ms, end = self.log.asked[o.tp]
            assert seq > self.log.sought[o.tp], "caught up to a log end read before its seek"
            assert o.state.position >= end, "caught up before its position reached the log end"
            pos, start = self.log.pos[o.tp], self.log.start[o.tp]
            real = pos if start <= pos <= self.log.end[o.tp] else start  # where the consumer's fetch goes on
            assert real >= end, "caught up where the consumer is not: it reads on from before the log end"
            assert o.read_through_ms == ask_ms
            assert o.tp not in self.unconfirmed, "redelivery enabled before the group accepted a commit"


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 7), data=st.data())
def test_a_partition_catches_up_only_to_a_log_end_read_after_its_seek_and_at_last_always(n, data):
    h = History(n, data)
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        h.now += data.draw(st.integers(0, 5_000), label="time passes")
        for tp in h.owned:
            h.log.end[tp] += data.draw(st.integers(0, 2), label="markers written")
        if data.draw(st.integers(0, 9), label="membership doubt") == 0:
            h.doubt()
        h.step(Answers(data))
    # The broker answers everything from now on: the backoffs (30 s at most) and the confirming
    # commit's retry time end within a step each, so every partition catches up within these.
    good = Answers(None)
    for _ in range(3 * (-(-n // PER_STEP)) + 3):
        h.now += 31_000
        h.step(good)
    assert not h.plan.pending and all(o.caught_up for o in h.owned.values())
