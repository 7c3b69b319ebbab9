"""Consumer flow control: how much a consumer may take from Kafka right now.

Pure (no Kafka import, ``now`` is always passed in), like
:mod:`kmq.core.lease_state`. :class:`~kmq.consumer.consumer.KmqConsumer` asks
:meth:`FlowControl.room` before every Kafka poll and reports what it took
(:meth:`FlowControl.taken`) and what user code settled
(:meth:`FlowControl.settled`).

The problem it solves: a message's lease starts with its START marker, which
is written when the message is fetched, not when a handler starts on it. A
consumer that takes more than its handlers can start within a lease lets
leases run out in its own queues, and every expiry appends a copy: more work,
a redelivery storm. So, in the manner of the Pub/Sub client's flow control:

* *outstanding* = fetched (START sent) and not yet settled, given back, or
  past its lease in user code (:mod:`kmq.consumer.lease_expiry`: a message
  nobody settles must not hold room for ever);
* outstanding messages are bounded by count (``max_messages``) and bytes
  (``max_bytes``), and
* by what the handlers can start within ``lease_fraction`` of a lease at the
  measured processing rate: ``rate x lease x lease_fraction``, never below
  ``min_messages`` (so a slow start or an idle spell does not starve it).

The rate is settlements per second of *busy* time (time with messages handed
to user code and not yet settled), smoothed over ``window`` seconds, so an
idle queue, or a START write held up by a broker outage, does not read as a
slow handler. A message therefore waits at most about
``lease_fraction`` of its lease between its START and its handler, whatever
the backlog.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FlowLimits", "FlowControl", "Room"]


@dataclass(frozen=True)
class FlowLimits:
    """Bounds of one consumer's outstanding messages."""

    lease: float  # seconds; the queue's lease
    max_messages: int = 10_000  # hard cap on outstanding messages
    max_bytes: int = 100 * 1024 * 1024  # hard cap on outstanding payload bytes
    min_messages: int = 100  # floor of the rate-derived bound
    lease_fraction: float = 0.5  # outstanding work must be startable within this part of a lease
    window: float = 5.0  # seconds of busy time the rate is smoothed over

    def __post_init__(self) -> None:
        if self.lease <= 0:
            raise ValueError("lease must be > 0")
        if self.max_messages < 1 or self.max_bytes < 1 or self.min_messages < 1:
            raise ValueError("max_messages, max_bytes and min_messages must be >= 1")
        if not 0 < self.lease_fraction <= 1:
            raise ValueError("lease_fraction must be in (0, 1]")
        if self.window <= 0:
            raise ValueError("window must be > 0")


@dataclass(frozen=True)
class Room:
    """What may be taken now: ``messages`` more, and ``bytes`` more payload."""

    messages: int
    bytes: int

    def __bool__(self) -> bool:
        return self.messages > 0 and self.bytes > 0


class FlowControl:
    """Outstanding messages and the measured processing rate of one consumer."""

    def __init__(self, limits: FlowLimits, now: float) -> None:
        self.limits = limits
        self.outstanding = 0
        self.outstanding_bytes = 0
        self.available = 0  # handed to user code, not settled: what keeps handlers busy
        #: Of the outstanding, messages held back for their key (``consumer.ordering: key``): they
        #: wait for their key, not for a handler, so they are outside the bounds (the consumer bounds them).
        self.held = 0
        self._rate: float | None = None  # settlements per busy second, smoothed
        self._busy = 0.0  # busy seconds since the last rate update
        self._done = 0  # settlements since the last rate update
        self._last = now

    # ------------------------------------------------------------ measuring
    def _tick(self, now: float, settled: int = 0) -> None:
        """Account busy time up to ``now`` and ``settled`` settlements at ``now``; fold a full
        sample into the rate (a sample always ends with the settlements of its last moment)."""
        dt = now - self._last
        if dt > 0:  # a reading older than the last one (another thread's) adds no time
            self._last = now
            if self.available > 0:
                self._busy += dt
        self._done += settled
        # Fold samples of at least 0.25 s of busy time (shorter ones are noise). The first sample
        # may be 200 settlements instead: fast handlers accumulate busy time slowly, and until
        # the first sample the bound stays at its floor.
        first = self._rate is None and self._done >= 200 and self._busy >= 0.002
        if self._busy >= 0.25 or first:
            sample = self._done / self._busy
            if self._rate is None:
                self._rate = sample
            else:
                # Exponential smoothing with a time constant of `window` busy seconds.
                w = min(1.0, self._busy / self.limits.window)
                self._rate += w * (sample - self._rate)
            self._busy = 0.0
            self._done = 0

    def taken(self, messages: int, nbytes: int, now: float) -> None:
        """``messages`` (``nbytes`` of payload) were fetched: their leases run from now."""
        self._tick(now)
        self.outstanding += messages
        self.outstanding_bytes += nbytes

    def handed(self, messages: int, now: float) -> None:
        """``messages`` were handed to user code (START acknowledged, offsets committed)."""
        self._tick(now)
        self.available += messages

    def settled(self, messages: int, nbytes: int, now: float) -> None:
        """User code settled ``messages``: they leave the bound and count for the rate."""
        self._tick(now, messages)
        self.available = max(0, self.available - messages)
        self._release(messages, nbytes)

    def returned(self, messages: int, nbytes: int, now: float) -> None:
        """Messages given back unprocessed (revoked, closing): leave the bound, not the rate."""
        self._tick(now)
        self._release(messages, nbytes)

    def expired(self, messages: int, nbytes: int, now: float) -> None:
        """Handed messages whose lease ended unsettled (the tracker redelivers them): they leave
        the bound and stop keeping the handlers busy, but are no settlements for the rate."""
        self._tick(now)
        self.available = max(0, self.available - messages)
        self._release(messages, nbytes)

    def _release(self, messages: int, nbytes: int) -> None:
        self.outstanding = max(0, self.outstanding - messages)
        self.outstanding_bytes = max(0, self.outstanding_bytes - nbytes)

    # ------------------------------------------------------------ deciding
    @property
    def rate(self) -> float | None:
        """Measured settlements per second while busy (None until measured)."""
        return self._rate

    def limit(self, now: float) -> int:
        """Current bound on outstanding messages."""
        self._tick(now)
        lim = self.limits
        if self._rate is None:
            return min(lim.max_messages, lim.min_messages)
        fits = int(self._rate * lim.lease * lim.lease_fraction)
        return max(1, min(lim.max_messages, max(lim.min_messages, fits)))

    def room(self, now: float) -> Room:
        """How many more messages (and bytes) may be fetched now. A consumer with
        nothing outstanding always gets room for at least one message, so one
        message larger than ``max_bytes`` cannot block it for ever."""
        counted = max(0, self.outstanding - self.held)
        messages = self.limit(now) - counted
        nbytes = self.limits.max_bytes - self.outstanding_bytes
        if counted == 0:
            return Room(max(1, messages), max(1, nbytes))
        return Room(max(0, messages), max(0, nbytes))

    def fetchable(self, now: float, partition_room: int, fetch_size: int, partition_cap: int) -> int:
        """How many records the next Kafka poll may ask for (0: no room). ``partition_room``: what
        the fullest partition may still take (Kafka caps a poll in total, not per partition).
        While messages are outstanding, fetch in steps of at least a quarter of the bound (or a
        whole fetch): many small fetches would each pay a client's per-poll cost and a START."""
        room = self.room(now)
        if not room:
            return 0
        n = min(fetch_size, room.messages, partition_room)
        step = max(1, min(fetch_size, self.limit(now) // 4, partition_cap // 4))
        if n < step and self.outstanding > self.held:
            return 0
        return max(0, n)

    def wait_bound(self) -> float | None:
        """Seconds the newest outstanding message may wait for a handler at the
        measured rate (None until measured): what the bound keeps under the lease."""
        if not self._rate:
            return None
        return self.outstanding / self._rate
