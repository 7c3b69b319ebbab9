"""kmq.consumer.fetch_pipeline: the decisions the consumer's I/O shell used to make itself, as
properties of the pure pipeline (no broker, no thread, no clock):

* the ``consumer.ordering: key`` fetch bound (``max_held``): at the bound nothing is fetched, and
  below it the pipeline steps exactly as one without the bound;
* the one look at a poll's headers: each record is delivered here or skipped as another group's
  copy, exactly once, and the hand-over names exactly its scheduled records (``kmq-not-before``),
  so deciding for those alone holds back what deciding for every record would;
* the commit before a revocation (:meth:`FetchPipeline.commit_back`) is in
  ``test_fetch_pipeline_properties.py`` (the revoke callback of the simulated group) and below.
"""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.consumer.fetch_pipeline import FetchPipeline, HandOver, Skip, WriteStarts
from kmq.consumer.scheduled import hold_back_scheduled
from kmq.core.message import HEADER_GROUP, KmqMessage
from kmq.core.schedule import HEADER_NOT_BEFORE

LOCK = threading.Lock()
NOW_MS = 1_765_000_000_000
LONGEST = 3_600_000


# ------------------------------------------------------------------ ordering: key, the fetch bound
steps = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 40), st.sampled_from([0.0, 0.1, 0.3, 0.6])),
                 max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(1, 30), st.booleans())
def test_at_the_key_order_bound_nothing_is_fetched_and_below_it_the_bound_changes_nothing(seq, bound, pending):
    bounded = FetchPipeline(5.0, 10.0, max_held=bound)
    plain = FetchPipeline(5.0, 10.0)
    for pipe in (bounded, plain):
        pipe.assigned({0})
        if pending:  # a batch between START and commit: the polls are short, and no room means waiting
            pipe.polled([KmqMessage("q", 0, 0, None, b"v", [], 0, None, LOCK)], 0.0)
    now = 0.0
    for room, held, dt in seq:
        now += dt
        step = bounded.next_poll(room, now, held)
        if held >= bound:
            assert step.wait or (step.pause_all and step.max_records == 1), step  # no record fetched
        # What the shell used to do itself: no room at the bound.
        assert step == plain.next_poll(0 if held >= bound else room, now)


# ------------------------------------------------------------------ one look at the headers
def _headers(kind: str, p: int, due: int) -> list[tuple[str, bytes]] | None:
    scheduled = [(HEADER_NOT_BEFORE, b"%d" % due)]
    return {
        "plain": None,
        "traced": [("trace", b"x")],
        "scheduled": [("trace", b"x"), *scheduled],
        "mine": [("kmq-origin", f"q/{p}/1000".encode()), (HEADER_GROUP, b"billing")],
        "mine-scheduled": [("kmq-origin", f"q/{p}/1000".encode()), (HEADER_GROUP, b"billing"), *scheduled],
        "other": [("kmq-origin", f"q/{p}/1000".encode()), (HEADER_GROUP, b"shipping")],
        "other-scheduled": [("kmq-origin", f"q/{p}/1000".encode()), (HEADER_GROUP, b"shipping"), *scheduled],
    }[kind]


class Settled:
    def __init__(self) -> None:
        self.outcomes: list[tuple[int, int, str]] = []

    def settled(self, msg: KmqMessage, outcome: str, arg: object) -> None:
        self.outcomes.append((msg.partition, msg.offset, outcome))

    def renewed(self, msg: KmqMessage, lease: float | None) -> None:
        pass


records = st.lists(st.tuples(st.sampled_from([0, 1]), st.sampled_from(
    ["plain", "traced", "scheduled", "mine", "mine-scheduled", "other", "other-scheduled"]),
    st.sampled_from([-5000, 0, 2500, 10 * LONGEST])), max_size=30)


def _poll(spec, settler) -> list[KmqMessage]:
    offsets = {0: 0, 1: 0}
    out = []
    for p, kind, delay in spec:
        out.append(KmqMessage("q", p, offsets[p], None, b"v", _headers(kind, p, NOW_MS + delay), 0, settler, LOCK))
        offsets[p] += 1
    return out


@settings(max_examples=300, deadline=None)
@given(records, st.booleans(), st.sampled_from([None, 0, 1]))
def test_one_look_at_the_headers_skips_other_groups_copies_and_names_the_scheduled_records(spec, started, revoke):
    def at(ms: list[KmqMessage]) -> list[tuple[int, int]]:
        return [(m.partition, m.offset) for m in ms]

    settler = Settled()
    polled = _poll(spec, settler)
    pipe = FetchPipeline(5.0, 10.0, group="billing", hand_over_started=started)
    pipe.assigned({0, 1})
    actions = pipe.polled(polled, 0.0)
    skipped = [m for a in actions if isinstance(a, Skip) for m in a.messages]
    starts = [a for a in actions if isinstance(a, WriteStarts)]
    delivered = [m for a in starts for m in a.batch.messages]
    kinds = {(m.partition, m.offset): kind for m, (_, kind, _) in zip(polled, spec)}
    assert sorted(at(delivered + skipped)) == sorted(at(polled))  # each record once
    assert all(kinds[k].startswith("other") for k in at(skipped))
    assert not any(kinds[k].startswith("other") for k in at(delivered))
    if not starts:
        return
    batch = starts[0].batch
    if revoke is not None:
        pipe.revoked({revoke})
    handed = pipe.start_answered(batch, None, 0.1)
    handed += pipe.commit_answered(None, 0.2)
    [over] = [a for a in handed if isinstance(a, HandOver)] or [HandOver(batch)]
    assert at(over.messages) == [k for k in at(delivered) if k[0] != revoke]
    assert at(over.scheduled) == [k for k in at(over.messages) if kinds[k].endswith("scheduled")]
    # Deciding for the scheduled ones alone holds back what deciding for all of them does.
    kept = hold_back_scheduled(over.messages, over.scheduled, LONGEST, "q", lambda *_: None, now_ms=NOW_MS)
    assert at(kept) == [(m.partition, m.offset) for m, (_, kind, delay) in zip(polled, spec)
                        if (m.partition, m.offset) in set(at(over.messages))
                        and not (kind.endswith("scheduled") and delay > 0)]
    assert sorted(k[:2] for k in settler.outcomes) == sorted(set(at(over.messages)) - set(at(kept)))


# ------------------------------------------------------------------ the commit before a revocation
def test_commit_back_rewinds_to_the_first_ready_message_and_hands_off_every_lease_going_back():
    pipe = FetchPipeline(5.0, 10.0)
    pipe.assigned({0, 1})
    ready = [KmqMessage("q", 0, o, None, b"v", [], 0, None, LOCK) for o in (3, 4)]
    [start] = pipe.polled([KmqMessage("q", p, o, None, b"v", [], 0, None, LOCK) for p, o in [(0, 5), (1, 9)]], 0.0)
    plan = pipe.commit_back({0}, [(ready, pipe.gen)])
    assert plan.offsets == plan.rewind == {0: 3} and plan.forward == {}
    assert plan.handoff == {0: [3, 4, 5]}  # the ready ones and the batch between START and commit
    assert start.batch.offsets == {0: [5], 1: [9]}  # a decision: nothing changed
