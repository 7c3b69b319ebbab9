"""The simulated group coordinator: members, generations, assignment, committed offsets.

A simplified Kafka group protocol, deterministic and enough for what kmq relies on:

* Joining, leaving and expiring start a rebalance: the generation goes up and
  a target assignment is computed (:mod:`kmq.dev.sim.assignors`).
* A member learns of it on its next poll (:meth:`GroupCoordinator.sync`).
  Eager (``RANGE``): it gives up everything, and gets its new partitions once
  every member has rejoined (the join barrier). Cooperative
  (``COOPERATIVE-STICKY``): it gives up only what moves, and gets a partition
  once its previous owner has given it up: no partition is ever owned by two
  members at once.
* A member expires when its process is frozen for longer than the session
  timeout (heartbeats come from a client's background thread, so a member
  that is merely busy keeps its session) or when it has not polled within
  ``max_poll_interval``. Expiry is decided lazily, whenever the coordinator is
  asked anything, from the times alone: the result is the same however often
  it is asked.
* A commit is refused when the member is unknown (expired, left) or has not
  yet rejoined the current generation: ``rebalanced`` in the client seam's
  terms. A consumer without a group membership (``assign``) may commit only
  while the group has no members, as in Kafka.
* A phantom member (:class:`~kmq.dev.sim.faults.MemberJoinsAndLeaves`) takes
  its share of partitions at once and consumes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from kmq.dev.sim.assignors import ASSIGNORS, RANGE, TP, range_assign, sticky_assign
from kmq.dev.sim.errors import SimulationError

__all__ = ["GroupCoordinator", "Member", "Group", "MemberGone", "CommitRefused", "Sync"]


class MemberGone(Exception):
    """The member is no longer in the group (expired or left): it must rejoin."""


class CommitRefused(Exception):
    """The coordinator refused a commit; ``rebalanced`` when the group moved on."""

    def __init__(self, message: str, rebalanced: bool) -> None:
        super().__init__(message)
        self.rebalanced = rebalanced


@dataclass
class Member:
    member_id: str
    name: str
    topics: frozenset[str]
    last_poll: float  # also when it joined
    phantom: bool = False
    generation: int = -1  # the generation this member last rejoined
    silent_since: float | None = None  # heartbeats stopped (closed without leaving, crashed)
    joined_at: float = 0.0
    received: bool = False  # eager: got its assignment of `generation`
    owned: set[TP] = field(default_factory=set)


@dataclass
class Group:
    group_id: str
    assignor: str | None = None
    generation: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, frozenset[TP]] = field(default_factory=dict)
    committed: dict[TP, int] = field(default_factory=dict)
    joined_total: int = 0

    @property
    def eager(self) -> bool:
        return self.assignor == RANGE


@dataclass(frozen=True)
class Sync:
    """What one poll of a member learned: partitions given up, partitions gained."""

    revoked: frozenset[TP]
    assigned: frozenset[TP]


class GroupCoordinator:
    """Every consumer group of one simulated cluster.

    :param partition_counts: topic -> partitions, read at each rebalance.
    :param record: appends one line to the cluster's history.
    :param frozen_spans: a member name's frozen ``(start, end)`` spans (the fault plan's).
    :param paused: whether the broker is paused at a time (no expiry then).
    """

    def __init__(self, partition_counts: Callable[[], Mapping[str, int]], record: Callable[[str], None],
                 frozen_spans: Callable[[str], list[tuple[float, float]]], paused: Callable[[float], bool],
                 session_timeout: float = 10.0, max_poll_interval: float = 300.0) -> None:
        self._counts = partition_counts
        self._record = record
        self._frozen_spans = frozen_spans
        self._paused = paused
        self.session_timeout = session_timeout
        self.max_poll_interval = max_poll_interval
        self._groups: dict[str, Group] = {}

    def group(self, group_id: str) -> Group:
        g = self._groups.get(group_id)
        if g is None:
            g = self._groups[group_id] = Group(group_id)
        return g

    # ------------------------------------------------------------ membership
    def join(self, group_id: str, name: str, topics: frozenset[str], assignor: str, now: float,
             phantom: bool = False) -> str:
        """Add a member; returns its id. All members of a group use one assignor, as in Kafka."""
        if assignor not in ASSIGNORS:
            raise SimulationError(f"unknown assignor {assignor!r}; use one of {', '.join(ASSIGNORS)}")
        g = self.group(group_id)
        self._expire(g, now)
        if g.assignor is not None and g.assignor != assignor and any(not m.phantom for m in g.members.values()):
            raise SimulationError(f"group {group_id} uses {g.assignor}; a member with {assignor} cannot join "
                                  "(Kafka: INCONSISTENT_GROUP_PROTOCOL)")
        g.assignor = g.assignor if g.members else assignor
        g.joined_total += 1
        member_id = f"{name}#{g.joined_total:04d}"
        g.members[member_id] = Member(member_id, name, topics, now, phantom, joined_at=now)
        self._rebalance(g, f"{member_id} joined")
        return member_id

    def leave(self, group_id: str, member_id: str, now: float) -> None:
        g = self.group(group_id)
        if g.members.pop(member_id, None) is not None:
            self._expire(g, now)
            self._rebalance(g, f"{member_id} left")

    def topics_changed(self, now: float) -> None:
        """A topic was created: groups subscribed to it rebalance."""
        counts = self._counts()
        for g in self._groups.values():
            wanted = {tp for m in g.members.values() for t in m.topics if t in counts for tp in
                      ((t, p) for p in range(counts[t]))}
            if wanted != {tp for ps in g.target.values() for tp in ps} and g.members:
                self._rebalance(g, "topic metadata changed")

    def sync(self, group_id: str, member_id: str, now: float) -> Sync:
        """A poll of ``member_id``: rejoin a new generation, give up and gain partitions.
        Raises :class:`MemberGone` when the member is no longer in the group."""
        g = self.group(group_id)
        self._expire(g, now)
        m = g.members.get(member_id)
        if m is None:
            raise MemberGone(f"{member_id} is not a member of {group_id} (expired or left)")
        m.last_poll = now
        revoked, assigned = self._sync(g, m)
        self._settle_phantoms(g)
        return Sync(frozenset(revoked), frozenset(assigned))

    def _sync(self, g: Group, m: Member) -> tuple[set[TP], set[TP]]:
        revoked: set[TP] = set()
        assigned: set[TP] = set()
        target = g.target.get(m.member_id, frozenset())
        if m.generation < g.generation:
            revoked = set(m.owned) if g.eager else m.owned - target
            m.owned -= revoked
            m.generation, m.received = g.generation, False
        if g.eager:
            if not m.received and all(x.generation == g.generation for x in g.members.values()):
                m.owned, m.received = set(target), True
                assigned = set(target)
        else:
            held = {tp for x in g.members.values() if x is not m for tp in x.owned}
            assigned = set(target - m.owned - held)
            m.owned |= assigned
        return revoked, assigned

    def _settle_phantoms(self, g: Group) -> None:
        for m in g.members.values():
            if m.phantom:
                self._sync(g, m)

    def pending(self, group_id: str, member_id: str, now: float) -> bool:
        """Whether a poll of ``member_id`` now would change something: it left the group, a new
        generation waits for it, or (cooperative) a partition of its target has been given up."""
        g = self.group(group_id)
        self._expire(g, now)
        m = g.members.get(member_id)
        if m is None or m.generation < g.generation:
            return True
        if g.eager:
            return not m.received and all(x.generation == g.generation for x in g.members.values())
        held = {tp for x in g.members.values() if x is not m for tp in x.owned}
        return bool(g.target.get(m.member_id, frozenset()) - m.owned - held)

    def tick(self, now: float) -> None:
        """Expire whatever is due in every group now (the cluster calls it when a session runs out,
        so an expiry is recorded at its time even when no member polls then)."""
        for group_id in sorted(self._groups):
            self._expire(self._groups[group_id], now)

    def stop_heartbeats(self, group_id: str, member_id: str, now: float) -> None:
        """The member's process is gone without leaving (killed, or closed while the broker was
        unreachable): it expires one session timeout from now."""
        m = self.group(group_id).members.get(member_id)
        if m is not None and m.silent_since is None:
            m.silent_since = now

    def owned(self, group_id: str, member_id: str) -> frozenset[TP]:
        m = self.group(group_id).members.get(member_id)
        return frozenset(m.owned) if m is not None else frozenset()

    # ------------------------------------------------------------ expiry and rebalancing
    def _expired(self, m: Member, now: float) -> str | None:
        if m.phantom:
            return None
        if m.silent_since is not None and now >= m.silent_since + self.session_timeout:
            return f"no heartbeat since t={m.silent_since:g}s, past the session timeout ({self.session_timeout:g}s)"
        for start, end in self._frozen_spans(m.name):
            start = max(start, m.joined_at)  # a freeze counts only while a member
            if end - start > self.session_timeout and now >= start + self.session_timeout:
                return f"frozen from t={start:g}s, past the session timeout ({self.session_timeout:g}s)"
        if now - m.last_poll > self.max_poll_interval:
            return f"no poll for {now - m.last_poll:g}s, past max_poll_interval ({self.max_poll_interval:g}s)"
        return None

    def _expire(self, g: Group, now: float) -> None:
        if self._paused(now):
            return
        gone = [(mid, why) for mid, m in g.members.items() if (why := self._expired(m, now)) is not None]
        for mid, why in gone:
            del g.members[mid]
            self._rebalance(g, f"{mid} expired: {why}")

    def _rebalance(self, g: Group, why: str) -> None:
        counts = self._counts()
        members = [g.members[mid] for mid in sorted(g.members)]
        if g.eager:
            g.target = range_assign([(m.member_id, m.topics) for m in members], counts)
        else:
            g.target = sticky_assign([(m.member_id, m.topics, frozenset(m.owned)) for m in members], counts)
        g.generation += 1
        plan = "; ".join(f"{mid}={_names(ps)}" for mid, ps in sorted(g.target.items()))
        self._record(f"group {g.group_id} generation {g.generation} ({why}): {plan or 'no members'}")
        self._settle_phantoms(g)

    # ------------------------------------------------------------ offsets
    def commit(self, group_id: str, member_id: str | None, offsets: Mapping[TP, int], now: float) -> None:
        """Store ``offsets`` (next offset to read); raises :class:`CommitRefused`."""
        g = self.group(group_id)
        self._expire(g, now)
        if member_id is None:
            if any(not m.phantom for m in g.members.values()):
                raise CommitRefused(f"group {group_id} has members; a consumer outside it cannot commit "
                                    "(Kafka: UNKNOWN_MEMBER_ID)", rebalanced=False)
        else:
            m = g.members.get(member_id)
            if m is None:
                raise CommitRefused(f"{member_id} is not a member of {group_id} any more (UNKNOWN_MEMBER_ID)",
                                    rebalanced=True)
            if m.generation < g.generation:
                raise CommitRefused(f"group {group_id} is rebalancing to generation {g.generation} "
                                    "(REBALANCE_IN_PROGRESS)", rebalanced=True)
        self.store(group_id, offsets)

    def store(self, group_id: str, offsets: Mapping[TP, int]) -> None:
        """Store offsets without any check (an admin write, or a commit applied whose answer is lost)."""
        self.group(group_id).committed.update(offsets)

    def committed(self, group_id: str, tp: TP) -> int | None:
        g = self._groups.get(group_id)
        return None if g is None else g.committed.get(tp)


def _names(tps) -> str:
    return ",".join(f"{t}[{p}]" for t, p in sorted(tps)) or "-"
