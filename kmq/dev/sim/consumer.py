"""The simulated consumer: a :class:`~kmq.client.api.GroupConsumerAdapter` over a :class:`SimCluster`.

It behaves as the kafka-python and confluent adapters do where kmq can tell:

* ``fetch``/``poll`` return records in offset order per partition, at most
  ``max_records``, from the unpaused assigned partitions (rotating which
  goes first); with nothing to return they wait, in simulated time, until
  records arrive, the group changes, or the timeout passes. Rebalance
  callbacks run inside them, with ``(topic, partition)`` sets: eager
  (``RANGE``) revokes everything, ``COOPERATIVE-STICKY`` only what moves.
  Empty sets are not reported.
* A partition's position starts at the group's committed offset, else at
  ``auto_offset_reset`` (``earliest``: the log start); a position outside the
  log (deleted by retention, past the end) is reset the same way, as Kafka
  answers such a fetch with OFFSET_OUT_OF_RANGE.
* ``isolation_level``: ``read_uncommitted`` (kafka-python's default, kmq's
  default client) is handed every record up to the high-water mark, those of
  open and aborted transactions too; ``read_committed`` (librdkafka's
  default) only records below the last stable offset, never an aborted
  transaction's. The position moves past the control records (commit and
  abort markers), and ``read_committed`` past aborted records, as a client's does.
* ``highwater`` is the mark the last fetch of the partition saw (every fetch
  of an assigned, unpaused partition refreshes it, records or not); None
  before the first fetch of an assignment and for a partition not assigned.
* ``commit`` is synchronous and raises :class:`~kmq.client.api.ClientCommitFailed`
  (``rebalanced`` when the group moved on); ``commit_async`` returns a
  :class:`~kmq.dev.sim.producer.SimDelivery` completed when the clock next
  moves (kafka-python completes it on its I/O thread, later).
* ``seek`` of a partition not assigned raises ``ClientCommitFailed(rebalanced=True)``.

Heartbeats are implicit, as from a client's background thread: a member
stays in its group unless its process is frozen past the session timeout
(:class:`~kmq.dev.sim.faults.MemberPause`), it stops polling for
``max_poll_interval``, or it is closed or crashes (:meth:`SimConsumer.crash`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from kmq.client.api import READ_UNCOMMITTED, ClientCommitFailed, Record
from kmq.dev.sim.assignors import COOPERATIVE_STICKY, TP
from kmq.dev.sim.clock import to_us
from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.errors import SimulationError
from kmq.dev.sim.groups import CommitRefused, MemberGone
from kmq.dev.sim.log import PartitionLog, check_isolation
from kmq.dev.sim.producer import SimDelivery

__all__ = ["SimConsumer", "SIM"]

#: The ``client`` name of the simulated adapters.
SIM = "sim"

_RESETS = ("earliest", "latest")


def _names(tps: Iterable[TP]) -> str:
    return ",".join(f"{t}[{p}]" for t, p in sorted(tps))


class SimConsumer:
    """A consumer on a :class:`~kmq.dev.sim.cluster.SimCluster`; see the module docstring.

    :param name: names the consumer in the history and in the fault plan.
    :param group_id: the group to join on :meth:`subscribe` and to commit to (None: assign only).
    :param assignor: ``COOPERATIVE-STICKY`` or ``RANGE`` (kmq's ``consumer.assignor``).
    :param isolation_level: ``read_uncommitted`` or ``read_committed`` (see the module docstring).
    """

    client = SIM

    def __init__(self, cluster: SimCluster, name: str = "consumer", group_id: str | None = None, *,
                 assignor: str = COOPERATIVE_STICKY, auto_offset_reset: str = "earliest",
                 isolation_level: str = READ_UNCOMMITTED) -> None:
        if auto_offset_reset not in _RESETS:
            raise SimulationError(f"auto_offset_reset must be one of {', '.join(_RESETS)}, not {auto_offset_reset!r}")
        self.raw = self  # no client underneath: the adapter is the consumer
        self.cluster = cluster
        self.name = name
        self.group_id = group_id
        self.assignor = assignor
        self.auto_offset_reset = auto_offset_reset
        self.isolation_level = check_isolation(isolation_level)
        self._topics: frozenset[str] | None = None
        self._on_assigned: Callable[[set], None] = lambda _s: None
        self._on_revoked: Callable[[set], None] = lambda _s: None
        self._commit_on_revoke: Callable[[set], Mapping[TP, int]] | None = None
        self._on_commit_failed: Callable[[ClientCommitFailed], None] | None = None
        self._member: str | None = None
        self._assigned: set[TP] = set()
        self._positions: dict[TP, int] = {}
        self._hw: dict[TP, int] = {}
        self._paused: set[TP] = set()
        self._sent: list[Callable[[], None]] = []  # async commits not answered yet, in the order sent
        self._rotation = 0
        self._closed = False
        self._fetched_at: float | None = None  # when the previous fetch was made (simulation seconds)

    # ------------------------------------------------------------ membership
    def subscribe(self, topics: Iterable[str], on_assigned: Callable[[set], None],
                  on_revoked: Callable[[set], None],
                  commit_on_revoke: Callable[[set], Mapping[TP, int]] | None = None,
                  on_commit_failed: Callable[[ClientCommitFailed], None] | None = None) -> None:
        """Join the group for ``topics`` at the next fetch; the callbacks run inside fetches. With
        ``commit_on_revoke``, revoked partitions first have the offsets it returns committed (a
        refused commit goes to ``on_commit_failed``), as the adapters do."""
        if self.group_id is None:
            raise SimulationError(f"consumer {self.name} has no group_id: subscribe needs one (or use assign)")
        self._topics = frozenset(topics)
        self._on_assigned, self._on_revoked = on_assigned, on_revoked
        self._commit_on_revoke, self._on_commit_failed = commit_on_revoke, on_commit_failed

    def assign(self, partitions: Iterable[TP], offsets: Mapping[TP, int] | None = None) -> None:
        """Read ``partitions`` without a group membership (replaces the previous assignment)."""
        if self._topics is not None:
            raise SimulationError(f"consumer {self.name} is subscribed; it cannot also assign partitions")
        wanted = {(t, p) for t, p in partitions}
        for t, p in sorted(wanted):
            self.cluster.log(t, p)  # raises for a partition that does not exist
        self._drop(self._assigned - wanted)
        self._assigned = wanted
        for tp, off in (offsets or {}).items():
            self._positions[tp] = off
        self.cluster.record(f"{self.name} assigned {_names(wanted) or '-'}")

    def member_id(self) -> str | None:
        """This member's id in the group (None before the first join)."""
        return self._member

    def assignment(self) -> set[TP]:
        return set(self._assigned)

    # ------------------------------------------------------------ fetching
    def poll(self, timeout: float, max_records: int) -> list[Record]:
        return self.fetch(timeout, max_records, Record)

    def fetch(self, timeout: float, max_records: int, build: Callable[..., Any] = Record,
              wake: Any = None) -> list:
        """Up to ``max_records`` records as ``build(topic, partition, offset, key, value, headers, timestamp)``,
        waiting at most ``timeout`` simulated seconds for some (``wake`` is not used: no thread waits)."""
        self._check_open()
        self._thaw()
        clock = self.cluster.clock
        deadline = clock.now_us() + to_us(max(0.0, timeout))
        since, self._fetched_at = self._fetched_at, self.cluster.t()
        self._sync()
        out = self._take(max_records, build, since)
        if out or timeout <= 0:
            return out
        clock.run_until_us(deadline, lambda: self._fetchable() or self._group_pending())
        self._sync()
        return self._take(max_records, build, since)

    def _sync(self) -> None:
        """Learn the group's decisions: join, rejoin after expiry, run the rebalance callbacks."""
        if self._topics is None or self.group_id is None:
            return
        c = self.cluster
        if c.faults.broker_paused_until(c.t()) is not None:
            return  # the coordinator is not answering either
        if self._member is None:
            self._member = c.groups.join(self.group_id, self.name, self._topics, self.assignor, c.t())
        try:
            s = c.groups.sync(self.group_id, self._member, c.t())
        except MemberGone:
            lost = set(self._assigned)
            c.record(f"{self._member} is out of {self.group_id}; lost {_names(lost) or '-'}; rejoining")
            self._drop(lost)
            if lost:
                self._revoke(lost)  # as on_lost: the adapters report a lost assignment as revoked
            self._member = c.groups.join(self.group_id, self.name, self._topics, self.assignor, c.t())
            s = c.groups.sync(self.group_id, self._member, c.t())
        if s.revoked:
            self._drop(s.revoked)
            c.record(f"{self._member} revoked {_names(s.revoked)}")
            self._revoke(set(s.revoked))
        if s.assigned:
            self._assigned |= s.assigned
            c.record(f"{self._member} assigned {_names(s.assigned)}")
            self._on_assigned(set(s.assigned))

    def _revoke(self, tps: set[TP]) -> None:
        """The revoke callback, after the commit ``commit_on_revoke`` asks for."""
        offsets = self._commit_on_revoke(set(tps)) if self._commit_on_revoke is not None else None
        if offsets:
            try:
                self._answer_sent()
                self._commit_now(dict(offsets), self._member)
            except ClientCommitFailed as exc:
                if self._on_commit_failed is not None:
                    self._on_commit_failed(exc)
        self._on_revoked(tps)

    def _group_pending(self) -> bool:
        return (self._member is not None and self.group_id is not None
                and self.cluster.faults.broker_paused_until(self.cluster.t()) is None
                and self.cluster.groups.pending(self.group_id, self._member, self.cluster.t()))

    def _answering(self) -> bool:
        c = self.cluster
        t = c.t()
        return c.faults.broker_paused_until(t) is None and c.faults.fetch_blocked_until(self.name, t) is None

    def _fetchable(self) -> bool:
        if not self._answering():
            return False
        for tp in sorted(self._assigned - self._paused):
            plog = self.cluster.log(*tp)
            if (self._position(tp, plog) < plog.end(self.isolation_level)
                    and not self.cluster.faults.leader_changing(tp[0], tp[1], self.cluster.t())):
                return True
        return False

    def _take(self, max_records: int, build: Callable[..., Any], since: float | None = None) -> list:
        if not self._answering():
            return []
        c = self.cluster
        t = c.t()
        order = sorted(self._assigned - self._paused)
        if order:
            k = self._rotation % len(order)
            order = order[k:] + order[:k]
            self._rotation += 1
        out: list = []
        for tp in order:
            plog = c.log(*tp)
            pos = self._position(tp, plog)
            if c.faults.leader_changing(tp[0], tp[1], t):
                continue  # nothing from it, its mark kept, until the new leader is found
            if not c.faults.high_water_stale(self.name, tp[0], tp[1], t):
                self._hw[tp] = plog.high_water
            records, nxt = plog.fetch(pos, max_records - len(out), self.isolation_level)
            self._positions[tp] = nxt
            if not records:
                continue
            topic, partition = tp
            out.extend(build(topic, partition, r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in records)
            if since is not None:
                c.fetched(self.name, tp, records[0].offset, records[-1].offset + 1, t - since)
            c.record(f"fetch {self.name} {topic}[{partition}] {records[0].offset}..{records[-1].offset} "
                     f"hw {self._hw.get(tp)}")
        return out

    def _position(self, tp: TP, plog: PartitionLog) -> int:
        pos = self._positions.get(tp)
        if pos is None:
            committed = self.cluster.groups.committed(self.group_id, tp) if self.group_id else None
            pos = committed if committed is not None else self._reset(plog)
            self.cluster.record(f"{self.name} starts {tp[0]}[{tp[1]}] at {pos} "
                                f"({'committed' if committed is not None else self.auto_offset_reset})")
        if not plog.in_range(pos):
            new = self._reset(plog)
            self.cluster.record(f"{self.name} offset {pos} of {tp[0]}[{tp[1]}] out of range "
                                f"[{plog.log_start}, {plog.high_water}]: reset to {new}")
            pos = new
        self._positions[tp] = pos
        return pos

    def _reset(self, plog: PartitionLog) -> int:
        return plog.log_start if self.auto_offset_reset == "earliest" else plog.high_water

    def _drop(self, tps: Iterable[TP]) -> None:
        c = self.cluster
        for tp in tps:
            self._assigned.discard(tp)
            self._positions.pop(tp, None)
            self._paused.discard(tp)
            if not c.faults.high_water_stale(self.name, tp[0], tp[1], c.t()):
                self._hw.pop(tp, None)

    # ------------------------------------------------------------ committing
    def commit(self, offsets: Mapping[TP, int]) -> None:
        """Commit ``offsets`` (next offset to read), waiting out a broker pause."""
        self._check_open()
        self._thaw()
        self.cluster.wait_for_broker()
        self._answer_sent()
        self._commit_now(dict(offsets), self._member)

    def commit_async(self, offsets: Mapping[TP, int]) -> SimDelivery:
        """Send a commit; the returned future completes when the clock next moves (after a broker pause).
        The request carries the member as it is now (as a client builds it): a member that is out of
        the group by the time the coordinator reads it is refused, even if this consumer rejoined since."""
        self._check_open()
        fut = SimDelivery(self.cluster.clock)
        offsets = dict(offsets)
        member = self._member

        def send() -> None:
            if send not in self._sent:
                return  # answered already, before a later commit
            self._sent.remove(send)
            try:
                self._commit_now(offsets, member)
            except ClientCommitFailed as exc:
                fut.failure(exc)
            else:
                fut.success(None)

        c = self.cluster
        self._sent.append(send)
        c.clock.call_at(c.clock.now() + (c.served_at(c.t()) - c.t()), send)
        return fut

    def _answer_sent(self) -> None:
        """Before a commit is applied, the async commits sent earlier are: the coordinator answers one
        connection's requests in the order they came (a commit back never lands before a commit
        forward sent earlier)."""
        while self._sent:
            self._sent[0]()

    def _commit_now(self, offsets: dict[TP, int], member: str | None) -> None:
        c = self.cluster
        what = ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(offsets.items()))
        if self.group_id is None:
            raise ClientCommitFailed(f"consumer {self.name} has no group_id: nothing to commit to")
        if self._topics is not None and member is None:
            raise ClientCommitFailed(f"consumer {self.name} has not joined {self.group_id} yet", rebalanced=True)
        fault = c.faults.commit_fault(self.name, c.t())
        if fault is not None:
            if fault.applied:
                c.groups.store(self.group_id, offsets)
            c.record(f"commit {self.name} {what} failed (injected; {'applied' if fault.applied else 'not applied'})")
            raise ClientCommitFailed(f"commit of {what} failed (injected fault)", rebalanced=fault.rebalanced)
        try:
            c.groups.commit(self.group_id, member, offsets, c.t())
        except CommitRefused as exc:
            c.record(f"commit {self.name} {what} refused: {exc}")
            raise ClientCommitFailed(str(exc), rebalanced=exc.rebalanced) from exc
        c.record(f"commit {self.name} {what}")

    # ------------------------------------------------------------ positions and flow
    def seek(self, topic: str, partition: int, offset: int) -> None:
        if (topic, partition) not in self._assigned:
            raise ClientCommitFailed(f"cannot seek {topic}[{partition}]: not assigned to {self.name}", rebalanced=True)
        self._positions[(topic, partition)] = offset
        self.cluster.record(f"{self.name} seek {topic}[{partition}] to {offset}")

    def pause(self, partitions: Iterable[TP]) -> None:
        """Stop fetching ``partitions`` (those assigned; a partition assigned later arrives unpaused)."""
        self._paused |= {tuple(tp) for tp in partitions} & self._assigned  # type: ignore[arg-type]  # a TP is a (topic, partition) pair

    def resume(self, partitions: Iterable[TP]) -> None:
        self._paused -= {tuple(tp) for tp in partitions}

    def position(self, topic: str, partition: int) -> int | None:
        """The offset the next fetch of the partition starts at (kafka-python's ``position``; not part
        of the seam: the tracker's loop asks it of its markers consumer); None when not assigned."""
        if (topic, partition) not in self._assigned:
            return None
        return self._position((topic, partition), self.cluster.log(topic, partition))

    def highwater(self, topic: str, partition: int) -> int | None:
        """The high-water mark the last fetch of the partition saw (None: no fetch yet, or not assigned)."""
        if (topic, partition) not in self._assigned:
            return None
        return self._hw.get((topic, partition))

    # ------------------------------------------------------------ stall handling: nothing to do
    def watch(self, stall_timeout: float, on_fatal: Callable[[str], None], name: str) -> None:
        """Nothing to watch: a simulated fetch always returns within its timeout."""

    def unwatch(self) -> None:
        """See :meth:`watch`."""

    def recover_starved(self) -> None:
        """Nothing to recover: the simulation loses no fetch responses."""

    # ------------------------------------------------------------ ending
    def close(self) -> None:
        """Leave the group (its partitions move at once), after the revoke callback, as both clients do.
        While the broker is paused the leave is lost: the member expires one session later."""
        if self._closed:
            return
        c = self.cluster
        if self._member is not None and self.group_id is not None:
            owned = set(self._assigned)
            if owned:
                self._on_revoked(owned)
            if c.faults.broker_paused_until(c.t()) is None:
                c.groups.leave(self.group_id, self._member, c.t())
            else:
                c.groups.stop_heartbeats(self.group_id, self._member, c.t())
                c.session_ends(c.t())
        self._assigned.clear()
        self._closed = True
        c.record(f"{self.name} closed")

    def crash(self) -> None:
        """The process dies (SIGKILL): no callback, no leave; the group expires it one session later."""
        c = self.cluster
        if self._member is not None and self.group_id is not None:
            c.groups.stop_heartbeats(self.group_id, self._member, c.t())
            c.session_ends(c.t())
        self._assigned.clear()
        self._closed = True
        c.record(f"{self.name} crashed")

    def _check_open(self) -> None:
        if self._closed:
            raise SimulationError(f"consumer {self.name} is closed")

    def _thaw(self) -> None:
        """A frozen process makes its call when it thaws: the clock moves to the end of the freeze."""
        c = self.cluster
        until = c.faults.frozen_until(self.name, c.t())
        if until is not None:
            c.clock.run_until(c.clock.now() + (until - c.t()))
            c.record(f"{self.name} thawed")

    def __repr__(self) -> str:
        return f"SimConsumer({self.name!r}, group={self.group_id!r}, member={self._member!r})"
