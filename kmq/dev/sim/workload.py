"""What the simulated handlers do with a delivery, drawn from a seed.

A :class:`Workload` is the shape of one schedule: how many messages, over how
many partitions, how the queue is configured (lease, deliveries before the
DLQ), and how often a handler acks, nacks, rejects, hangs (its lease lapses)
or crashes its worker (the worker loses what it holds and restarts from the
committed offsets). :meth:`Workload.handle` draws one delivery's fate from
the schedule's own ``random.Random``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kmq.dev.sim.errors import SimulationError

__all__ = ["Workload", "Fate", "QUEUE", "GROUP", "message_id", "SERVICE", "STEP", "ACK", "NACK", "REJECT", "HANG", "CRASH", "FATES"]

#: Message ids are ``m00000`` .. ``m99999``.
MAX_MESSAGES = 99_999

#: The simulated queue topic and its workers' group.
QUEUE = "q"
GROUP = "kmq-workers"


def message_id(value: bytes | None) -> str | None:
    """The workload message a record carries (originals and copies alike), None for other records."""
    if value is not None and len(value) == 6 and value.startswith(b"m") and value[1:].isdigit():
        return value.decode()
    return None

#: The tracker actor: the service's whole loop (``Tracker.step``) or only its redelivery step.
SERVICE, STEP = "service", "step"

ACK, NACK, REJECT, HANG, CRASH = "ack", "nack", "reject", "hang", "crash"
FATES = (ACK, NACK, REJECT, HANG, CRASH)


@dataclass(frozen=True, slots=True)
class Fate:
    """What the handler does with one delivery, ``after`` seconds of processing."""

    kind: str
    after: float


@dataclass(frozen=True, slots=True)
class Workload:
    """One schedule's workload and queue settings (times in simulated seconds)."""

    partitions: int = 2
    messages: int = 40
    workers: int = 2
    produce_over: float = 20.0  # the producer spreads its sends over this long
    lease: float = 2.0
    max_deliveries: int = 3
    # Handler fates, as weights (normalised by the draw).
    weights: tuple[tuple[str, float], ...] = ((ACK, 0.72), (NACK, 0.08), (REJECT, 0.04), (HANG, 0.13), (CRASH, 0.03))
    processing: tuple[float, float] = (0.01, 1.5)  # seconds, uniform; past the lease sometimes (late END)
    # The delay a handler's NACK asks for (KmqConsumer.run asks for the backoff of the delivery count).
    nack_delay: float = 0.5
    restart_after: float = 3.0  # a crashed worker comes back after this long
    tracker_loop: str = SERVICE
    # In this share of the seeds whose search stalls one partition's reads, the stalled one is a markers
    # partition, whose end the tracker looks up (kmq.dev.sim.search); 0 in the default search (docs/architecture.md).
    slow_markers_share: float = 0.0
    tracker_crash_chance: float = 0.3  # the service tracker is killed once, at a random time, in this share of seeds
    # In this share of seeds the workers run with consumer.ordering: key and the messages share `keys` keys
    # (otherwise each message is its own key); the search runs 0.3 (kmq.dev.sim.search.ORDERED_SHARE).
    ordering_share: float = 0.0
    keys: int = 5
    # In this share of the other seeds the workers run with consumer.hand_over: started (a batch goes to
    # the handlers once its START is acknowledged, before its commit); the search runs 0.5
    # (kmq.dev.sim.search.STARTED_SHARE).
    hand_over_started_share: float = 0.0
    # In this share of seeds the workers read read_committed, as librdkafka's default (kafka.client: confluent),
    # else read_uncommitted, as kafka-python's; it matters under an OpenTransaction fault. The search runs 0.3
    # (kmq.dev.sim.search.READ_COMMITTED_SHARE).
    read_committed_share: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.messages <= MAX_MESSAGES:
            raise SimulationError(f"a workload sends 1 to {MAX_MESSAGES} messages (ids m00000..m99999), "
                                  f"not {self.messages}")
        if self.tracker_loop not in (SERVICE, STEP):
            raise SimulationError(f"tracker_loop must be {SERVICE!r} or {STEP!r}, not {self.tracker_loop!r}")
        if self.partitions < 1 or self.workers < 1 or self.max_deliveries < 1 or self.keys < 1:
            raise SimulationError("a workload needs at least one partition, one worker, one key and max_deliveries >= 1")

    def handle(self, rng: random.Random) -> Fate:
        kinds = [k for k, _ in self.weights]
        kind = rng.choices(kinds, [w for _, w in self.weights])[0]
        return Fate(kind, round(rng.uniform(*self.processing), 6))

    def key_of(self, mid: str, ordered: bool) -> bytes:
        """The record key of message ``mid``: shared by every ``keys``-th message when ``ordered``."""
        return f"k{int(mid[1:]) % self.keys}".encode() if ordered else mid.encode()

    def send_times(self, rng: random.Random) -> list[float]:
        """When the producer sends each message (sorted)."""
        return sorted(round(rng.uniform(0.0, self.produce_over), 6) for _ in range(self.messages))
