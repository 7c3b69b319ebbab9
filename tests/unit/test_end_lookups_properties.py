"""kmq.core.end_lookups over random sequences of look-ups, answered in part, in full or not at all,
with time passing: the rules that keep a lease from being judged on markers not read yet hold.

The partitions are the service's own :class:`~tracker.partition.OwnedPartition` over a real
:class:`~kmq.core.lease_state.PartitionState` (no I/O either). At every step:

* only partitions whose last look-up went as ``failing`` says are asked, at most ``most``; a probe
  is one caught-up partition, only when nothing is asked and no look-up was answered for the
  probe interval;
* an answer moves a partition's read-through time on to the ask time at most, never a probe's;
* a partition not answered backs off (not asked again before its backoff ends), one answered has
  no failure left;
* the broker is taken for away only when a look-up of two partitions or more (or a probe), some
  answered before, got no answer at all; one partition's silence is its own; at the next answer
  every partition holds what fell due since the last good look-up until the markers of the grace
  period were read: no lease due in between is judged earlier, and a partition still failing
  stays failing (asked again at once, in its own look-up, not with the others).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kmq.config import Config
from kmq.core.end_lookups import EndLookups, offsets_to_commit
from kmq.core.lease_state import PartitionState
from kmq.core.markers import End, Start
from tracker.partition import OwnedPartition

GRACE_MS = 5_000
MOST = 3
PROBE_MS = 2_000
Q = Config.from_dict({"queues": [{"name": "q", "lease": "1s"}]}).queues[0]


def partition(p: int, position: int) -> OwnedPartition:
    state = PartitionState(Q.backoff.delay, Q.max_deliveries)
    state.apply(Start([(0, 5)], lease_ms=1_000, owner="w"), 0, 0)  # due from about 2 s on
    state.position = position
    return OwnedPartition(Q, ("q__markers", p), state, caught_up=True)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 6), data=st.data())
def test_look_ups_never_vouch_for_markers_not_read_and_an_outage_holds_every_partition(n, data):
    owned = [partition(p, 1) for p in range(n)]
    lookups = EndLookups(step_offsets=100, most=MOST, probe_interval_ms=PROBE_MS)
    now = 3_000
    touched: list = []
    for _ in range(data.draw(st.integers(1, 25), label="look-ups")):
        now += data.draw(st.integers(0, 4_000), label="time passes")
        failing = data.draw(st.booleans(), label="failing")
        before = {o.tp: (o.lookup_failures, o.recheck_ms, o.read_through_ms) for o in owned}
        looked_up, outage = lookups.looked_up_ms, lookups.outage
        lookup = lookups.choose(owned, now, failing)
        if lookup is None:
            continue
        asked = list(lookup.asked)
        assert len(asked) <= MOST
        assert all(bool(before[o.tp][0]) == failing for o in asked)
        if lookup.probe:
            assert not failing and len(asked) == 1 and now - looked_up >= PROBE_MS
            assert asked[0].caught_up and not asked[0].lookup_failures
        else:
            assert all(before[o.tp][1] <= now for o in asked), "asked again before its backoff ended"
        answered = data.draw(st.sets(st.sampled_from([o.tp for o in asked])), label="answered")
        if data.draw(st.booleans(), label="markers read meanwhile"):
            for o in owned:
                o.state.position += 1
        ends = {tp: 1 + data.draw(st.integers(0, 3), label="end") for tp in answered}
        after = now + data.draw(st.integers(0, 1_000), label="look-up took")
        answer = lookups.answered(lookup, ends, now, after, GRACE_MS, owned, touched.append)
        for o in asked:
            if o.tp in ends:
                assert o.lookup_failures == 0
                assert o.read_through_ms <= max(now, before[o.tp][2]), "read through past the ask time"
                if lookup.probe:
                    assert o.read_through_ms == before[o.tp][2], "a probe moved the read-through time"
            else:
                assert o.lookup_failures == before[o.tp][0] + 1 and o.recheck_ms > after
        if not ends and outage is None and any(not before[o.tp][0] for o in asked):
            if lookup.probe or len(asked) > 1:
                assert lookups.outage == (looked_up, after), "a whole look-up unanswered is the broker away"
            else:
                assert lookups.outage is None, "one partition's silence taken for the broker away"
        if ends and outage is not None:
            held_from = outage[0]
            assert answer.broker_back == (outage[1], now + GRACE_MS) and lookups.outage is None
            assert {o.tp for o in touched} >= {o.tp for o in owned}
            for o in owned:
                # Nothing due after the last good look-up is judged before the grace's markers were read.
                assert o.horizon(now + 10**6) <= held_from
                if o not in asked:  # a failing one stays failing, asked again at once, with the failing ones
                    assert o.lookup_failures == before[o.tp][0] and o.recheck_ms == 0
        touched.clear()


@settings(max_examples=200, deadline=None)
@given(positions=st.lists(st.integers(0, 20), min_size=1, max_size=5), committed=st.data(),
       ends=st.lists(st.integers(0, 4), max_size=5), force=st.booleans())
def test_a_commit_never_passes_an_open_start_and_names_only_what_moved(positions, committed, ends, force):
    owned = {}
    for p, pos in enumerate(positions):
        o = partition(p, pos)
        o.state.apply(Start([(10 + p, 1)], lease_ms=1_000, owner="w"), pos, 0)  # an open START at the position
        for e in ends[:p]:
            o.state.apply(End([(e, 1)]), o.state.position, 0)
        o.committed = committed.draw(st.one_of(st.none(), st.integers(0, 25)), label="committed")
        owned[o.tp] = o
    asked = list(owned) + [("other", 0)]
    out = offsets_to_commit(owned, asked, force)
    for tp, c in out.items():
        o = owned[tp]
        assert c <= o.state.position and c == o.state.committable_offset()
        assert force or c != o.committed
    for tp, o in owned.items():
        if tp not in out:
            assert o.state.committable_offset() is None or (not force and o.state.committable_offset() == o.committed)


def test_a_catch_up_targets_read_heard_elsewhere_puts_the_probe_off_and_an_older_one_does_not():
    state = PartitionState(Q.backoff.delay, Q.max_deliveries)
    state.position = 1
    idle = [OwnedPartition(Q, ("q__markers", 0), state, caught_up=True)]  # nothing due past what it read
    lookups = EndLookups(step_offsets=100, most=MOST, probe_interval_ms=PROBE_MS)
    lookups.heard(10_000)
    assert lookups.choose(idle, 10_000 + PROBE_MS - 1) is None  # the broker answered just now: no probe
    lookups.heard(1_000)  # an older answer moves nothing back
    assert lookups.choose(idle, 10_000 + PROBE_MS - 1) is None
    probe = lookups.choose(idle, 10_000 + PROBE_MS)
    assert probe is not None and probe.probe
