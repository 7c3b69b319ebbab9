"""Watchdog for the consumer's fetcher thread: a Kafka poll that stops returning.

Why it exists: kafka-python 3.0 runs its network I/O on an event-loop thread;
``KafkaConsumer.poll`` schedules a wait on that loop and blocks on a
``threading.Event`` with no timeout (``NetworkSelector.run``). After a broker
outage of some seconds the loop can lose that waiter (reproduced with
``DevBroker(storage="s3")`` killed for 20 s and restarted on the same port:
the fetcher waits in ``Event.wait`` for ever while the I/O thread idles in
``select``). A poll asked for at most 100 ms then never returns, and a worker
stays alive and idle, which no orchestrator notices.

:class:`StallDetector` is the pure decision (time passed in): a poll that has
been running for longer than ``stall_timeout`` is stalled. The first stall is
*recovered*: the waiters blocked inside kafka-python are failed with a
timeout (its own ``_fail_pending_waiters``, what its loop does when it dies),
so ``poll`` raises, the fetcher logs it and polls again. A second stall
before any poll returned normally is *fatal*: the consumer fails with
:class:`~kmq.core.errors.FetcherStalled`, so ``kmq work`` exits non-zero with a
clear line and the orchestrator restarts it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

__all__ = ["StallDetector", "FetchWatchdog", "RECOVER", "FAIL", "unstrand_records", "lagging_partitions"]

log = logging.getLogger(__name__)

RECOVER, FAIL = "recover", "fail"


def unstrand_records(kc: Any) -> None:
    """Work around a kafka-python 3.0 fetcher bug before each poll.

    Records of a paused partition are parked (KAFKA-7548) and put back on resume
    only while ``Fetcher._next_partition_records`` is None; a drained one stays
    in that slot as an empty (falsy) object, so the parked records are never put
    back, and the partition is never fetched again (the fetcher skips partitions
    with parked data). Reproduced: a member paused at its in-flight cap, a
    rebalance, and its remaining partition stopped at position < high-water for
    good. Clearing a drained slot is what the fetcher itself does on its next
    completion; no records are dropped."""
    fetcher: Any = getattr(kc, "_fetcher", None)
    nxt = getattr(fetcher, "_next_partition_records", None)
    if nxt is not None and not nxt and getattr(fetcher, "_paused_partition_records", None):
        fetcher._next_partition_records = None


def lagging_partitions(kc: Any) -> dict:
    """``{tp: position}`` of assigned, unpaused partitions with records past their position
    (by the last fetch's high-water mark): what a fetcher that returns nothing must not have."""
    out = {}
    paused = kc.paused()
    for tp in kc.assignment():
        if tp in paused:
            continue
        high = kc.highwater(tp)
        try:
            pos = kc.position(tp, timeout_ms=0) if high is not None else None
        except Exception:  # noqa: BLE001 - no position yet: not lagging as far as we know
            pos = None
        if high is not None and pos is not None and high > pos:
            out[tp] = pos
    return out


class StallDetector:
    """Pure: is the current poll stalled, and what to do about it."""

    def __init__(self, stall_timeout: float) -> None:
        if stall_timeout <= 0:
            raise ValueError("stall_timeout must be > 0")
        self.stall_timeout = stall_timeout
        self._since: float | None = None  # start of the poll in progress
        self._recovered = False  # a recovery was tried since the last normal return
        self.recoveries = 0

    def poll_started(self, now: float) -> None:
        self._since = now

    def poll_returned(self, now: float, normally: bool = True) -> None:
        self._since = None
        if normally:
            self._recovered = False

    def check(self, now: float) -> str | None:
        """None (fine), :data:`RECOVER` or :data:`FAIL`; a stalled poll restarts its clock."""
        if self._since is None or now - self._since < self.stall_timeout:
            return None
        self._since = now  # one action per stall_timeout
        if self._recovered:
            return FAIL
        self._recovered = True
        self.recoveries += 1
        return RECOVER

    def stalled_for(self, now: float) -> float:
        return 0.0 if self._since is None else now - self._since


class FetchWatchdog:
    """Thread applying a :class:`StallDetector` to a kafka-python consumer.

    ``on_fatal(message)`` is called (from the watchdog thread) when recovery failed."""

    def __init__(self, kc: Any, stall_timeout: float, on_fatal: Callable[[str], None], name: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.detector = StallDetector(stall_timeout)
        self._kc = kc
        self._on_fatal = on_fatal
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kmq-watchdog-{name}", daemon=True)

    def start(self) -> "FetchWatchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def poll_started(self) -> None:
        with self._lock:
            self.detector.poll_started(self._clock())

    def poll_returned(self, normally: bool = True) -> None:
        with self._lock:
            self.detector.poll_returned(self._clock(), normally)

    def _run(self) -> None:
        period = max(0.05, min(1.0, self.detector.stall_timeout / 4))
        while not self._stop.wait(period):
            with self._lock:
                now = self._clock()
                stalled = self.detector.stalled_for(now)
                action = self.detector.check(now)
            if action == RECOVER:
                log.warning("Kafka poll has not returned for %.1fs (kafka-python lost its wake-up, typically after "
                            "a broker outage); failing its blocked waits so the fetcher polls again", stalled)
                if not self._unblock():
                    action = FAIL
            if action == FAIL:
                self._on_fatal(
                    f"the fetcher is stalled: a Kafka poll has not returned for {stalled:.0f}s and could not be "
                    "unblocked; exiting so the process can be restarted (consumer.fetch_stall_timeout)"
                )
                return

    def unstick_fetches(self) -> bool:
        """Forget fetch requests kafka-python still counts as pending for a node although
        nothing came back for longer than a request may take: while one is counted, that
        node gets no new fetch (``Fetcher._nodes_with_pending_fetch_requests``), so a lost
        response (seen after a cooperative revocation and after broker restarts) stops
        consumption for good. Returns False when this kafka-python has no such state."""
        fetcher = getattr(self._kc, "_fetcher", None)
        nodes = getattr(fetcher, "_nodes_with_pending_fetch_requests", None)
        if not isinstance(nodes, set):
            return False
        log.warning("no records for a while although partitions lag behind; forgetting kafka-python's pending "
                    "fetches to nodes %s so new fetches are sent", sorted(nodes))
        nodes.clear()
        return True

    def _unblock(self) -> bool:
        net = getattr(self._kc, "_net", None)
        fail = getattr(net, "_fail_pending_waiters", None)
        if fail is None:  # another kafka-python: nothing to unblock with
            return False
        from kafka.errors import KafkaTimeoutError

        fail(KafkaTimeoutError("kmq fetch watchdog: poll stalled"))
        return True
