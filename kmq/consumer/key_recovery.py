"""``consumer.ordering: key`` across a change of partition owner: the reads, on a thread of their own.

When a partition is assigned, :class:`KeyRecovery` holds its messages in the
:class:`~kmq.consumer.keyed_ready.KeyedReadyQueue` until it learned which of its keys an earlier
owner (a crashed worker, or one that lost the partition in a rebalance and still runs its
handlers) left unsettled below the offset this consumer starts at. Through the client seam's
:class:`~kmq.client.LogReader`, no group joined:

1. where this consumer starts: the workers group's committed offset of the partition, or the
   first offset handed over since the assignment when that is lower (this consumer committed
   before the read);
2. the tracker group's committed offset of the markers partition (as ``kmq trace`` reads it), and
   the markers from there to the end, folded (:class:`~kmq.core.inherited_keys.MarkerFold`);
3. the queue records from the lowest unsettled offset below the start on, into the backlog (their
   keys and ``kmq-origin``: a copy of an earlier message waiting in the backlog is one too):
   :func:`~kmq.core.inherited_keys.inherit` decides which keys wait.

Then, while any key waits, it reads the new markers of that partition every
:data:`TAIL_INTERVAL` and releases an origin whose delivery was settled for good. A copy handed
out by this consumer, or the bounded wait, releases it too (in :mod:`kmq.core.key_order`). The
cost is bounded by a :class:`~kmq.core.inherited_keys.RecoveryBudget`; over it, or when a read
fails, the partition goes on without (warned and counted). Nothing here runs on the fetcher thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from kmq.client import LogReader
from kmq.config import Config, QueueConfig
from kmq.consumer.keyed_ready import KeyedReadyQueue
from kmq.core.errors import KmqError
from kmq.core.inherited_keys import DEFAULT_BUDGET, MarkerFold, QueueRecord, RecoveryBudget, inherit
from kmq.core.markers import BadMarker, decode_record
from kmq.core.message import for_group, origin_offset
from kmq.telemetry.metrics import ConsumerMetrics

__all__ = ["KeyRecovery", "TAIL_INTERVAL"]

log = logging.getLogger(__name__)

#: Seconds between reads of the new markers while a key waits for an earlier owner's message.
TAIL_INTERVAL = 0.5


class _OverBudget(KmqError):
    """The lookup would cost more than its budget (the partition then goes on without)."""


@dataclass
class _Watched:
    """A partition whose keys wait: its markers so far, and the deliveries whose settlement frees them."""

    fold: MarkerFold
    watch: dict[int, tuple[bytes, int]]  # delivery offset -> (key, origin)


class KeyRecovery:
    """Learn what an earlier owner left unsettled in each assigned partition (see the module docstring).

    :param open_reader: makes the :class:`~kmq.client.LogReader` (opened on first use, closed by
        :meth:`close`).
    :param copy_wait: seconds a key waits at most for an inherited message.
    """

    def __init__(self, cfg: Config, queue: QueueConfig, keyed: KeyedReadyQueue, metrics: ConsumerMetrics,
                 copy_wait: float, open_reader: Callable[[], LogReader],
                 budget: RecoveryBudget = DEFAULT_BUDGET) -> None:
        self.queue, self.keyed, self.metrics = queue, keyed, metrics
        self.tracker_group, self.group = cfg.tracker.group_id, cfg.workers_group(queue)
        self.copy_wait, self.budget = copy_wait, budget
        self._open_reader = open_reader
        self._reader: LogReader | None = None
        self._jobs: deque[tuple[int, int]] = deque()  # (partition, hold number)
        self._watched: dict[int, _Watched] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the consumer's side
    def assigned(self, partitions: set[int], gen: int) -> None:
        """Hold the messages of ``partitions``, assigned at pipeline generation ``gen``, and look up
        what lies below their start (called on the fetcher thread, in the rebalance order)."""
        if not partitions:
            return
        self._jobs.extend(sorted(self.keyed.hold(partitions, gen).items()))
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, name=f"kmq-key-recovery-{self.queue.name}",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------ the recovery thread
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    while self._jobs and not self._stop.is_set():
                        self._recover(*self._jobs.popleft())
                    if self._watched:
                        self._tail()
                    self.metrics.ordering_inherited_keys.labels(self.queue.name).set(self.keyed.inherited_keys())
                except Exception:  # a bug: keys still wait at most their bounded wait
                    log.exception("%s: looking up what earlier partition owners left unsettled failed", self.queue.name)
                self._wake.wait(TAIL_INTERVAL if self._watched else 5.0)
                self._wake.clear()
        finally:
            while self._jobs:  # closing: let nothing stay held
                p, hold = self._jobs.popleft()
                self.keyed.inherit(p, {}, 0.0, hold)
            if self._reader is not None:
                try:
                    self._reader.close()
                except Exception as exc:  # noqa: BLE001 - closing is best effort
                    log.debug("closing the key-recovery reader of %s: %s", self.queue.name, exc)

    def _recover(self, p: int, hold: int) -> None:
        """Hold ``p``'s keys for what the earlier owner left unsettled below the start, or give up."""
        name, began = self.queue.name, time.monotonic()
        try:
            start = self._start(p)
            if start is None:  # nothing committed: no earlier owner handed anything out
                self.keyed.inherit(p, {}, 0.0, hold)
                self.metrics.ordering_recoveries.labels(name, "clean").inc()
                return
            fold, records, committed, cut = self._read(p, start, began + self.budget.seconds)
        except Exception as exc:  # noqa: BLE001 - a failed read must not stop the partition for ever
            # Counted and said before the partition is let go: whoever sees its messages can see why.
            self.metrics.ordering_recoveries.labels(name, "given_up").inc()
            log.warning("%s[%d]: could not learn which messages an earlier owner left unsettled (%s): the "
                        "partition goes on without, so a later message of a key may be handled before an earlier "
                        "one that is redelivered (this consumer needs Read on the markers topic and Describe on the "
                        "tracker group %r)", name, p, exc, self.tracker_group)
            self.keyed.inherit(p, {}, 0.0, hold)
            return
        result = inherit(fold, records, start)
        applied = self.keyed.inherit(p, result.keys, time.monotonic() + self.copy_wait, hold)
        self.metrics.ordering_recoveries.labels(name, "inherited" if result.keys else "clean").inc()
        if result.watch and applied:
            self._watched[p] = _Watched(fold, dict(result.watch))
        level = logging.INFO if result.keys else logging.DEBUG
        first = min(((o, k) for k, os in result.keys.items() for o in os), default=None)
        log.log(level, "%s[%d]: new owner from offset %d: read %d marker(s) from the tracker's committed offset %s "
                "and %d queue record(s) in %.3fs; %d key(s) wait for %d message(s) an earlier owner left unsettled%s%s",
                name, p, start, fold.records, committed, len(records), time.monotonic() - began, len(result.keys),
                result.origins, "" if first is None else f" (first {name}/{p}/{first[0]}, key {first[1]!r})",
                f"; copies past offset {records[-1].offset} not looked for (over the budget)" if cut else "")

    def _start(self, p: int) -> int | None:
        """Where this consumer starts in ``p`` (None: the group committed nothing, so no earlier owner
        handed anything out). If this consumer committed before the look-up, the committed offset is
        past its own first messages: the first offset it handed over since the assignment is lower
        (looked at after the read, as the commit comes before the hand-over)."""
        if self._reader is None:
            self._reader = self._open_reader()
        tp = (self.queue.name, p)
        committed = self._reader.committed(self.group, [tp]).get(tp)
        first = self.keyed.first_offset(p)
        return committed if committed is None or first is None else min(committed, first)

    def _read(self, p: int, start: int, deadline: float) -> tuple[MarkerFold, list[QueueRecord], int | None, bool]:
        """The folded markers from the tracker's committed offset; the queue records from the lowest
        unsettled offset below ``start`` into the backlog (True: the backlog read was cut by the budget)."""
        reader, q, budget = self._reader, self.queue, self.budget
        assert reader is not None  # opened by _start
        mtp = (q.markers_topic, p)
        committed = reader.committed(self.tracker_group, [mtp]).get(mtp)
        fold = MarkerFold(committed)
        for _tp, batch in reader.scan({mtp: committed}):
            self._fold(fold, p, batch)
            if fold.records > budget.markers or time.monotonic() > deadline:
                raise _OverBudget(f"over the budget: more than {budget.markers} markers from offset {committed}, "
                                  f"or longer than {budget.seconds:g}s")
        self.metrics.ordering_recovery_records.labels(q.name, "markers").inc(fold.records)
        lowest = fold.lowest_unsettled(start)
        records: list[QueueRecord] = []
        cut = False
        try:
            for _tp, batch in reader.scan({(q.name, p): start if lowest is None else lowest}):
                # Another consumer group's copies are not this group's deliveries: they hold no key here.
                records.extend(QueueRecord(r.offset, r.key, origin_offset(r.headers, q.name, p, r.offset))
                               for r in batch if for_group(r.headers, q.group, q.name, p, r.offset))
                if len(records) >= budget.queue or time.monotonic() > deadline:
                    if records[-1].offset < start:
                        raise _OverBudget(f"over the budget: more than {budget.queue} queue records below offset "
                                          f"{start} from {lowest}, or longer than {budget.seconds:g}s")
                    cut = True
                    break
        finally:
            self.metrics.ordering_recovery_records.labels(q.name, "queue").inc(len(records))
        return fold, records, committed, cut

    def _fold(self, fold: MarkerFold, p: int, batch: list) -> None:
        for rec in batch:
            m = decode_record(rec.key, rec.value, p)
            if isinstance(m, BadMarker):
                fold.skip(rec.offset)
            else:
                fold.apply(m, rec.offset, rec.timestamp)

    def _tail(self) -> None:
        """Read the new markers of the watched partitions; release origins settled for good."""
        q = self.queue
        starts = {(q.markers_topic, p): w.fold.position for p, w in self._watched.items()}
        assert self._reader is not None  # opened by the recovery that began the watch
        try:
            for (_t, p), batch in self._reader.scan(starts):
                self._fold(self._watched[p].fold, p, batch)
        except Exception as exc:  # noqa: BLE001 - tried again at the next interval; the wait is bounded
            log.warning("%s: reading the markers of partitions %s failed (%s); tried again in %gs", q.name,
                        sorted(p for _t, p in starts), exc, TAIL_INTERVAL)
            return
        for p, w in list(self._watched.items()):
            live = self.keyed.inherited_origins(p)
            released = [(key, origin) for off, (key, origin) in w.watch.items()
                        if origin in live and w.fold.settled(off)]
            w.watch = {off: ko for off, ko in w.watch.items() if ko[1] in live and not w.fold.settled(off)}
            if released:
                self.keyed.inherited_settled(p, released)
            if not w.watch:
                del self._watched[p]
