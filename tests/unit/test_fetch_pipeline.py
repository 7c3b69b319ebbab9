"""kmq.consumer.fetch_pipeline: fetch -> START -> commit -> hand over, event by event (pure, no broker)."""

from __future__ import annotations

import threading

from kmq.config import Config
from kmq.consumer.fetch_batch import GIVEN_BACK
from kmq.consumer.fetch_pipeline import ANSWER_POLL, Commit, FetchPipeline, GiveBack, HandOver, SeekBack, WriteStarts
from kmq.core.message import KmqMessage

LOCK = threading.Lock()


def msgs(spec: dict[int, range]) -> list[KmqMessage]:
    return [KmqMessage("q", p, o, None, b"v", [], 0, None, LOCK) for p, offs in spec.items() for o in offs]


def pipeline(**kw) -> FetchPipeline:
    kw = {"start_timeout": 5.0, "commit_timeout": 10.0, **kw}
    pipe = FetchPipeline(**kw)
    pipe.assigned({0, 1, 2})
    return pipe


def fetch(pipe: FetchPipeline, spec: dict[int, range], now: float = 0.0):
    actions = pipe.polled(msgs(spec), now)
    assert isinstance(actions[0], WriteStarts)
    return actions[0].batch


def kinds(actions: list) -> list[str]:
    return [type(a).__name__ for a in actions]


def offsets_of(messages) -> set[tuple[int, int]]:
    return {(m.partition, m.offset) for m in messages}


# ------------------------------------------------------------------ the happy path
def test_a_batch_is_handed_over_only_after_its_start_is_acknowledged_and_its_offsets_committed():
    pipe = pipeline()
    b = fetch(pipe, {0: range(0, 5), 1: range(10, 12)})
    assert b.offsets == {0: [0, 1, 2, 3, 4], 1: [10, 11]}
    assert pipe.tick(1.0) == []  # START not answered: nothing committed, nothing handed
    [commit] = pipe.start_answered(b, None, 1.0)
    assert isinstance(commit, Commit) and commit.offsets == {0: 5, 1: 12} and commit.batches == (b,)
    assert pipe.tick(2.0) == []  # commit in flight
    assert pipe.commit_answered(None, 2.0) == [HandOver(b)]
    assert not pipe.pending


def test_starts_answered_out_of_order_wait_for_the_oldest_then_share_one_commit():
    pipe = pipeline()
    b1 = fetch(pipe, {0: range(0, 3)})
    b2 = fetch(pipe, {0: range(3, 6), 1: range(0, 2)})
    assert pipe.start_answered(b2, None, 0.1) == []  # b1 first: a commit must not pass its records
    [commit] = pipe.start_answered(b1, None, 0.2)
    assert commit.offsets == {0: 6, 1: 2} and commit.batches == (b1, b2)
    assert pipe.commit_answered(None, 0.3) == [HandOver(b1), HandOver(b2)]


def test_batches_fetched_while_a_commit_is_in_flight_wait_for_it():
    pipe = pipeline()
    b1 = fetch(pipe, {0: range(0, 3)})
    pipe.start_answered(b1, None, 0.1)
    b2 = fetch(pipe, {0: range(3, 6)}, now=0.2)
    assert pipe.start_answered(b2, None, 0.3) == []  # one commit at a time
    actions = pipe.commit_answered(None, 0.4)
    assert actions[0] == HandOver(b1)
    assert isinstance(actions[1], Commit) and actions[1].offsets == {0: 6}


# ------------------------------------------------------------------ START failures
def test_a_failed_start_gives_back_every_pending_batch_and_seeks_back_to_the_first_offsets():
    pipe = pipeline()
    b1 = fetch(pipe, {0: range(0, 3), 1: range(7, 9)})
    b2 = fetch(pipe, {0: range(3, 6)})
    pipe.start_answered(b2, None, 0.1)  # b2 started, but it comes after b1: it must not be committed alone
    back, seek = pipe.start_answered(b1, "broker down", 0.2)
    assert isinstance(back, GiveBack) and offsets_of(back.messages) == offsets_of(b1.messages + b2.messages)
    assert isinstance(seek, SeekBack) and seek.offsets == {0: 0, 1: 7} and seek.start_failed
    assert "broker down" in seek.why and not pipe.pending
    assert b1.state is GIVEN_BACK and b2.state is GIVEN_BACK
    assert pipe.start_answered(b1, None, 0.3) == []  # a late answer of a given-back batch changes nothing


def test_a_later_failed_start_waits_for_the_commit_in_flight_then_goes_back_from_its_own_offsets():
    pipe = pipeline()
    b1 = fetch(pipe, {0: range(0, 3)})
    pipe.start_answered(b1, None, 0.1)  # b1 committing
    b2 = fetch(pipe, {0: range(3, 6)}, now=0.2)
    assert pipe.start_answered(b2, "refused", 0.3) == []  # b1's commit is uncertain: not given back
    handed, back, seek = pipe.commit_answered(None, 0.4)
    assert handed == HandOver(b1)
    assert offsets_of(back.messages) == {(0, 3), (0, 4), (0, 5)} and seek.offsets == {0: 3}


def test_a_start_without_an_answer_in_time_counts_as_failed():
    pipe = pipeline(start_timeout=5.0)
    fetch(pipe, {0: range(0, 2)}, now=100.0)
    assert pipe.tick(104.9) == []
    back, seek = pipe.tick(105.0)
    assert isinstance(back, GiveBack) and seek.offsets == {0: 0} and "no answer" in seek.why


def test_seek_back_leaves_out_a_partition_revoked_since_its_batch_was_fetched_even_if_it_came_back():
    pipe = pipeline()
    old = fetch(pipe, {0: range(0, 3), 1: range(50, 53)})
    [back] = pipe.revoked({1})
    assert offsets_of(back.messages) == {(1, 50), (1, 51), (1, 52)}
    pipe.assigned({1})  # back, positioned at the group's committed offset (an interim owner moved it to 80)
    new = fetch(pipe, {1: range(80, 82)})
    _, seek = pipe.start_answered(old, "refused", 1.0)
    assert seek.offsets == {0: 0, 1: 80}  # never back to 50: that is below the interim owner's commit
    assert new.state is GIVEN_BACK


# ------------------------------------------------------------------ rebalances
def test_a_start_acknowledged_after_a_revoke_commits_only_the_partitions_still_owned():
    pipe = pipeline()
    b = fetch(pipe, {0: range(0, 3), 1: range(0, 2)})
    [back] = pipe.revoked({1})
    assert offsets_of(back.messages) == {(1, 0), (1, 1)}  # the new owner polls them again
    [commit] = pipe.start_answered(b, None, 0.1)
    assert commit.offsets == {0: 3}
    [handed] = pipe.commit_answered(None, 0.2)
    assert offsets_of(handed.messages) == {(0, 0), (0, 1), (0, 2)}


def test_a_batch_left_empty_by_a_revoke_is_dropped():
    pipe = pipeline()
    b = fetch(pipe, {1: range(0, 2)})
    pipe.revoked({1})
    assert not pipe.pending and b.state is GIVEN_BACK
    assert pipe.start_answered(b, None, 0.1) == []


def test_the_commit_in_flight_decides_for_its_batches_a_success_hands_them_all_over():
    pipe = pipeline()
    b = fetch(pipe, {0: range(0, 3), 1: range(0, 2)})
    pipe.start_answered(b, None, 0.1)  # commit {0: 3, 1: 2} in flight
    later = fetch(pipe, {1: range(2, 4)}, now=0.2)
    [back] = pipe.revoked({1})
    assert offsets_of(back.messages) == {(1, 2), (1, 3)} and later.state is GIVEN_BACK  # not committed: back
    [handed] = pipe.commit_answered(None, 0.3)  # landed before the revoke: committed, nobody else gets them
    assert len(handed.messages) == 5


def test_a_partition_committed_back_before_its_revoke_is_fetched_again_by_the_new_owner_in_flight_commit_too():
    # Its ready messages were committed back (to offsets below the commit in flight, which lands
    # first): the new owner fetches that commit's records of it too, so they are not handed here.
    pipe = pipeline()
    b = fetch(pipe, {0: range(0, 3), 1: range(5, 7)})
    pipe.start_answered(b, None, 0.1)  # commit {0: 3, 1: 7} in flight
    later = fetch(pipe, {1: range(7, 9)}, now=0.2)
    [back] = pipe.revoked({1}, rewound={1})
    assert offsets_of(back.messages) == {(1, 5), (1, 6), (1, 7), (1, 8)} and later.state is GIVEN_BACK
    [handed] = pipe.commit_answered(None, 0.3)
    assert offsets_of(handed.messages) == {(0, 0), (0, 1), (0, 2)}
    assert not pipe.pending


def test_a_batch_of_the_commit_in_flight_emptied_by_a_rewound_revoke_is_handed_nowhere():
    pipe = pipeline()
    b = fetch(pipe, {1: range(5, 7)})
    pipe.start_answered(b, None, 0.1)
    [back] = pipe.revoked({1}, rewound={1})
    assert offsets_of(back.messages) == {(1, 5), (1, 6)}
    assert pipe.commit_answered(None, 0.2) == [] and not pipe.pending and not pipe.commit_in_flight


def test_a_commit_failure_then_reassign_never_commits_the_stale_partition():
    pipe = pipeline()
    b = fetch(pipe, {0: range(0, 3), 1: range(0, 2)})
    pipe.start_answered(b, None, 0.1)
    assert pipe.revoked({1}) == []  # in the commit in flight: its answer decides
    pipe.assigned({1})  # and back (the interim owner may have committed past these)
    [back] = pipe.commit_answered("rebalance in progress", 0.2)
    assert offsets_of(back.messages) == {(1, 0), (1, 1)}
    [commit] = pipe.polled([], 0.3)
    assert commit.offsets == {0: 3}  # partition 1's stale offsets are not committed on the retry


# ------------------------------------------------------------------ commit failures
def test_a_failed_commit_is_retried_only_after_the_next_poll_with_long_polls_meanwhile():
    pipe = pipeline()
    b = fetch(pipe, {0: range(0, 3)})
    pipe.start_answered(b, None, 0.1)
    assert pipe.commit_answered("coordinator moved", 0.2) == []  # neither handed over nor sought back
    assert pipe.commit_retrying and pipe.tick(0.3) == []
    assert pipe.next_poll(room=100, now=0.3).timeout == 0.5  # lets kafka-python finish the rebalance
    [commit] = pipe.polled([], 0.8)
    assert commit.offsets == {0: 3}
    assert pipe.commit_answered(None, 0.9) == [HandOver(b)] and not pipe.commit_retrying


def test_a_commit_without_an_answer_in_time_counts_as_failed():
    pipe = pipeline(commit_timeout=10.0)
    b = fetch(pipe, {0: range(0, 3)})
    pipe.start_answered(b, None, 0.0)
    assert pipe.tick(9.9) == [] and not pipe.commit_retrying
    assert pipe.tick(10.0) == [] and pipe.commit_retrying
    assert pipe.commit_answered(None, 10.1) == []  # the lost answer of the old commit is not this one's
    assert isinstance(pipe.polled([], 10.2)[0], Commit)


def test_a_commit_failing_max_tries_times_gives_everything_back_to_be_fetched_again():
    pipe = pipeline(max_commit_tries=2)
    b = fetch(pipe, {0: range(0, 3)})
    pipe.start_answered(b, None, 0.0)
    assert pipe.commit_answered("x", 0.1) == []
    pipe.polled([], 0.2)
    back, seek = pipe.commit_answered("x", 0.3)
    assert offsets_of(back.messages) == {(0, 0), (0, 1), (0, 2)}
    assert seek.offsets == {0: 0} and not seek.start_failed and "kept failing" in seek.why
    assert not pipe.pending and not pipe.commit_retrying


# ------------------------------------------------------------------ closing
def test_close_during_an_in_flight_start_commits_back_to_the_first_never_handed_offset():
    pipe = pipeline()
    ready = msgs({0: range(5, 8)})  # committed, waiting for user code
    b = fetch(pipe, {0: range(8, 10), 1: range(3, 4)})  # START in flight
    plan = pipe.close_plan([(ready, 0)], assigned={0, 1})
    assert plan.rewind == {0: 5, 1: 3} and plan.nack == []
    assert offsets_of(plan.give_back) == offsets_of(ready + b.messages)
    # Their leases are handed off before the commit back: every offset it returns to the group.
    assert {p: sorted(o) for p, o in plan.handoff.items()} == {0: [5, 6, 7, 8, 9], 1: [3]}
    pipe.closed()
    assert not pipe.pending and b.state is GIVEN_BACK


def test_close_nacks_committed_messages_of_a_partition_no_longer_owned():
    pipe = pipeline()
    ready = msgs({0: range(0, 2), 1: range(4, 6)})
    pipe.revoked({1})
    plan = pipe.close_plan([(ready, 0)], assigned={0})
    assert plan.rewind == {0: 0}
    assert offsets_of(plan.nack) == {(1, 4), (1, 5)}  # committed: only the tracker can redeliver them


def test_close_after_a_revoke_and_reassign_never_commits_back_below_the_interim_owners_commit():
    pipe = pipeline()
    ready_then = msgs({0: range(100, 110)})  # committed to 110 and handed to the ready queue at generation 0
    gen = pipe.gen
    pipe.revoked({0})  # an interim owner consumed 110..299 and committed 300
    pipe.assigned({0})  # back to this member, positioned at 300
    fetch(pipe, {0: range(300, 305)})
    plan = pipe.close_plan([(ready_then, gen)], assigned={0})
    assert plan.rewind == {0: 300}  # not 100: that would hand 110..299 out a second time
    assert offsets_of(plan.nack) == offsets_of(ready_then)
    # No hand-off for the stale ones: the interim owner's START may cover them now.
    assert plan.handoff == {0: [300, 301, 302, 303, 304]}


def test_the_close_plan_follows_revocations_reported_while_it_is_retried():
    pipe = pipeline()
    ready = msgs({0: range(0, 2), 1: range(0, 2)})
    assert pipe.close_plan([(ready, 0)], assigned={0, 1}).rewind == {0: 0, 1: 0}
    pipe.revoked({1})
    plan = pipe.close_plan([(ready, 0)], assigned={0, 1})  # the client may lag the callbacks
    assert plan.rewind == {0: 0} and offsets_of(plan.nack) == {(1, 0), (1, 1)}
    nothing_ours = pipe.close_plan([(ready, 0)], assigned=set())  # the commit-back gave up
    assert nothing_ours.rewind == {} and offsets_of(nothing_ours.nack) == offsets_of(ready)


# ------------------------------------------------------------------ pacing
def test_next_poll_asks_for_the_room_left_and_polls_briefly_while_batches_are_pending():
    pipe = pipeline()
    step = pipe.next_poll(room=300, now=0.0)
    assert (step.wait, step.max_records, step.timeout, step.pause_all) == (0.0, 300, 0.1, False)
    fetch(pipe, {0: range(0, 3)})
    assert pipe.next_poll(room=300, now=0.0).timeout == ANSWER_POLL


def test_without_room_the_fetcher_waits_then_polls_with_every_partition_paused():
    pipe = pipeline(backpressure_poll=0.5)
    assert pipe.next_poll(room=0, now=10.0).wait > 0  # handlers are behind: no poll
    assert pipe.next_poll(room=0, now=10.4).wait > 0
    step = pipe.next_poll(room=0, now=10.5)  # long without room: poll to keep the membership alive
    assert step.wait == 0 and step.pause_all and step.max_records == 1
    assert not pipe.next_poll(room=10, now=10.6).pause_all
    assert pipe.next_poll(room=0, now=10.7).wait > 0  # a new spell without room starts over


def test_without_room_a_pending_batch_is_waited_for_rather_than_polled_past():
    pipe = pipeline(backpressure_poll=0.5)
    fetch(pipe, {0: range(0, 3)})
    pipe.next_poll(room=0, now=0.0)
    assert pipe.next_poll(room=0, now=5.0).wait > 0


def test_behind_a_batch_stuck_longer_than_half_the_lease_nothing_more_is_fetched():
    # A START whose answer is lost holds every later batch (commits go in fetch order). Batches
    # fetched meanwhile got STARTs whose leases ran out unhanded: one copy each, and under a long
    # stall those copies were fetched and STARTed too (the simulator's seed 11399).
    pipe = FetchPipeline.for_kafka(Config.from_dict({}).kafka, lease=30.0)
    pipe.assigned({0})
    head = fetch(pipe, {0: range(0, 3)}, now=0.0)
    assert not pipe.next_poll(room=100, now=14.9).pause_all
    stuck = pipe.next_poll(room=100, now=15.1)
    assert stuck.pause_all and stuck.max_records == 1 and stuck.wait == 0  # the membership is kept alive
    out = pipe.start_answered(head, None, 15.2)
    assert kinds(out) == ["Commit"]
    assert pipe.next_poll(room=100, now=15.3).pause_all  # the commit in flight still holds the head
    pipe.commit_answered(None, 15.4)
    assert not pipe.next_poll(room=100, now=15.5).pause_all  # moved on: fetching again
    assert FetchPipeline.for_kafka(Config.from_dict({}).kafka).max_head_wait is None


# ------------------------------------------------------------------ consumer.hand_over: started
def started_pipeline(**kw) -> FetchPipeline:
    return pipeline(hand_over_started=True, **kw)


def test_handing_over_at_start_gives_the_batch_to_user_code_before_its_commit_and_once():
    pipe = started_pipeline()
    b = fetch(pipe, {0: range(0, 3)})
    assert pipe.tick(0.5) == []  # START not answered: nothing handed
    handed, commit = pipe.start_answered(b, None, 1.0)
    assert isinstance(handed, HandOver) and offsets_of(handed.messages) == {(0, 0), (0, 1), (0, 2)}
    assert isinstance(commit, Commit) and commit.offsets == {0: 3}
    assert b.messages == [] and b.handed and pipe.pending  # kept for its commit, without its messages
    assert pipe.commit_answered(None, 2.0) == []  # no second hand-over
    assert not pipe.pending


def test_handing_over_at_start_keeps_fetch_order():
    pipe = started_pipeline()
    b1 = fetch(pipe, {0: range(0, 3)})
    b2 = fetch(pipe, {0: range(3, 6)})
    assert pipe.start_answered(b2, None, 0.1) == []  # b1 first
    out = pipe.start_answered(b1, None, 0.2)
    assert kinds(out) == ["HandOver", "HandOver", "Commit"]
    assert [a.batch for a in out[:2]] == [b1, b2] and out[2].offsets == {0: 6}


def test_a_batch_after_a_failed_start_is_not_handed_over_and_the_handed_one_before_is_still_committed():
    pipe = started_pipeline()
    b1 = fetch(pipe, {0: range(0, 3)})
    b2 = fetch(pipe, {0: range(3, 6)})
    b3 = fetch(pipe, {0: range(6, 9)})
    handed, commit = pipe.start_answered(b1, None, 0.1)
    assert handed.batch is b1 and commit.offsets == {0: 3}
    assert pipe.start_answered(b2, "refused", 0.2) == []  # the commit of b1 is in flight
    assert pipe.start_answered(b3, None, 0.3) == []  # behind the failed b2: not handed over
    back, seek = pipe.commit_answered(None, 0.4)  # b1 committed; then b2 fails, b3 goes with it
    assert offsets_of(back.messages) == {(0, o) for o in range(3, 9)} and seek.offsets == {0: 3}
    assert not pipe.pending


def test_a_failed_commit_of_handed_batches_gives_nothing_back_and_is_retried():
    pipe = started_pipeline(max_commit_tries=2)
    b1 = fetch(pipe, {0: range(0, 3)})
    pipe.start_answered(b1, None, 0.1)
    b2 = fetch(pipe, {0: range(3, 5)})
    assert pipe.commit_answered("coordinator moved", 0.2) == []  # nothing given back: user code has b1
    assert pipe.commit_retrying
    [retry] = pipe.polled([], 0.3)  # the retry goes out after the next poll...
    assert isinstance(retry, Commit) and retry.offsets == {0: 3}
    # ...b2's START is answered meanwhile: handed over too, committed with the next commit
    [h2] = pipe.start_answered(b2, None, 0.35)
    assert h2.batch is b2
    [seek] = pipe.commit_answered("coordinator moved", 0.4)  # the last try: give up on these offsets
    assert isinstance(seek, SeekBack) and seek.offsets == {}  # nothing given back or fetched again
    assert not pipe.pending  # a later commit of partition 0 covers 0..4


def test_a_revocation_takes_only_the_offsets_of_a_handed_batch_never_its_messages():
    pipe = started_pipeline()
    b1 = fetch(pipe, {0: range(0, 3), 1: range(0, 2)})
    b2 = fetch(pipe, {0: range(3, 5), 1: range(2, 4)})
    handed, commit = pipe.start_answered(b1, None, 0.1)  # b1 handed, its commit in flight
    assert pipe.handed_ends({0, 1}) == {0: 3, 1: 2}
    [h2] = pipe.start_answered(b2, None, 0.2)  # b2 handed too, not in the commit in flight
    assert pipe.handed_ends({0, 1}) == {0: 5, 1: 4}
    assert pipe.revoked({1}) == []  # nothing to give back: user code has them all
    assert b2.spans == {0: (3, 4)} and b1.spans == {0: (0, 2), 1: (0, 1)}  # the commit in flight decides for b1
    assert pipe.handed_ends({0, 1}) == {0: 5}  # partition 1 is stale for both now
    [commit2] = pipe.commit_answered(None, 0.3)
    assert commit2.offsets == {0: 5}  # never partition 1 any more


def test_closing_commits_handed_batches_on_unless_never_handed_messages_are_committed_back():
    pipe = started_pipeline()
    b1 = fetch(pipe, {0: range(0, 3), 1: range(0, 3)})
    pipe.start_answered(b1, None, 0.1)  # handed; its commit is never answered
    b2 = fetch(pipe, {1: range(3, 5)})  # not started: given back on close
    plan = pipe.close_plan([], {0, 1})
    assert plan.forward == {0: 3} and plan.rewind == {1: 3}
    assert plan.commit == {0: 3, 1: 3}
    assert offsets_of(plan.give_back) == {(1, 3), (1, 4)} and plan.nack == []
    assert pipe.close_plan([], {1}).forward == {}  # partition 0 no longer held: nothing to commit for it
    assert b2.state != GIVEN_BACK


def test_handed_ends_is_empty_when_handing_over_after_the_commit():
    pipe = pipeline()
    b = fetch(pipe, {0: range(0, 3)})
    pipe.start_answered(b, None, 0.1)
    assert pipe.handed_ends({0}) == {} and pipe.close_plan([], {0}).forward == {}


def test_a_failed_commit_of_handed_batches_is_a_warning_not_a_revocation(caplog):
    # Handed over at START, a batch keeps only its offsets: its failed commit is still a commit to
    # retry, not "those partitions were revoked meanwhile".
    pipe = started_pipeline()
    b = fetch(pipe, {0: range(0, 3)})
    pipe.start_answered(b, None, 0.1)
    with caplog.at_level("INFO", logger="kmq.consumer.fetch_pipeline"):
        assert pipe.commit_answered("rebalance in progress", 0.2) == []
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "retrying until it succeeds" in caplog.text
