"""kmq.core.redelivery_run against a simulated queue log and producer: its safety rules hold for
random logs, reads, send results and failures, without I/O.

The simulator plays the queue partition (a log start below which records are deleted, a log end
at or past which nothing is written yet, reads that end early or stop short, a reader that also
reports offsets past the end it ran into as missing) and the producer (each send acknowledged,
refused for now or for good); any read, send or CLOSED marker may fail. It carries out the run's
actions as ``tracker/redeliver.py`` does and checks:

* nothing is closed without proof: an offset leaves the state only if a read reported it missing
  below the log start (and its CLOSED marker was acknowledged), or Kafka acknowledged its copy,
  dead letter or reference (or refused even the reference for good);
* a CLOSED marker of an outcome comes only after the judgement of the sends it closes;
* nothing at or past the end a read ran into is read again in the same run, nor closed;
* every offset is read at most once a run, and after a failure nothing more is read;
* the originals held for sends not judged yet stay under the round's bytes before each read;
* every due offset ends closed, or open and handed out again later (never left taken).
"""

from __future__ import annotations

from collections import namedtuple

from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.config import BackoffConfig
from kmq.core.copies import Step
from kmq.core.lease_state import PartitionState
from kmq.core.markers import Outcome, Reject, Start
from kmq.core.redelivery_plan import SENT, SendResult
from kmq.core.redelivery_run import (
    CLOCK,
    OK,
    CloseMissing,
    Failed,
    Judge,
    Judged,
    Read,
    ReadResult,
    RedeliveryRun,
    Started,
    StartSends,
    WriteClosed,
)

Rec = namedtuple("Rec", "key value headers")
BACKOFF = BackoffConfig(initial=1.0, max=8.0, multiplier=2.0)
MAX_DELIVERIES = 3
NOW = 100_000
TRANSIENT = SendResult("send_failed", False, "timed out")
REFUSED = SendResult("too_large", True, "too large")


class Boom(Exception):
    """A read, send or CLOSED marker that failed."""


class World:
    """The queue partition, the producer and the checks (module docstring)."""

    def __init__(self, data, n: int, log_start: int, log_end: int, fail_rate: int) -> None:
        self.data, self.n, self.log_start, self.log_end = data, n, log_start, log_end
        self.fail_rate = fail_rate  # in 100: how often an I/O action fails
        self.state = PartitionState(BACKOFF.delay, MAX_DELIVERIES)
        self.state.apply(Start([(0, n)], lease_ms=1_000, owner="w"), 0, 0)
        rejected = data.draw(st.sets(st.integers(0, n - 1), max_size=n // 3), label="rejected")
        for i, off in enumerate(sorted(rejected)):
            self.state.apply(Reject([(off, 1)], reason="bad"), 1 + i, 500)
        counts = data.draw(st.lists(st.integers(1, MAX_DELIVERIES + 1), min_size=n + 2, max_size=n + 2),
                           label="counts")
        tombstones = data.draw(st.sets(st.integers(0, n - 1), max_size=2), label="tombstones")
        self.log = {off: Rec(b"k", None if off in tombstones else b"v" * (1 + off % 7),
                             [("kmq-delivery-count", str(counts[off]).encode())])
                    for off in range(log_start, log_end)}
        self.now = NOW
        self.batches: dict[int, list] = {}  # handle -> sends started
        self.unjudged: dict[int, int] = {}  # handle -> payload bytes of its read (0 for fallbacks)
        self.proven: dict[Outcome, set[int]] = {o: set() for o in Outcome}  # offsets each outcome may close
        self.read_offsets: set[int] = set()
        self.end_seen: int | None = None
        self.failed = False
        self.actions = 0
        self.last_size = 0
        self.round_bytes = 0
        self.whole = False  # every read reaches the log end and reads all it asks for

    def fails(self) -> bool:
        return self.data.draw(st.integers(0, 99), label="fails") < self.fail_rate

    # ------------------------------------------------------------ carrying out
    def answer(self, action):
        self.actions += 1
        assert self.actions < 5_000, "the run does not end"
        self.now += 1
        if action is CLOCK:
            return self.now
        handler = {Read: self.read, CloseMissing: self.close_missing, StartSends: self.start,
                   Judge: self.judge, WriteClosed: self.write_closed}.get(type(action))
        return handler(action) if handler else OK

    def read(self, action: Read):
        assert not self.failed, "read again after a failure"
        assert action.items, "an empty read"
        offs = {o for r in action.ranges for o in r.offsets()}
        assert not offs & self.read_offsets, "an offset read twice in one run"
        assert self.end_seen is None or max(offs) < self.end_seen, "read past the end a read ran into"
        assert sum(self.unjudged.values()) < self.round_bytes, "originals held past the round's bytes"
        self.read_offsets |= offs
        if self.fails():
            self.failed = True
            return Failed(Boom("read timed out"))
        # The read ends at the log end, or earlier (a lagging high-water mark), or stops short.
        end = self.log_end if self.whole else self.data.draw(st.integers(self.log_start, self.log_end),
                                                             label="read end")
        short = not self.whole and self.data.draw(st.booleans(), label="stops short")
        records = {o: self.log[o] for o in sorted(offs) if self.log_start <= o < end}
        if short and records:
            records.pop(max(records))
        # Past the end: some readers report such offsets as missing too; never proof.
        missing = [(o, 1) for o in sorted(offs) if o < self.log_start or (o >= end and not self.whole and self.data.draw(
            st.booleans(), label="past end reported missing"))]
        ran_into = end if any(o >= end for o in offs) else None
        if ran_into is not None:
            self.end_seen = ran_into if self.end_seen is None else min(self.end_seen, ran_into)
        self.proven[Outcome.MISSING] |= {o for o, _ in missing if o < self.log_start}
        size = sum(len(r.value or b"") + len(r.key or b"") for r in records.values())
        self.last_size = size
        return ReadResult(records, missing, ran_into, size, self.now)

    def close_missing(self, action: CloseMissing):
        gone = {o for r in action.ranges for o in r.offsets()}
        assert gone <= self.proven[Outcome.MISSING], f"closed as missing without proof: {gone}"
        if self.fails():
            self.failed = True
            return Failed(Boom("CLOSED not acknowledged"))
        return OK

    def start(self, action: StartSends):
        assert all(s.offset in action.records for s in action.sends)
        if self.fails():
            self.failed = True
            return Failed(Boom("producer closed"))
        handle = len(self.batches)
        self.batches[handle] = action.sends
        self.unjudged[handle], self.last_size = self.last_size, 0  # a chunk's sends hold its read; fallbacks none
        return Started(handle)

    def judge(self, action: Judge):
        if self.fails():
            self.failed = True
            return Failed(Boom("flush failed"))
        out = []
        for h in action.handles:
            self.unjudged.pop(h, None)
            results = self.results(len(self.batches[h]))
            for s, res in zip(self.batches[h], results):
                if res is SENT:
                    self.proven[{Step.COPY: Outcome.REDELIVERED, Step.DEAD_LETTER: Outcome.DEAD_LETTERED,
                                 Step.REFERENCE: Outcome.UNDELIVERABLE}[s.step]].add(s.offset)
                elif res is REFUSED and s.step is Step.REFERENCE:
                    self.proven[Outcome.UNDELIVERABLE].add(s.offset)  # not even a reference: closed, logged
            out.append(results)
        return Judged(out)

    def results(self, n: int) -> list[SendResult]:
        return self.data.draw(st.lists(st.sampled_from([SENT, SENT, TRANSIENT, REFUSED]), min_size=n, max_size=n),
                              label="results")

    def write_closed(self, action: WriteClosed):
        offs = {o for r in action.ranges for o in r.offsets()}
        assert offs <= self.proven[action.outcome], f"CLOSED {action.outcome.name} before its acknowledgement"
        if self.fails():
            self.failed = True
            return Failed(Boom("CLOSED not acknowledged"))
        return OK


@st.composite
def worlds(draw):
    n = draw(st.integers(1, 24), label="offsets")
    log_start = draw(st.integers(0, n), label="log start")
    log_end = draw(st.integers(log_start, n + 2), label="log end")
    return n, log_start, log_end


@settings(max_examples=300, deadline=None)
@given(shape=worlds(), fail_rate=st.sampled_from([0, 0, 5, 20]), read_chunk=st.integers(1, 6),
       round_bytes=st.integers(1, 60), data=st.data())
def test_nothing_is_closed_without_proof_and_every_due_offset_ends_closed_or_handed_out_again(
        shape, fail_rate, read_chunk, round_bytes, data):
    n, log_start, log_end = shape
    w = World(data, n, log_start, log_end, fail_rate)
    w.round_bytes = round_bytes
    items = w.state.due(NOW)
    assert items
    before = {o for i in items for r in i.ranges for o in r.offsets()}
    run = RedeliveryRun(w.state, items, 8.0, chunk_bytes=8 * read_chunk, read_chunk=read_chunk,
                        round_bytes=round_bytes)
    action = run.start()
    while action is not None:
        action = run.send(w.answer(action))
    closed = {o for o in before if not w.state.is_open(o)}
    proven = set().union(*w.proven.values())
    assert closed <= proven, f"closed without proof: {sorted(closed - proven)}"
    assert not {o for o in closed if w.end_seen is not None and o >= w.end_seen and o not in proven}
    # Nothing is left taken: every offset still open is handed out again.
    again = {o for i in w.state.due(NOW + 10**9) for r in i.ranges for o in r.offsets()}
    assert before - closed <= again, f"left taken: {sorted(before - closed - again)}"


class AllSent(World):
    """A whole log, no failure, every send acknowledged; records the sends started."""

    def __init__(self, data, n: int) -> None:
        super().__init__(data, n, 0, n, 0)
        self.round_bytes = 10**9
        self.whole = True
        self.sent: list[tuple[int, Step]] = []

    def start(self, action: StartSends):
        self.sent.extend((s.offset, s.step) for s in action.sends)
        return super().start(action)

    def results(self, n: int) -> list[SendResult]:
        return [SENT] * n


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 30), read_chunk=st.integers(1, 8), data=st.data())
def test_with_a_whole_log_and_every_send_acknowledged_each_due_offset_is_sent_once_and_closed(n, read_chunk, data):
    w = AllSent(data, n)
    run = RedeliveryRun(w.state, w.state.due(NOW), 8.0, chunk_bytes=8 * read_chunk, read_chunk=read_chunk,
                        round_bytes=w.round_bytes)
    action = run.start()
    while action is not None:
        action = run.send(w.answer(action))
    assert sorted(o for o, _ in w.sent) == list(range(n)), "one send per due offset"
    assert w.state.in_flight == 0
