"""The redelivery tracker service: group membership, commit, main loop.

One consumer group (``tracker.group_id``) reads the markers topics of all
configured queues; any number of instances share the partitions. Per owned
markers partition the pure :class:`~kmq.core.lease_state.PartitionState` holds
the open leases. The step's decisions are pure too: catch-up
(:mod:`kmq.core.catch_up_plan`, carried out by :mod:`tracker.catch_up`), the
markers read (:mod:`kmq.core.marker_batch`), the look-ups of the markers' ends and the
commits (:mod:`kmq.core.end_lookups`), the round over the due partitions
(:mod:`kmq.core.due_round`), one partition's redelivery
(:mod:`kmq.core.redelivery_run`, carried out by :mod:`tracker.redeliver`); this
module feeds them and carries out their answers, and :mod:`tracker.assignment`
keeps the owned partitions.

* On assignment a partition catches up (:mod:`tracker.catch_up`): it resumes
  from its committed marker offset, and its due messages are redelivered only
  once its position reached a log end read after the assignment, so a restart
  never redelivers something whose END is still unread.
* Due partitions are served least recently served first, within a time
  budget per step: a slow partition (an unreachable leader, a slow broker)
  delays the others by one step at most and keeps its own retry backoff.
* A step costs nothing for a partition neither due nor changed (so idle cost does
  not grow with the partitions): a :class:`~kmq.core.due_schedule.DueSchedule`
  holds the next due times; commits and gauges visit the partitions whose state
  changed (gauges also those with messages in flight, whose age grows).
* The view is dropped (every partition re-read from its committed offset
  before acting) only when the group may have moved partitions without the
  listener being told: after a whole-process pause past the session timeout
  (:mod:`tracker.membership`; heartbeats run on the client's own thread, so a slow
  step is no such risk), past ``max.poll.interval`` without a poll, or when the
  group refuses a commit. Copies made after such a pause are counted as
  possible duplicates.
* Every partition is re-read the same way when the tracker's own clock jumps
  (:class:`~kmq.core.marker_clock.ClockWatch`): the times it keeps are on the
  old clock, and leases are judged only once each partition caught up again on
  the new one.
* A marker of a newer wire version is read by its version-1 fields, or, when
  it cannot be, holds its partition at it (:mod:`tracker.upgrades`): never
  skipped, never a crash.
* One partition's failure (even an unexpected one) never stops the service:
  its offsets stay open and are retried with a capped backoff.
* The committed marker offset is the smallest START marker offset that still
  has open offsets (else the position): a restart replays only what is open.
* On revoke the partition's offset is committed and its state dropped.
* SIGTERM (or :meth:`Tracker.stop`) finishes the current step, commits and
  leaves the group. SIGKILL loses nothing: the new owner replays from the
  last commit, which never passes an open START.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter as Tally
from types import MappingProxyType
from typing import Any, Callable, Mapping

from prometheus_client import CollectorRegistry

from kmq.client import GroupConsumerAdapter, LogReadError, Partition, Record
from kmq.client.parts import KAFKA_CLIENTS, ClientFactory
from kmq.config import Config, QueueConfig
from kmq.core.due_round import CLOCK as DUE_CLOCK
from kmq.core.due_round import MONO, RETRY_TARGETS, STOPPING, Doubted, LookUpEnds, Redeliver, serve_due
from kmq.core.end_lookups import EndLookups
from kmq.core.errors import BrokerUnavailable, KmqError, MarkerDecodeError  # noqa: F401 - tests reach service.BrokerUnavailable
from kmq.core.lease_state import PartitionState
from kmq.core.marker_clock import ClockWatch
from kmq.core.marker_batch import apply_batch, to_apply
from kmq.core.step_timers import StepTimers
from kmq.core.redelivery_plan import retry_at_ms
from kmq.telemetry.metrics import TrackerMetrics
from tracker.assignment import Assignment
from tracker.http import HealthServer
from tracker.membership import MembershipCheck, Pauses, PauseWatch
from tracker.clock_skew import SkewGauge
from tracker.partition import OwnedPartition, partition_names, publish_gauges
from tracker.redeliver import Redeliverer, copy_producer, copy_request_size_for, send_wait_s
from tracker.upgrades import hold, note_newer, publish_held

__all__ = ["Tracker"]

log = logging.getLogger(__name__)

_COMMIT_INTERVAL_S = 1.0
_METRICS_INTERVAL_S = 1.0
# Offsets handed to the redeliverer per partition and step: bounds one step's work (and memory). Each
# step ends with a flush and its CLOSED markers: fewer, larger steps drain the pipeline less often.
_DUE_LIMIT = 50_000
# Redelivery time of one step after which no further partition is started: the step returns to
# poll (markers, commits, metrics, stop) and the partitions not served yet go first next step.
_STEP_BUDGET_S = 1.0
# The markers consumer's max.poll.interval: past it without a poll the client leaves the group.
_MAX_POLL_INTERVAL_S = 300.0
# Markers read per poll (also kafka-python's max_poll_records).
_POLL_RECORDS = 5000
# How long the broker may hold a look-up's fetch of a markers partition's end. Not lower: with
# librdkafka's fetch.wait.max.ms at 5 ms, reads at the log start went unanswered for good after a
# broker restart (every catch-up look-up stalled; measured on the embedded broker).
_LOOKUP_FETCH_WAIT_MS = 50
# Partitions positioned, or asked for their log end, in one step. A tracker given thousands of
# partitions at once catches up over several steps: each stays short (a client's assign or seek of
# thousands of partitions can hold the interpreter for seconds, which the pause watch must take for
# a frozen process), a look-up that fails loses only its own partitions' answers, and SIGTERM is
# served between steps.
_PARTITIONS_PER_LOOKUP = 500
# While leases are due and no look-up was needed for this long (ms), one partition's end is looked up
# anyway: a broker that went away shows as a failed look-up.
_PROBE_INTERVAL_MS = 2_000


class Tracker:
    """The redelivery tracker. ``Tracker(cfg).run()`` blocks until SIGTERM/SIGINT or :meth:`stop`.

    For tests and embedding: :meth:`start` runs it in a thread and returns once
    the HTTP endpoints are up; :meth:`stop` drains, commits and leaves the group.
    To drive it from another loop instead: :meth:`open`, then :meth:`step` as often as
    wanted (:meth:`next_due_s` says when something is next due), then :meth:`close`.

    :param clock: the wall clock (seconds since the epoch) leases are judged on.
    :param clients: builds its Kafka clients (:class:`~kmq.client.parts.ClientFactory`; default:
        the clients ``kafka.client`` names, on the configured cluster).
    :param monotonic: its monotonic clock (commit and metrics intervals, the step budget, liveness;
        default ``time.monotonic``).
    :param pauses: what tells it how long the process was frozen (:class:`~tracker.membership.Pauses`;
        default: a :class:`~tracker.membership.PauseWatch` thread on ``monotonic``).
    :mod:`kmq.testing` passes a simulated cluster's clients and its virtual clock for all three;
    ``kmq sim`` (:mod:`kmq.dev.sim.tracker_loop`) and ``kmq bench tracker --idle-partitions`` pass
    theirs too, and then call :meth:`open`, so each runs the tracker as ``run`` builds it.
    """

    def __init__(self, cfg: Config, registry: CollectorRegistry | None = None, http_host: str = "0.0.0.0",
                 clock: Callable[[], float] = time.time, *, clients: ClientFactory = KAFKA_CLIENTS,
                 monotonic: Callable[[], float] | None = None, pauses: Pauses | None = None) -> None:
        if not cfg.queues:
            raise KmqError("the tracker needs at least one queue under `queues:` in the configuration")
        self.cfg = cfg
        self.metrics = TrackerMetrics(registry)
        self._clock = clock
        self._http_host = http_host
        # The owned partitions and which of them a step visits (see the module docstring).
        self._assigned = Assignment(cfg.queues, self.metrics, self._now_ms, max(50, int(cfg.tracker.tick * 1000)),
                                    _PARTITIONS_PER_LOOKUP, _new_state)
        self._owned = self._assigned.owned  # the same dict, never replaced
        self._catch_up = self._assigned.catch_up
        self._touched = self._assigned.touched
        self._lookups = EndLookups(_DUE_LIMIT, _PARTITIONS_PER_LOOKUP, _PROBE_INTERVAL_MS)
        # When the last markers fetch was sent (ms): markers of a partition at its log end then, read
        # later, were written after it (kmq.core.marker_clock).
        self._fetch_sent_ms: int | None = None
        self._skew = SkewGauge(self.metrics.clock_skew_seconds)
        self._clock_watch = ClockWatch()
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._consumer: GroupConsumerAdapter | None = None
        self._http: HealthServer | None = None
        self.http_port: int | None = None
        self._clients = clients
        self._mono = monotonic or time.monotonic  # looked up now: a test may have replaced the module's time
        # End of the last main-loop step: /healthz fails when it is older than tracker.liveness_timeout
        # (starts at setup so a hung join counts too).
        self._last_step_mono = self._mono()
        self._stall_logged = False
        kafka = cfg.kafka
        self._membership = MembershipCheck(kafka.session_timeout, kafka.heartbeat_interval, _MAX_POLL_INTERVAL_S,
                                           pauses or PauseWatch(clock=self._mono), self._mono)

    # ------------------------------------------------------------ lifecycle
    def run(self) -> None:
        """Run until stopped. Installs SIGTERM/SIGINT handlers when on the main thread."""
        restore = self._install_signals()
        try:
            self.open()
            self._started.set()
            delay = 0.0
            while not self._stopping.is_set():
                delay = self.step(delay)
        finally:
            self._started.set()
            self.close()
            for sig, handler in restore.items():
                signal.signal(sig, handler)

    def start(self, timeout: float = 30.0) -> "Tracker":
        """Run in a background thread; return once the HTTP endpoints are bound."""

        def target() -> None:
            try:
                self.run()
            except BaseException as exc:  # surfaced by start()/stop()
                self._error = exc
                log.exception("tracker stopped with an error")

        self._thread = threading.Thread(target=target, name="kmq-tracker", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise KmqError(f"tracker did not start within {timeout}s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Drain, commit and leave the group (also from another thread)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise KmqError(f"tracker did not stop within {timeout}s")
            self._thread = None

    @property
    def partitions(self) -> Mapping[Partition, OwnedPartition]:
        """The markers partitions it holds now, by ``(topic, partition)``: each one's
        :class:`~tracker.partition.OwnedPartition` (its lease state, whether it caught up). A
        read-only view, for probes and tests; the tracker's own loop changes them."""
        return MappingProxyType(self._owned)

    def ready(self) -> tuple[bool, str]:
        """(ready, detail): joined the group and every assigned partition caught up (or held at a
        marker of a newer wire version, which the detail names)."""
        if not self._assigned.joined:
            return False, "not ready: joining the tracker group"
        owned = list(self._owned.values())
        # A held partition does not catch up before a newer tracker reads it: it is named, not waited for.
        behind = [o.tp for o in owned if not o.caught_up and o.held is None]
        if behind:
            return False, (f"not ready: catching up {len(behind)} of {len(self._owned)} partition(s): "
                           f"{partition_names(behind)}")
        held = [o.tp for o in owned if o.held is not None]
        return True, f"ready: {len(self._owned)} partition(s)" + (
            f"; {len(held)} held at a marker of a newer wire version (upgrade the tracker): {partition_names(held)}"
            if held else "")

    def alive(self) -> tuple[bool, str]:
        """(alive, detail): the main loop completed a step within ``tracker.liveness_timeout``."""
        age = self._mono() - self._last_step_mono
        bound = self.cfg.tracker.liveness_timeout
        if age > bound:
            detail = (f"not alive: the main loop has not completed a step for {age:.1f}s "
                      f"(tracker.liveness_timeout {bound:g}s); nothing is redelivered meanwhile")
            if not self._stall_logged:  # once per stall: probes ask every few seconds
                self._stall_logged = True
                log.warning("%s; the liveness probe will restart this tracker", detail)
            return False, detail
        self._stall_logged = False
        return True, f"ok: last step {age:.1f}s ago"

    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        restore = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            restore[sig] = signal.getsignal(sig)
            signal.signal(sig, lambda signum, frame: self._on_signal(signum))
        return restore

    def _on_signal(self, signum: int) -> None:
        log.info("received %s: finishing the current step, committing and leaving the group",
                 signal.Signals(signum).name)
        self._stopping.set()

    def open(self, *, serve_http: bool = True) -> None:
        """Check the topics, build the clients and join the group, without running the loop
        (:meth:`run` calls it). ``serve_http``: start the health and metrics endpoints
        (``tracker.http_port``); an embedded tracker may go without them."""
        kafka = self.cfg.kafka
        clients = self._clients
        for q in self.cfg.queues:
            clients.require_aligned(kafka, q)
        self._last_step_mono = self._mono()
        if serve_http:
            self._http = HealthServer(self.metrics.registry, self.ready, self._http_host, self.cfg.tracker.http_port,
                                      liveness=self.alive)
            self.http_port = self._http.start()
        self.metrics.ready.set_function(lambda: 1.0 if self.ready()[0] else 0.0)
        # Every client is on kafka.client (kmq.client): the markers group, the readers, the producer.
        size, smallest = copy_request_size_for(self.cfg, clients)
        codec = self.cfg.queues[0].compression if self.cfg.queues else "none"
        self._producer = copy_producer(kafka, size, codec, clients)
        self._reader = clients.open_log_reader(kafka)
        # Catch-up targets and read-through marks come from their own reader, so a fetch of a markers
        # partition never sits in front of the queue reads that redeliveries wait on. Its look-ups
        # mostly find nothing new (the position is at the end): the broker answers them at once
        # instead of holding the fetch, since every due message waits for its look-up.
        self._hw_reader = clients.open_log_reader(kafka, fetch_wait_ms=_LOOKUP_FETCH_WAIT_MS)
        self._redeliverer = Redeliverer(self._producer, self._reader, self.metrics, self._now_ms,
                                        send_timeout_s=send_wait_s(kafka),
                                        max_request_size=self.cfg.tracker.max_request_size,
                                        new_producer=lambda compression: copy_producer(kafka, size, compression,
                                                                                       clients),
                                        compression=codec, smallest_limit=smallest)
        membership = {}
        if self.cfg.tracker.instance_id:
            # Static membership: a restart within kafka.session_timeout gets the same
            # partitions back without a group-wide rebalance (close() does not leave).
            membership["group_instance_id"] = self.cfg.tracker.instance_id
        # RANGE: the clients' classic eager assignors; a revoke hands every partition back at once.
        self._consumer = clients.group_consumer(
            kafka, self.cfg.tracker.group_id, "RANGE", _POLL_RECORDS,
            fetch_wait=self.cfg.tracker.markers_fetch_wait_ms() / 1000,
            metadata_max_age=kafka.metadata_max_age, max_poll_interval=_MAX_POLL_INTERVAL_S, **membership,
        )
        self._assigned.subscribe(self._consumer)
        self._timers = StepTimers(_COMMIT_INTERVAL_S, _METRICS_INTERVAL_S)
        self._membership.pauses.start()
        log.info("tracker started: group %s%s, queues %s", self.cfg.tracker.group_id,
                 f" (static member {self.cfg.tracker.instance_id})" if self.cfg.tracker.instance_id else "",
                 ", ".join(q.label for q in self.cfg.queues))

    def close(self) -> None:
        """Commit, leave the group, close the clients and the endpoints (:meth:`run` calls it)."""
        self._membership.pauses.stop()
        try:
            if self._consumer is not None:
                self._assigned.commit(self._consumer, force=True)
                self._consumer.close()  # leaves the group: partitions move at once
        except Exception:  # noqa: BLE001 - shutting down; the last commit is replayed safely
            log.exception("error while leaving the tracker group; the next owner replays from the last commit")
        # The redeliverer owns the producer (it may have replaced the first one).
        for closer in ("_reader", "_hw_reader", "_redeliverer" if hasattr(self, "_redeliverer") else "_producer"):
            obj = getattr(self, closer, None)
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # noqa: BLE001
                    log.debug("closing %s failed", closer, exc_info=True)
        if self._http is not None:
            self._http.stop()
        self._consumer = None
        log.info("tracker stopped")

    # ------------------------------------------------------------ main loop
    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def step(self, wait_s: float = 0.0) -> float:
        """Poll markers for up to ``wait_s``, apply them, redeliver what is due,
        commit; return how long the next poll may wait."""
        assert self._consumer is not None  # open() made it
        sent_ms = self._now_ms()
        records = self._consumer.fetch(wait_s, _POLL_RECORDS)
        read_ms = self._now_ms()
        floor_ms, self._fetch_sent_ms = self._fetch_sent_ms, sent_ms
        # Both checked (each drops the view when it holds): records read before a pause or on the old clock.
        stale = self._membership_in_doubt("before this step") | self._clock_jumped()
        self._membership.polled()
        tally: Tally = Tally()
        just_positioned = self._catch_up.position_new(self._owned, self._consumer)
        for owned, batch, floor in to_apply(records, self._owned, just_positioned, floor_ms, stale):
            self._apply(owned, batch, tally, read_ms, floor)
            self._note_end(owned)
            self._touched(owned)
        for (queue, mtype), n in tally.items():
            self.metrics.markers.labels(queue, mtype).inc(n)
        caught = self._catch_up.update(self._owned, self._consumer, self._hw_reader)
        if caught:
            self._timers.caught_up()
            for owned in caught:  # an idle partition is read at its end from now on
                self._note_end(owned)
        self._lookups.heard(self._catch_up.looked_up_ms)
        if not self._clock_jumped():  # a jump since the fetch: nothing is judged on the old clock's times
            self._redeliver_due()
        due = self._timers.due(self._mono())
        if due.commit:
            self._assigned.commit(self._consumer)
        if due.metrics:
            self._update_metrics()
        self._last_step_mono = self._mono()
        return self._next_delay()

    def _redeliver_due(self) -> None:
        """Hand each caught-up partition's due messages to the redeliverer, least recently served
        first, until the step's budget is spent: a slow partition delays the others by one step at
        most, and is itself served again when its own retry backoff ends. Partitions whose last
        look-up got no answer are looked up again after the others were served (each such look-up
        may wait out the reader's timeout), when their own backoff ends. The order and every
        decision: :func:`~kmq.core.due_round.serve_due`; here, its actions carried out."""
        began = self._mono()
        due = [self._owned[tp] for tp in self._assigned.schedule.pop_due(self._now_ms()) if tp in self._owned]
        steps = serve_due(due, began, _STEP_BUDGET_S, _DUE_LIMIT, self._touched)
        try:
            action = next(steps)
            while True:
                action = steps.send(self._serve(action))
        except StopIteration:
            pass

    def _serve(self, action: Any) -> Any:
        """Do one action of the round over the due partitions and return its answer."""
        if action is STOPPING:
            return self._stopping.is_set()
        if action is MONO:
            return self._mono()
        if action is DUE_CLOCK:
            return self._now_ms()
        kind = type(action)
        if kind is LookUpEnds:
            return self._read_through(action.partitions, action.failing)
        if kind is Redeliver:
            return self._redeliver(action.partition, action.items)
        if kind is Doubted:
            owned = action.partition
            return self._membership_in_doubt(f"while {owned.topic}[{owned.partition}] was redelivered",
                                             owned.queue, action.copies)
        assert action is RETRY_TARGETS, action
        self._catch_up.read_targets(self._owned, self._hw_reader, failing=True)
        return None

    def _read_through(self, due: list[OwnedPartition], failing: bool = False) -> list[OwnedPartition]:
        """Move the read-through time of the ``due`` partitions on: a tracker behind its markers
        (a slow fetch, a burst larger than it reads per step) must not take an END or RENEW it has
        not read yet for a lapsed lease. Whom to ask and what an answer means:
        :class:`~kmq.core.end_lookups.EndLookups`; here, the look-up itself and its log lines.
        Returns the partitions asked."""
        now = self._now_ms()
        lookup = self._lookups.choose(due, now, failing)
        if lookup is None:
            return []
        asked = lookup.asked
        try:
            got = self._hw_reader.log_ends({o.tp: o.state.position for o in asked})
            ends, failed = got.ends, got.failed
        except LogReadError as exc:
            ends, failed = {}, {o.tp: str(exc) for o in asked}
        grace_ms = round(self.cfg.tracker.outage_grace * 1000)
        answer = self._lookups.answered(lookup, ends, now, self._now_ms(), grace_ms, self._owned.values(),
                                        self._touched)
        if answer.broker_back is not None:
            log.warning("the markers topic is readable again after %.1fs; leases that ran out meanwhile are judged "
                        "%.0fs from now, once the ENDs and RENEWs their consumers retry were read",
                        (now - answer.broker_back[0]) / 1000.0, grace_ms / 1000.0)
        if answer.unanswered:
            for o in answer.unanswered:
                self.metrics.lookup_failures.labels(o.queue.label).inc()
            log.warning("the end of %s was not read (%s): leases there are judged once it is; asked again in %.1fs "
                        "(kmq_tracker_lookup_failures_total)", partition_names(o.tp for o in answer.unanswered),
                        next(iter(failed.values()), "no answer"), answer.delay_s)
        for o in answer.back:
            log.warning("the end of %s[%d] is readable again; leases that ran out meanwhile are judged %.0fs from now",
                        o.topic, o.partition, grace_ms / 1000.0)
        return list(asked)

    def _redeliver(self, owned: OwnedPartition, items) -> int:
        """One partition's due items; returns the records produced. Nothing raised here stops the
        service or the other partitions."""
        try:
            return self._redeliverer.process(owned.queue, owned.partition, owned.state, items).copies
        except Exception:  # noqa: BLE001 - a bug or a client surprise on one record must not stop the tracker
            now = self._now_ms()
            at = retry_at_ms(max(i.failures for i in items), now)
            left = owned.state.open_within(r for i in items for r in i.ranges)
            n = sum(r.count for r in left)
            owned.state.retry(left, at)
            self.metrics.record_failures.labels(owned.queue.label, "internal").inc(n)
            log.exception("redelivery of %d message(s) from %s[%d] failed unexpectedly; they stay open and are "
                          "retried in %.1fs", n, owned.queue.name, owned.partition, (at - now) / 1000.0)
            return 0

    def _membership_in_doubt(self, when: str, queue: QueueConfig | None = None, copies: int = 0) -> bool:
        """Drop the view if the group may have moved partitions without the listener being told
        (:mod:`tracker.membership`); ``copies`` made meanwhile are counted as possible duplicates."""
        why = self._membership.doubt()
        if why is None:
            return False
        why += f" {when}"
        if copies and queue is not None:
            self.metrics.stale_copies.labels(queue.label).inc(copies)
            why += f"; {copies} record(s) produced meanwhile may duplicate the new owner's (kmq_tracker_stale_copies_total)"
        self._drop_view(why)
        return True

    def _drop_view(self, why: str) -> None:
        """Forget every partition's state (:meth:`~tracker.assignment.Assignment.drop_view`)."""
        self._assigned.drop_view(why)

    def _clock_jumped(self) -> bool:
        """Whether the tracker's clock jumped since the last look (:class:`~kmq.core.marker_clock.ClockWatch`).
        Then every partition is re-read from its committed offset before a lease is judged: the
        read-through times, deadlines and holds it keeps are on the old clock (set back, they would
        vouch for markers never read; set forward, they would end leases early). Replayed, a lease
        counts from its START's record time plus at most 60 s, at most the read time
        (:func:`~kmq.core.marker_clock.marker_time`)."""
        jump = self._clock_watch.observe(self._now_ms(), int(self._mono() * 1000))
        if not jump:
            return False
        direction = "back" if jump < 0 else "forward"
        self.metrics.clock_jumps.labels(direction).inc()
        self.metrics.clock_jump_seconds.labels(direction).inc(abs(jump) / 1000.0)
        log.warning("the tracker's clock jumped %.1fs %s (against its monotonic clock): the times it keeps are on "
                    "the old clock, so it re-reads %d partition(s) from their committed offsets and judges no lease "
                    "before each one caught up again, as after a restart (kmq_tracker_clock_jumps_total)",
                    abs(jump) / 1000.0, direction, len(self._owned))
        self._assigned.reread_all(doubted=False)
        for owned in self._owned.values():
            owned.clock_moved(jump)
        self._catch_up.clock_moved(jump)
        self._fetch_sent_ms = None  # no floor: the next markers read count as replayed
        self._lookups.clock_moved(jump)
        return True

    def next_due_s(self) -> float | None:
        """Seconds until the step has something to do with no new marker: the earliest due time of
        a caught-up partition (0 when due now, or while a partition still catches up); None: nothing
        is waiting. For a loop that drives :meth:`step` on a clock of its own (:mod:`kmq.testing`)."""
        if self._catch_up.pending:
            return 0.0
        soonest = self._assigned.schedule.next_ms()
        return None if soonest is None else max(0.0, (soonest - self._now_ms()) / 1000.0)

    def _next_delay(self) -> float:
        tick = self.cfg.tracker.tick
        if self._catch_up.pending:
            return tick  # poll returns as soon as markers arrive
        soonest = self._assigned.schedule.next_ms()
        if soonest is None:
            return tick
        return max(0.0, min(tick, (soonest - self._now_ms()) / 1000.0))

    def _note_end(self, owned: OwnedPartition) -> None:
        """Whether ``owned`` is at its log end as of the fetch just made (the client's mark of it):
        then the markers read next were written after that fetch was sent."""
        assert self._consumer is not None  # open() made it
        hw = self._consumer.highwater(*owned.tp)
        pos = owned.state.position
        owned.at_end = hw is not None and pos is not None and pos >= hw

    def _apply(self, owned: OwnedPartition, batch: list[Record], tally: Tally, read_ms: int,
               floor_ms: int | None) -> None:
        """Apply ``batch``, read at ``read_ms``; ``floor_ms``: its markers were written after it
        (None: replayed or read behind). Deadlines are on this tracker's clock
        (:func:`kmq.core.marker_clock.marker_time`); STARTs read at the log end feed the skew gauge.
        What each record does: :func:`~kmq.core.marker_batch.apply_batch`."""
        state, qname, p = owned.state, owned.queue.label, owned.partition
        if owned.held is not None:
            return  # nothing after the marker it is held at (tracker.upgrades)
        if batch and owned.resume_from is not None:
            self._catch_up.check_resume(owned, batch[0].offset)
        applied = apply_batch(state, batch, p, read_ms, floor_ms)
        for offset, why in applied.bad:
            self.metrics.bad_markers.inc()
            if not owned.bad_logged:
                owned.bad_logged = True
                log.warning("skipping an undecodable marker at %s[%d] offset %d: %s (further bad markers on "
                            "this partition are only counted in kmq_tracker_bad_markers_total)",
                            owned.topic, p, offset, MarkerDecodeError(why))
        for version in applied.newer:
            note_newer(owned, version, self.metrics)
        for owner, ts in applied.starts:
            self._skew.observe(qname, owner, read_ms, ts)
        for mtype, n in applied.types.items():
            tally[(qname, mtype)] += n
        if applied.late:
            self.metrics.late_acks.labels(qname).inc(applied.late)
        if applied.held is not None:
            hold(owned, *applied.held, self.metrics)
            publish_held(self._owned.values(), self._assigned.queue_names(), self.metrics)

    def _update_metrics(self) -> None:
        """Publish the per-partition gauges of the partitions whose state changed since the last
        update, and of those with messages in flight (their age and retention use grow with time);
        the others' gauges still hold what they show."""
        assert self._consumer is not None  # open() made it
        now = self._now_ms()
        a = self._assigned
        visit, a.to_publish = a.to_publish | a.published_open, set()
        a.published_open = set()
        for tp in visit:
            owned = self._owned.get(tp)
            if owned is not None and publish_gauges(owned, self.metrics, self._consumer.highwater, now):
                a.published_open.add(tp)
        self._skew.publish(self._mono())



def _new_state(q: QueueConfig) -> PartitionState:
    """A fresh lease state for a partition of ``q``."""
    return PartitionState(q.backoff.delay, q.max_deliveries, max_hold_ms=int(q.max_hold * 1000))

