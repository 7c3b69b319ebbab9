"""MarkerSender: the marker producer, kept working through broker outages.

The Kafka edge of :class:`~kmq.consumer.writer.MarkerWriter`: it owns the producer (on
the client ``kafka.client`` names, through :mod:`kmq.client`) and
everything that gets markers to Kafka when Kafka is not answering.

* Every send is watched until the producer answers it. kafka-python promises
  an answer (acknowledged, or failed with a timeout) within the delivery
  timeout; after a broker restart its idempotent producer can instead wait
  forever for a new producer id, answering nothing (seen with 3.0.12 in four
  of five kills with writes in flight). A send unanswered well past the
  delivery timeout means the producer is stuck: a new one takes over
  (:meth:`MarkerSender.check_stall`).
* A send answered with a producer-state error (fenced, unknown producer id,
  out-of-order sequence, invalid epoch) means the broker no longer accepts
  this producer's id: every later send fails the same way (seen with
  confluent-kafka after a broker restart with writes timed out), so a new
  producer takes over too.
* A settlement marker (END/RENEW/NACK/REJECT) that fails goes to a
  :class:`~kmq.consumer.marker_retry.MarkerRetry` and is resent for
  ``consumer.marker_retry_budget``; past it, or at close, it is given up with
  one error line naming the offsets (their messages are redelivered by the
  tracker when their leases end). START failures are the caller's to handle.
* With a :class:`~kmq.telemetry.metrics.ConsumerMetrics`, the messages whose marker was
  resent or given up are counted (``kmq_consumer_markers_retried_total``,
  ``kmq_consumer_markers_given_up_total``, by marker type) and those waiting
  are a gauge read at scrape time (``kmq_consumer_markers_awaiting_retry``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any


from kmq import client as client_api
from kmq.client.parts import KAFKA_CLIENTS, ClientFactory
from kmq.config import Config, QueueConfig
from kmq.core.errors import KmqError, MarkerWriteError
from kmq.consumer.marker_retry import MarkerRetry, Pending, describe
from kmq.core.log_fields import log_fields
from kmq.core.markers import Marker, encode, encode_key

if TYPE_CHECKING:
    from kmq.consumer.ack_waiters import AckWaiters
    from kmq.telemetry.metrics import ConsumerMetrics

__all__ = ["MarkerSender"]

log = logging.getLogger(__name__)


# Both adapters raise kmq's classes (kmq.client.errors), whichever client failed.
_PRODUCER_STATE_ERRORS = client_api.producer_state_errors()  # one list, on the client seam


class MarkerSender:
    """Sends a queue's marker records; retries settlement markers within the budget.

    :param cfg: the kmq configuration (``kafka.*``, ``consumer.marker_retry_budget``).
    :param queue: the queue whose markers topic is written.
    :param retry_interval: least seconds between two resend rounds.
    :param metrics: where to count retried and given-up markers (optional).
    :param clients: builds its producer (:class:`~kmq.client.parts.ClientFactory`).
    """

    def __init__(self, cfg: Config, queue: QueueConfig, retry_interval: float = 1.0,
                 metrics: "ConsumerMetrics | None" = None, waiters: "AckWaiters | None" = None,
                 clients: ClientFactory = KAFKA_CLIENTS) -> None:
        self.cfg = cfg
        self._clients = clients
        #: Acks awaiting their END: told when a settlement marker is acknowledged or given up.
        self._waiters = waiters
        self.queue = queue
        #: Seconds within which the producer answers every send (acknowledged or failed).
        self.delivery_timeout = cfg.kafka.connect_timeout + 1.0
        # Past this, an unanswered send means the producer is stuck, not slow.
        self._stall_after = self.delivery_timeout + max(2.0, cfg.kafka.connect_timeout)
        #: Seconds a failed END/RENEW/NACK/REJECT is retried (``consumer.marker_retry_budget``).
        self.retry_budget = cfg.consumer.marker_retry_budget
        self._retry = MarkerRetry(self.retry_budget, interval=retry_interval)
        self._lock = threading.Lock()  # retry store, outstanding writes, outage state
        self._tokens = itertools.count()
        self._outstanding: dict[int, Pending] = {}  # settlement markers sent, not yet answered
        self._sent_at: dict[int, float] = {}  # every unanswered send, START included: token -> monotonic time
        self._failing_since: float | None = None
        self._final = False  # closing: failures are reported, no longer retried
        self._not_written: list[Pending] = []
        self._stall_warned_at = float("-inf")
        self._refused: str | None = None  # why the broker refuses the current producer's id, if it does
        #: Markers given up (not acknowledged within the budget, or at close).
        self.failed_writes = 0
        #: How often a stuck producer was replaced.
        self.producer_replacements = 0
        self._metrics = metrics
        if metrics is not None:
            # Read at scrape time: the figure moves on the producer's I/O thread and the flusher.
            metrics.markers_awaiting_retry.labels(queue.name).set_function(lambda: self.retrying)
        self._producer = self._new_producer()

    def _count(self, metric: str, pending: list[Pending]) -> None:
        """Add the messages ``pending`` markers cover to a ``ConsumerMetrics`` counter, by marker type."""
        if self._metrics is None or not pending:
            return
        by_type: dict[str, int] = {}
        for _, marker, _ in pending:
            by_type[marker.TYPE.name] = by_type.get(marker.TYPE.name, 0) + marker.offset_count()
        counter = getattr(self._metrics, metric)
        for kind, n in by_type.items():
            counter.labels(self.queue.name, kind).inc(n)

    # ------------------------------------------------------------ sending
    def _new_producer(self) -> Any:
        # A short delivery timeout keeps START failures prompt and definite (a START
        # reported failed is never written later); settlement markers ride through
        # longer outages in the retry store. Reconnect quickly once the broker is back.
        return self._clients.producer(
            self.cfg.kafka, linger=0, delivery_timeout=self.delivery_timeout, retry_backoff=0.1,
            reconnect_backoff_max=1.0, compression=self.queue.compression,
        )

    def send_awaited(self, partition: int, value: bytes) -> Any:
        """Send an encoded marker the caller waits for (a START, a hand-off RENEW); returns its
        future. No retry store: the caller decides what a failure means."""
        return self._produce(partition, value, next(self._tokens))

    def _produce(self, partition: int, value: bytes, token: int) -> Any:
        fut = self._producer.send(self.queue.markers_topic, value=value, key=encode_key(partition), partition=partition)
        with self._lock:
            self._sent_at[token] = time.monotonic()
        fut.add_both(self._answered, token, self._producer)
        return fut

    def _answered(self, token: int, producer: Any, result: Any = None) -> None:
        with self._lock:
            self._sent_at.pop(token, None)
            if isinstance(result, _PRODUCER_STATE_ERRORS) and producer is self._producer:
                self._refused = f"{type(result).__name__}: {result}"

    def send(self, partition: int, marker: Marker, since: float | None = None) -> None:
        """Send a settlement marker (no wait); a failure goes to the retry store
        (``since``: its first failure, for markers sent again)."""
        try:
            value = encode(marker)
        except Exception as exc:  # a bug: this marker can never be written, the rest still can
            log.error("cannot encode %s marker for %s[%d] (%s: %s); the tracker will redeliver its %d message(s) "
                      "when their leases end", marker.TYPE.name, self.queue.name, partition, type(exc).__name__,
                      exc, marker.offset_count())
            with self._lock:
                self.failed_writes += 1
            self._count("markers_given_up", [(partition, marker, 0.0)])
            if self._waiters is not None:
                self._waiters.failed([(partition, marker, 0.0)], f"it cannot be encoded: {exc}")
            return
        token = next(self._tokens)
        with self._lock:
            self._outstanding[token] = (partition, marker, since if since is not None else -1.0)
        try:
            fut = self._produce(partition, value, token)
        except Exception as exc:  # e.g. metadata or buffer space not available in max_block_ms
            self._write_failed(token, exc)
            return
        fut.add_callback(self._written, token)
        fut.add_errback(self._write_failed, token)

    def _written(self, token: int, _metadata: Any = None) -> None:
        with self._lock:
            entry = self._outstanding.pop(token, None)
        if entry is not None and self._waiters is not None:
            self._waiters.written(entry[0], entry[1])
        with self._lock:
            if self._failing_since is None or self._retry or self._final:
                return
            outage, self._failing_since = time.monotonic() - self._failing_since, None
        log.warning("marker writes to %s work again after %.1fs of failures; the markers that failed meanwhile "
                    "were written late (no redelivery for messages whose leases had not ended)",
                    self.queue.markers_topic, outage)

    def _write_failed(self, token: int, exc: BaseException) -> None:
        # Runs on the producer's I/O thread (or the caller's, for a failed send()).
        now = time.monotonic()
        first = False
        with self._lock:
            entry = self._outstanding.pop(token, None)
            if entry is None:
                return
            partition, marker, since = entry
            since = now if since < 0 else since
            if self._final:
                self._not_written.append((partition, marker, since))
                return
            given_up = self._retry.add(partition, marker, since)
            if self._failing_since is None:
                self._failing_since, first = now, True
        if first:
            log.warning(
                "%s marker for %s[%d] (%d messages) was not written: %s: %s; kmq keeps retrying failed markers "
                "for up to %gs (consumer.marker_retry_budget) and logs when writes work again",
                marker.TYPE.name, self.queue.name, partition, marker.offset_count(), type(exc).__name__, exc,
                self.retry_budget,
            )
        if given_up:
            self._give_up(given_up, f"more than {self._retry.max_ranges} offset ranges waited to be written")

    def _give_up(self, pending: list[Pending], why: str) -> None:
        n = sum(m.offset_count() for _, m, _ in pending)
        with self._lock:
            self.failed_writes += len(pending)
        if self._waiters is not None:
            self._waiters.failed(pending, why)
        self._count("markers_given_up", pending)
        log.error("%d marker(s) of %s were not written (%s): %s; the tracker will redeliver these %d message(s) "
                  "when their leases end", len(pending), self.queue.name, why, describe(pending), n,
                  extra=_given_up_fields(self.queue.name, pending))

    def resend_due(self, force: bool = False) -> int:
        """Send failed markers again (at most once per retry interval unless ``force``);
        give up those past the budget. Returns how many were sent."""
        with self._lock:
            resend, given_up = self._retry.take(time.monotonic(), force)
        if given_up:
            self._give_up(given_up, f"Kafka did not acknowledge them within consumer.marker_retry_budget "
                                    f"({self.retry_budget:g}s)")
        self._count("markers_retried", resend)
        for p, marker, since in resend:
            self.send(p, marker, since)
        return len(resend)

    # ------------------------------------------------------------ watching
    def check_stall(self) -> bool:
        """Replace the producer when a send stayed unanswered well past its delivery timeout,
        or when the broker refused its producer id. Returns True if replaced."""
        now = time.monotonic()
        with self._lock:
            oldest = min(self._sent_at.values(), default=None)
            refused = self._refused
        if refused is not None:
            return self.replace(f"the broker refuses its producer id ({refused})", now)
        if oldest is None or now - oldest < self._stall_after:
            return False
        return self.replace(f"a marker write stayed unanswered for {now - oldest:.0f}s "
                            f"(delivery timeout {self.delivery_timeout:g}s)", oldest)

    def replace(self, why: str, failing_since: float | None = None) -> bool:
        """Swap the Kafka producer for a new one (after a broker restart kafka-python's
        idempotent producer was seen to leave every later send pending for ever). The old
        one's pending settlement markers go to the retry store, its pending STARTs fail
        (their batches are polled again). Returns False when no new producer can connect
        yet (the markers keep being retried; call again later)."""
        now = time.monotonic()
        try:
            new = self._new_producer()
        except KmqError as exc:  # still unreachable: keep retrying the markers, try again later
            if now - self._stall_warned_at >= 30:
                self._stall_warned_at = now
                log.warning("the marker producer of %s should be replaced (%s) but a new one cannot connect yet "
                            "(%s); trying again until it can", self.queue.name, why, exc)
            return False
        with self._lock:
            old, self._producer = self._producer, new
            self._refused = None
            stale = list(self._outstanding.values())
            self._outstanding.clear()
            self._sent_at.clear()
            for p, marker, since in stale:
                self._retry.add(p, marker, now if since < 0 else since)
            if stale and self._failing_since is None:
                self._failing_since = failing_since if failing_since is not None else now
        self.producer_replacements += 1
        log.warning("replaced the Kafka producer of %s's markers: %s; %d pending marker(s) will be sent again",
                    self.queue.name, why, len(stale))
        client_api.close_producer(old, timeout=0)
        return True

    @property
    def retrying(self) -> int:
        """Messages whose settlement marker failed and is not written yet: waiting in the
        retry store or being sent again (a resend in flight still counts, so the figure
        does not drop to 0 between attempts while the broker is away)."""
        with self._lock:
            resending = sum(m.offset_count() for _, m, since in self._outstanding.values() if since >= 0)
            return len(self._retry) + resending

    # ------------------------------------------------------------ waiting
    def wait(self, timeout: float) -> list[Pending]:
        """Resend what failed and wait until Kafka acknowledged every settlement marker,
        at most ``timeout`` seconds. Returns what is still not written (kept for retries)."""
        deadline = time.monotonic() + timeout
        while True:
            # A write that fails meanwhile (the broker just came back, say) goes to the retry
            # store: send it again until everything is acknowledged or the time is up.
            self.resend_due(force=True)
            try:
                self._producer.flush(timeout=max(0.0, deadline - time.monotonic()))
            except client_api.produce_errors():
                pass  # reported by the caller with what is missing
            with self._lock:
                missing = list(self._outstanding.values()) + self._retry.pending()
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))  # between resend rounds

    def close(self, timeout: float) -> None:
        """Send what waits for a retry one last time, wait at most ``timeout`` seconds,
        log what Kafka did not acknowledge as one error line, close the producer."""
        try:
            self.check_stall()
            with self._lock:
                self._final = True  # from here on a failed write is reported, not retried
                last = self._retry.drain()
            for p, marker, since in last:
                self.send(p, marker, since)
            try:
                self._producer.flush(timeout=timeout)
            except client_api.produce_errors():
                pass  # reported below
            with self._lock:
                lost = self._not_written + list(self._outstanding.values())
                self.failed_writes += len(lost)
            if self._waiters is not None:
                self._waiters.failed(lost, "the writer closed first")
            self._count("markers_given_up", lost)
            if lost:
                log.error(
                    "closing the marker writer of %s: %d marker(s) not acknowledged by Kafka at %s within %gs: %s; "
                    "the tracker will redeliver these %d message(s) when their leases end",
                    self.queue.name, len(lost), self.cfg.kafka.bootstrap_servers, timeout, describe(lost),
                    sum(m.offset_count() for _, m, _ in lost),
                    extra=_given_up_fields(self.queue.name, lost),
                )
        finally:
            client_api.close_producer(self._producer, timeout=5)

    def describe_missing(self, missing: list[Pending], waited: float) -> MarkerWriteError:
        """The error for markers still not written after ``waited`` seconds."""
        return MarkerWriteError(
            f"{len(missing)} marker(s) of {self.queue.name} not acknowledged by Kafka at "
            f"{self.cfg.kafka.bootstrap_servers} within {waited:g}s: {describe(missing)}; they stay queued "
            f"and are retried for up to {self.retry_budget:g}s (consumer.marker_retry_budget)"
        )


def _given_up_fields(queue: str, pending: list[Pending]) -> dict[str, Any]:
    """Log fields of given-up markers: the first marker's partition and ranges, the marker types."""
    partition, marker, _ = pending[0]
    return log_fields(queue, partition, ranges=marker.ranges, markers=len(pending),
                      marker_types=",".join(sorted({m.TYPE.name for _, m, _ in pending})),
                      messages=sum(m.offset_count() for _, m, _ in pending))
