"""Faults a simulated cluster injects, and the plan that schedules them.

Every fault is a frozen value with the simulation time it starts (``at``,
seconds since the simulation began) and, for those that last, when it ends
(``until``). A :class:`FaultPlan` holds them; the cluster asks it "is this
fetch slow now?", "what happens to this produce request?", and schedules
the one-off ones (retention, unexpected records, a member joining and
leaving) on its clock. ``FaultPlan.random(seed, ...)`` draws a plan from a
seed: the same seed gives the same plan.

Only faults Kafka can show are accepted: with ``acks=all`` an acknowledged
record is always written, so a produce fault that acknowledges a record it
did not write is refused (:class:`~kmq.dev.sim.errors.FaultPlanError`); a
written record whose acknowledgement is lost (the producer reports a
timeout) is allowed, and is the case that matters.

Consumers, producers and log readers are named (``name=`` when created); a
fault that names none applies to all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Iterable, Mapping, Union

from kmq.core.markers import VERSION
from kmq.dev.sim.errors import FaultPlanError

__all__ = [
    "SlowFetch", "SlowRead", "LaggingRead", "LeaderChange", "ClockSkew", "ProducerGoesFatal", "StaleHighWater",
    "ProduceFault", "CommitFault", "MemberPause", "BrokerPause", "Retention",
    "UnexpectedRecord", "MemberJoinsAndLeaves", "CloseDuringTake", "OpenTransaction", "NewerMarkers", "NEWER_FIELD",
    "newer_marker", "Fault", "FaultPlan", "DELAYED", "LOST",
    "NULL_HEADER", "TOMBSTONE", "NULL_RECORD", "HUGE_VALUE", "BAD_KMQ_HEADERS", "UNEXPECTED_KINDS", "FOREIGN_MARKER",
    "MARKER_KINDS",
]

DELAYED, LOST, HUNG = "delayed", "lost", "hung"
NULL_HEADER, TOMBSTONE, NULL_RECORD, HUGE_VALUE, BAD_KMQ_HEADERS = (
    "null-header", "tombstone", "null-record", "huge-value", "bad-kmq-headers")
UNEXPECTED_KINDS = (NULL_HEADER, TOMBSTONE, NULL_RECORD, HUGE_VALUE, BAD_KMQ_HEADERS)
#: A record of a markers topic with a marker's header (this wire version) and ranges naming every offset of its
#: queue partition, but a type no kmq writes (another program's, or a later kmq's): readers skip it. Not among
#: the kinds a random plan draws; the search adds it on a stream of its own (``kmq.dev.sim.search``).
FOREIGN_MARKER = "foreign-marker"
MARKER_KINDS = (FOREIGN_MARKER,)


def _check_window(fault: object) -> None:
    at, until = getattr(fault, "at"), getattr(fault, "until", None)  # noqa: B009 - any fault class
    if at < 0 or (until is not None and until < at):
        raise FaultPlanError(f"{fault!r}: needs 0 <= at <= until")


@dataclass(frozen=True, slots=True)
class SlowFetch:
    """Fetches of ``consumer`` in ``[at, until)`` return nothing before ``until``, whatever their
    timeout: a fetch slower than any timeout (a stuck broker connection)."""

    at: float
    until: float
    consumer: str | None = None

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class SlowRead:
    """The partition's leader answers no log read of it in ``[at, until)`` (a stuck disk, a cold
    tiered-storage fetch of old offsets): a read of ``reader`` (None: any) waits until ``until`` or
    its timeout. Group consumers' fetches at the head of the log and produce requests are answered
    as usual; the tracker, which reads the originals of expired messages back, is what waits."""

    at: float
    until: float
    topic: str
    partition: int
    reader: str | None = None

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class LaggingRead:
    """In ``[at, until)`` log reads of the partition by ``reader`` (None: any) end where its log
    ended at ``at`` (the records written since have a later timestamp), as reads from a new leader
    whose high-water mark lags after a leader change: the records after it exist (consumers fetched
    them) but are not there for the read yet. Group consumers' fetches are answered as usual."""

    at: float
    until: float
    topic: str
    partition: int
    reader: str | None = None

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class LeaderChange:
    """The partition's leadership moves in ``[at, until)``: group consumers' fetches of it return
    nothing (their client is still finding the new leader) and their cached high-water mark stays
    where it was (a new leader's mark lags for a moment after it takes over, and
    kafka-python keeps the mark it saw). Produce requests and the log readers' fresh reads and
    look-ups reach the new leader and are answered: a tracker that takes its consumer's cached mark
    for the log end believes it has read markers that are there but not fetched yet."""

    at: float
    until: float
    topic: str
    partition: int

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class ClockSkew:
    """From ``at`` on, the wall clock of ``host`` reads ``offset_s`` seconds off the cluster's (a
    skewed host, or, mid-run, a clock set forward or back; the offsets of several add up). A host's
    clients are named ``host``, ``host-...`` or ``host#...``: the record timestamps its producers
    write (CreateTime) and the tracker's wall clock come from it; its monotonic clock does not move."""

    at: float
    host: str
    offset_s: float

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class ProducerGoesFatal:
    """At ``at``, every producer named ``producer`` (or of that host, see :func:`on_host`) made before
    then enters a fatal state (librdkafka's fatal error: an idempotence guarantee it can no longer
    keep): what it has not had acknowledged fails (a record already written stays written), and so
    does every later send. A producer made after ``at`` is healthy: the owner must replace it."""

    at: float
    producer: str

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class StaleHighWater:
    """In ``[at, until)`` fetches of ``consumer`` leave the cached high-water mark where it was,
    and a partition assigned again keeps the mark seen before (kafka-python does that)."""

    at: float
    until: float
    consumer: str | None = None
    topic: str | None = None
    partition: int | None = None

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class ProduceFault:
    """Produce requests to the partition in ``[at, until)`` (of ``producer``, or any): the record is
    ``written`` or not; its acknowledgement is ``DELAYED`` by ``ack_delay`` seconds, ``LOST`` (the
    producer reports a timeout after its delivery timeout) or ``HUNG``: the producer never hears
    back, past its own delivery timeout, until it is closed (kafka-python can lose a response
    across a broker restart: its future never completes). Acknowledged but not written is refused."""

    at: float
    until: float
    topic: str | None = None
    partition: int | None = None
    written: bool = True
    ack: str = DELAYED
    ack_delay: float = 0.0
    producer: str | None = None

    def __post_init__(self) -> None:
        _check_window(self)
        if self.ack not in (DELAYED, LOST, HUNG):
            raise FaultPlanError(f"ProduceFault.ack must be {DELAYED!r}, {LOST!r} or {HUNG!r}, not {self.ack!r}")
        if not self.written and self.ack == DELAYED:
            raise FaultPlanError("refused: with acks=all Kafka never acknowledges a record it did not write; "
                                 "use written=False with ack=LOST (a produce request that timed out)")
        if self.ack_delay < 0:
            raise FaultPlanError(f"ProduceFault.ack_delay must be >= 0, not {self.ack_delay}")


@dataclass(frozen=True, slots=True)
class CommitFault:
    """Commits of ``consumer`` in ``[at, until)`` fail; ``rebalanced`` when the failure says the
    group moved on; ``applied`` when the broker stored the offsets and only the answer was lost."""

    at: float
    until: float
    consumer: str | None = None
    rebalanced: bool = False
    applied: bool = False

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class MemberPause:
    """The process of ``consumer`` is frozen in ``[at, until)`` (SIGSTOP, a VM pause): no heartbeats,
    and its calls wait until it thaws. Past the session timeout the group expires it."""

    at: float
    until: float
    consumer: str

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class BrokerPause:
    """Every request in ``[at, until)`` waits until ``until``; the group's sessions do not expire meanwhile."""

    at: float
    until: float

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class Retention:
    """At ``at``, retention deletes the oldest ``segments`` segment(s) of the partition (never the active one)."""

    at: float
    topic: str
    partition: int
    segments: int = 1

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class UnexpectedRecord:
    """At ``at``, another producer writes a record of ``kind`` (see :data:`UNEXPECTED_KINDS` and
    :data:`MARKER_KINDS`, for a markers topic)."""

    at: float
    topic: str
    partition: int
    kind: str

    def __post_init__(self) -> None:
        _check_window(self)
        if self.kind not in UNEXPECTED_KINDS + MARKER_KINDS:
            raise FaultPlanError(f"UnexpectedRecord.kind must be one of {', '.join(UNEXPECTED_KINDS + MARKER_KINDS)}, "
                                 f"not {self.kind!r}")


@dataclass(frozen=True, slots=True)
class MemberJoinsAndLeaves:
    """A member of ``group`` joins at ``at`` and leaves at ``until`` (a rolling deploy): the others
    have partitions revoked mid-batch and assigned back. It consumes and commits nothing."""

    at: float
    until: float
    group: str

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class CloseDuringTake:
    """The first take of ``worker`` at or after ``at`` that brings more than one message from its
    consumer's ready queue (a chunk for iteration, :mod:`kmq.consumer.take_ahead`) is cut by a
    close of the consumer on another thread: the close runs in the instant between the ready
    queue's take of the chunk and the keeping of its rest. The worker then goes down gracefully
    (what is ready or taken ahead given back to the group, the group left) and comes back after
    the workload's ``restart_after``. Not with ``consumer.ordering: key`` (no take ahead there)."""

    at: float
    worker: str

    def __post_init__(self) -> None:
        _check_window(self)


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """At ``at``, the workload's producer sends its next ``records`` message(s) to the partition in
    one transaction, which stays open until ``until`` and is then committed, or aborted
    (``commit=False``): the application gives those messages up, and sends them no more. Until
    then the partition's last stable offset stays at the transaction's first record:
    ``read_committed`` readers see nothing from there on, ``read_uncommitted`` ones see it all.
    Its commit or abort marker takes an offset, as in Kafka. Carried out by the simulated world's
    producer (:mod:`kmq.dev.sim.world`), which writes the records at once, past the produce faults
    and broker pauses (what is modelled is the transaction, not its requests); a cluster alone
    only wakes its clients at ``until``."""

    at: float
    until: float
    topic: str
    partition: int
    records: int = 3
    commit: bool = True

    def __post_init__(self) -> None:
        _check_window(self)
        if self.records < 1:
            raise FaultPlanError(f"OpenTransaction.records must be at least 1, not {self.records}")


@dataclass(frozen=True, slots=True)
class NewerMarkers:
    """From ``at`` on, ``host`` runs a later kmq (a rolling upgrade half done): every marker its
    producers write to a markers topic is of the next wire version, with a field appended after its
    body, as every later version may do (docs/protocol.md, "Rolling upgrades"; :func:`newer_marker`).
    Readers of this version read it by the fields they know: nothing may be lost, closed or
    copied otherwise than had the marker been of their own version."""

    at: float
    host: str

    def __post_init__(self) -> None:
        _check_window(self)


#: What a later version appends to every marker in :class:`NewerMarkers` (a field a reader may ignore).
NEWER_FIELD = b"\x00\x07later"


def newer_marker(value: bytes) -> bytes:
    """``value`` (a marker this build wrote) as the next wire version writes it: the version byte one
    higher, :data:`NEWER_FIELD` appended."""
    return bytes((VERSION + 1,)) + value[1:] + NEWER_FIELD


Fault = Union[SlowFetch, SlowRead, LaggingRead, LeaderChange, ClockSkew, ProducerGoesFatal, StaleHighWater,
              ProduceFault, CommitFault, MemberPause, BrokerPause, Retention,
              UnexpectedRecord, MemberJoinsAndLeaves, CloseDuringTake, OpenTransaction, NewerMarkers]


def on_host(client: str, host: str) -> bool:
    """Whether the client named ``client`` runs on ``host`` (``host``, ``host-...``, ``host#...``)."""
    return client == host or client.startswith((f"{host}-", f"{host}#"))


def _named(wanted: object, actual: object) -> bool:
    return wanted is None or wanted == actual


def _during(fault: object, now: float) -> bool:
    return fault.at <= now < fault.until  # type: ignore[attr-defined]


class FaultPlan:
    """The faults of one simulation, in time order. Times are seconds since the simulation began."""

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self.faults: tuple[Fault, ...] = tuple(sorted(faults, key=lambda f: (f.at, type(f).__name__, repr(f))))
        self._of: dict[type, list] = {}  # asked on every fetch and send: kept per kind

    def of(self, kind: type) -> list:
        got = self._of.get(kind)
        if got is None:
            got = self._of[kind] = [f for f in self.faults if isinstance(f, kind)]
        return got

    # ------------------------------------------------------------ questions the cluster asks
    def fetch_blocked_until(self, consumer: str, now: float) -> float | None:
        """When a fetch of ``consumer`` at ``now`` may return records again (None: now)."""
        ends = [f.until for f in self.of(SlowFetch) if _named(f.consumer, consumer) and _during(f, now)]
        return max(ends) if ends else None

    def read_blocked_until(self, reader: str, topic: str, partition: int, now: float) -> float | None:
        """When a log read of ``topic[partition]`` by ``reader`` at ``now`` is answered (None: now)."""
        ends = [f.until for f in self.of(SlowRead)
                if _named(f.reader, reader) and f.topic == topic and f.partition == partition and _during(f, now)]
        return max(ends) if ends else None

    def read_lag(self, reader: str, topic: str, partition: int, now: float) -> LaggingRead | None:
        """The :class:`LaggingRead` of a read of ``topic[partition]`` by ``reader`` at ``now``, if any."""
        return next((f for f in self.of(LaggingRead) if _named(f.reader, reader) and f.topic == topic
                     and f.partition == partition and _during(f, now)), None)

    def skew_s(self, client: str, now: float) -> float:
        """How far the wall clock of ``client``'s host reads off at ``now`` (seconds)."""
        return sum(f.offset_s for f in self.of(ClockSkew) if f.at <= now and on_host(client, f.host))

    def fatal_at(self, producer: str, made: float) -> list[float]:
        """When a producer named ``producer``, made at ``made``, goes fatal (:class:`ProducerGoesFatal`)."""
        return sorted(f.at for f in self.of(ProducerGoesFatal) if f.at >= made and on_host(producer, f.producer))

    def writes_newer_markers(self, producer: str, now: float) -> bool:
        """Whether ``producer`` runs on a host that writes markers of the next version at ``now``."""
        return any(f.at <= now and on_host(producer, f.host) for f in self.of(NewerMarkers))

    def leader_changing(self, topic: str, partition: int, now: float) -> bool:
        """Whether a :class:`LeaderChange` of ``topic[partition]`` is going on at ``now``."""
        return any(f.topic == topic and f.partition == partition and _during(f, now) for f in self.of(LeaderChange))

    def high_water_stale(self, consumer: str, topic: str, partition: int, now: float) -> bool:
        """Whether fetches of ``consumer`` leave its cached mark of ``topic[partition]`` where it was."""
        return self.leader_changing(topic, partition, now) or any(
            _named(f.consumer, consumer) and _named(f.topic, topic) and _named(f.partition, partition)
            and _during(f, now) for f in self.of(StaleHighWater))

    def produce_fault(self, topic: str, partition: int, now: float, producer: str | None = None) -> ProduceFault | None:
        return next((f for f in self.of(ProduceFault) if _named(f.topic, topic) and _named(f.partition, partition)
                     and _named(f.producer, producer) and _during(f, now)), None)

    def commit_fault(self, consumer: str, now: float) -> CommitFault | None:
        return next((f for f in self.of(CommitFault) if _named(f.consumer, consumer) and _during(f, now)), None)

    def frozen_until(self, consumer: str, now: float) -> float | None:
        """When ``consumer``'s process thaws, if it is frozen at ``now``."""
        ends = [f.until for f in self.of(MemberPause) if f.consumer == consumer and _during(f, now)]
        return max(ends) if ends else None

    def frozen_spans(self, consumer: str) -> list[tuple[float, float]]:
        return [(f.at, f.until) for f in self.of(MemberPause) if f.consumer == consumer]

    def close_during_take(self, worker: str, now: float, fired: set) -> CloseDuringTake | None:
        """The :class:`CloseDuringTake` of ``worker`` due at ``now`` and not in ``fired`` yet, if any."""
        return next((f for f in self.of(CloseDuringTake) if f.worker == worker and f.at <= now and f not in fired),
                    None)

    def broker_paused_until(self, now: float) -> float | None:
        ends = [f.until for f in self.of(BrokerPause) if _during(f, now)]
        return max(ends) if ends else None

    def broker_pause_overlaps(self, start: float, end: float) -> bool:
        return any(f.at < end and start < f.until for f in self.of(BrokerPause))

    # ------------------------------------------------------------ drawing a plan from a seed
    @classmethod
    def random(cls, seed: int, *, topics: Mapping[str, int], consumers: Iterable[str] = (), group: str | None = None,
               horizon: float = 60.0, count: int = 8, session_timeout: float = 10.0) -> "FaultPlan":
        """``count`` faults drawn from ``seed``, starting within ``horizon`` seconds, over ``topics``
        (name -> partitions), the named ``consumers`` and ``group``. Durations straddle the session
        timeout, so some pauses expire a member and some do not."""
        rng = random.Random(seed)
        names = sorted(consumers)
        parts = sorted((t, p) for t, n in topics.items() for p in range(n))
        if not parts:
            raise FaultPlanError("FaultPlan.random needs at least one topic partition")
        kinds = ["slow-fetch", "stale-hw", "produce", "commit", "broker-pause", "retention", "unexpected"]
        if names:
            kinds.append("member-pause")
        if group is not None:
            kinds.append("join-leave")
        faults: list[Fault] = []
        for _ in range(count):
            kind = rng.choice(kinds)
            at = round(rng.uniform(0.0, horizon), 3)
            span = round(rng.uniform(0.1, 2.0 * session_timeout), 3)
            who = rng.choice(names) if names else None
            topic, partition = rng.choice(parts)
            if kind == "slow-fetch":
                faults.append(SlowFetch(at, at + span, who))
            elif kind == "stale-hw":
                faults.append(StaleHighWater(at, at + span, who, topic, partition))
            elif kind == "produce":
                written = rng.random() < 0.7
                ack = LOST if not written or rng.random() < 0.4 else DELAYED
                faults.append(ProduceFault(at, at + round(rng.uniform(0.05, 3.0), 3), topic, partition, written, ack,
                                           round(rng.uniform(0.0, 5.0), 3) if ack == DELAYED else 0.0))
            elif kind == "commit":
                faults.append(CommitFault(at, at + round(rng.uniform(0.05, 3.0), 3), who, rng.random() < 0.5,
                                          rng.random() < 0.3))
            elif kind == "broker-pause":
                faults.append(BrokerPause(at, at + round(rng.uniform(0.1, session_timeout), 3)))
            elif kind == "retention":
                faults.append(Retention(at, topic, partition, rng.randint(1, 2)))
            elif kind == "unexpected":
                faults.append(UnexpectedRecord(at, topic, partition, rng.choice(UNEXPECTED_KINDS)))
            elif kind == "member-pause":
                faults.append(MemberPause(at, at + span, rng.choice(names)))
            else:
                faults.append(MemberJoinsAndLeaves(at, at + span, group))  # type: ignore[arg-type]
        return cls(faults)

    def describe(self) -> str:
        """One line per fault, in time order (for a failing run's report)."""
        lines = []
        for f in self.faults:
            args = ", ".join(f"{fl.name}={getattr(f, fl.name)!r}" for fl in fields(f))
            lines.append(f"{type(f).__name__}({args})")
        return "\n".join(lines)

    def __len__(self) -> int:
        return len(self.faults)

    def __repr__(self) -> str:
        return f"FaultPlan({len(self.faults)} fault(s))"
