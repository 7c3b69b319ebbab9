"""Stopping the lag job's streaming query cleanly on SIGTERM or Ctrl-C.

Spark's own shutdown path, a Python process killed by SIGTERM while its JVM
runs the query, prints a thousand lines of Java stack traces
(``RpcEnvStoppedException``, ``SPARK_JOB_CANCELLED``) and exits 143; and
``query.stop()`` in the middle of a micro-batch interrupts the batch inside
the sinks' ``toPandas`` with as many lines again. Instead:

* the driver waits on the query in short slices; a signal only sets a flag;
* the main thread then asks the sinks to refuse the next batch: the batch
  that is running finishes and is written, the next one fails at its first
  line before any work, so it is not committed and is re-run from the
  checkpoint on the next start (the sinks are idempotent by batch id);
* only if no batch boundary comes within ``drain_s`` is the query stopped
  mid-batch (that batch, too, is re-run on the next start);
* the sinks and the session are closed and the process exits 0.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from kmq.core.errors import KmqError

__all__ = ["StopRequest", "BatchRefused", "await_query", "stop_query", "quiet_spark_shutdown"]

log = logging.getLogger(__name__)

#: How often the driver looks at the stop flag while the query runs (seconds).
POLL_S = 0.5
#: How long a stop waits for the running micro-batch to end before cancelling it (seconds).
DRAIN_S = 60.0


class BatchRefused(KmqError):
    """Raised by the sinks for a batch that starts after a stop was requested (it is re-run on the next start)."""


class StopRequest:
    """A stop asked for by a signal (or by code); installs SIGTERM/SIGINT handlers while in use."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self._event = threading.Event()
        self._signals = signals
        self._previous: dict[int, Any] = {}
        self.signal_name: str | None = None

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():  # handlers only install there
            for sig in self._signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signal_name = signal.Signals(signum).name
        self._event.set()

    def set(self) -> None:
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()


def await_query(query: Any, stop: StopRequest, poll_s: float = POLL_S) -> bool:
    """Wait until ``query`` terminates (its exception propagates) or a stop is requested.

    Returns True when a stop was requested, False when the query ended on its own."""
    while not stop.requested:
        if query.awaitTermination(poll_s):
            return False
    log.info("stopping the lag job (%s)", stop.signal_name or "requested")
    return True


def stop_query(spark: Any, query: Any, sinks: Any, drain_s: float = DRAIN_S, poll_s: float = POLL_S) -> None:
    """Stop ``query`` at a micro-batch boundary: the running batch finishes and is written, the next
    one is refused by ``sinks`` (re-run on the next start); after ``drain_s`` the batch is cancelled."""
    quiet_spark_shutdown(spark)
    sinks.refuse_batches()
    deadline = time.monotonic() + drain_s
    try:
        while time.monotonic() < deadline:
            if query.awaitTermination(poll_s):
                return
    except Exception:  # noqa: BLE001 - the refused batch ends the query with an error: that is the stop
        return
    log.warning("no micro-batch boundary within %.0fs: cancelling the running batch (re-run on the next start)",
                drain_s)
    query.stop()


def quiet_spark_shutdown(spark: Any) -> None:
    """Keep the expected shutdown noise out of the log: Spark's cancelled jobs and stopped RPC
    environment (log4j), and py4j's report of the refused batch (Python logging).

    Only called once the job is stopping on purpose: then these are not errors."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    try:
        spark.sparkContext.setLogLevel("OFF")
    except Exception:  # noqa: BLE001 - best effort; the context may be gone already
        pass
