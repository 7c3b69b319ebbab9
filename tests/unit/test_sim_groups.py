"""The simulated group coordinator: assignors, eager and cooperative rebalances, expiry, commit fencing."""

from __future__ import annotations

import random

import pytest

from kmq.dev.sim.assignors import COOPERATIVE_STICKY, RANGE, range_assign, sticky_assign
from kmq.dev.sim.errors import SimulationError
from kmq.dev.sim.groups import CommitRefused, GroupCoordinator, MemberGone

T = frozenset({"t"})


def _coordinator(partitions: int = 4, frozen=None, session: float = 10.0) -> tuple[GroupCoordinator, list[str]]:
    history: list[str] = []
    spans = frozen or {}
    return GroupCoordinator(lambda: {"t": partitions}, history.append, lambda name: spans.get(name, []),
                            lambda _t: False, session_timeout=session), history


def test_range_gives_consecutive_ranges_in_member_id_order():
    got = range_assign([("b", T), ("a", T)], {"t": 5})
    assert got == {"a": {("t", 0), ("t", 1), ("t", 2)}, "b": {("t", 3), ("t", 4)}}


def test_sticky_keeps_owners_and_moves_only_the_surplus():
    got = sticky_assign([("a", T, frozenset({("t", p) for p in range(4)})), ("b", T, frozenset())], {"t": 4})
    assert got["a"] == {("t", 0), ("t", 1)} and got["b"] == {("t", 2), ("t", 3)}
    again = sticky_assign([("a", T, got["a"]), ("b", T, got["b"]), ("c", T, frozenset())], {"t": 4})
    assert again["a"] | again["b"] | again["c"] == {("t", p) for p in range(4)}
    assert again["a"] <= got["a"] and again["b"] <= got["b"] and len(again["c"]) == 1


def test_eager_members_give_up_everything_and_get_partitions_only_after_all_rejoined():
    g, _ = _coordinator()
    a = g.join("g", "a", T, RANGE, 0.0)
    assert g.sync("g", a, 0.0).assigned == {("t", p) for p in range(4)}
    b = g.join("g", "b", T, RANGE, 1.0)
    s = g.sync("g", a, 1.0)
    assert s.revoked == {("t", p) for p in range(4)} and s.assigned == frozenset()  # b has not rejoined yet
    sb = g.sync("g", b, 1.1)
    sa = g.sync("g", a, 1.2)
    assert sb.assigned | sa.assigned == {("t", p) for p in range(4)} and not sb.assigned & sa.assigned


def test_cooperative_moves_a_partition_only_after_its_owner_gave_it_up():
    g, _ = _coordinator()
    a = g.join("g", "a", T, COOPERATIVE_STICKY, 0.0)
    g.sync("g", a, 0.0)
    b = g.join("g", "b", T, COOPERATIVE_STICKY, 1.0)
    assert g.sync("g", b, 1.0).assigned == frozenset()  # still a's
    sa = g.sync("g", a, 1.1)
    assert len(sa.revoked) == 2 and sa.assigned == frozenset()
    assert g.sync("g", b, 1.2).assigned == sa.revoked
    assert g.owned("g", a) | g.owned("g", b) == {("t", p) for p in range(4)}


def test_no_partition_is_ever_owned_by_two_members_under_random_joins_leaves_and_polls():
    for seed in range(60):
        rng = random.Random(seed)
        g, _ = _coordinator(partitions=rng.randint(1, 7))
        assignor = rng.choice([RANGE, COOPERATIVE_STICKY])
        members: list[str] = []
        for step in range(80):
            now = float(step)
            action = rng.random()
            if action < 0.15 or not members:
                members.append(g.join("g", f"m{step}", T, assignor, now))
            elif action < 0.25 and len(members) > 1:
                g.leave("g", members.pop(rng.randrange(len(members))), now)
            else:
                g.sync("g", rng.choice(members), now)
            owners = [tp for m in members for tp in g.owned("g", m)]
            assert len(owners) == len(set(owners)), f"seed {seed} step {step}: a partition has two owners"
        for _ in range(3):  # everyone polls: the group settles with every partition owned
            for m in members:
                g.sync("g", m, 100.0)
        assert {tp for m in members for tp in g.owned("g", m)} == {("t", p) for p in range(g._counts()["t"])}


def test_a_member_frozen_past_the_session_expires_and_its_commits_are_fenced():
    g, history = _coordinator(frozen={"a": [(5.0, 20.0)]}, session=10.0)
    a = g.join("g", "a", T, COOPERATIVE_STICKY, 0.0)
    b = g.join("g", "b", T, COOPERATIVE_STICKY, 0.0)
    g.sync("g", a, 0.0), g.sync("g", b, 0.0), g.sync("g", a, 0.1)
    assert g.sync("g", b, 14.9).assigned == frozenset()  # 9.9 s frozen: still a member
    assert g.sync("g", b, 15.0).assigned | g.owned("g", b) == {("t", p) for p in range(4)}
    assert any("a#0001 expired: frozen" in line for line in history)
    with pytest.raises(MemberGone):
        g.sync("g", a, 20.0)
    with pytest.raises(CommitRefused) as refused:
        g.commit("g", a, {("t", 0): 5}, 20.0)
    assert refused.value.rebalanced and g.committed("g", ("t", 0)) is None


def test_a_short_freeze_keeps_the_membership():
    g, _ = _coordinator(frozen={"a": [(5.0, 14.0)]}, session=10.0)
    a = g.join("g", "a", T, COOPERATIVE_STICKY, 0.0)
    g.sync("g", a, 0.0)
    assert g.sync("g", a, 30.0).revoked == frozenset()


def test_a_commit_before_rejoining_a_new_generation_is_refused_as_rebalanced():
    g, _ = _coordinator()
    a = g.join("g", "a", T, COOPERATIVE_STICKY, 0.0)
    g.sync("g", a, 0.0)
    g.commit("g", a, {("t", 0): 3}, 0.0)
    g.join("g", "b", T, COOPERATIVE_STICKY, 1.0)
    with pytest.raises(CommitRefused) as refused:
        g.commit("g", a, {("t", 0): 4}, 1.0)
    assert refused.value.rebalanced
    g.sync("g", a, 1.1)
    g.commit("g", a, {("t", 0): 4}, 1.1)
    assert g.committed("g", ("t", 0)) == 4


def test_a_consumer_outside_the_group_commits_only_while_the_group_is_empty():
    g, _ = _coordinator()
    g.commit("g", None, {("t", 0): 1}, 0.0)
    g.join("g", "a", T, COOPERATIVE_STICKY, 0.0)
    with pytest.raises(CommitRefused) as refused:
        g.commit("g", None, {("t", 0): 2}, 0.0)
    assert not refused.value.rebalanced and g.committed("g", ("t", 0)) == 1


def test_a_member_with_another_assignor_cannot_join():
    g, _ = _coordinator()
    g.join("g", "a", T, RANGE, 0.0)
    with pytest.raises(SimulationError, match="INCONSISTENT_GROUP_PROTOCOL"):
        g.join("g", "b", T, COOPERATIVE_STICKY, 0.0)
