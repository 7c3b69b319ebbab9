"""Retrying a lag-job sink step through a broker outage (no Kafka import).

A micro-batch's Kafka steps (the marker-lag OffsetFetch, the metrics topic
write) failed the whole streaming query on the first error, so a broker that
was away for a minute stopped the lag job for good (or, under an orchestrator,
into a restart loop). :func:`retry_until` runs a step again with a capped
backoff, calling ``reset`` between tries (a client that lived through a broker
restart is replaced, as the consumer does with its marker producer), until it
succeeds or ``budget`` seconds have passed since the first failure; then the
last error is raised. Clock and sleep are passed in, so the schedule is
unit-tested without waiting.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

__all__ = ["retry_until", "OUTAGE_BUDGET_S"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long the lag job rides through a broker outage (docs/spark.md): a sink step is retried this
#: long, and the job's source tasks wait this long for records they know exist, before the job stops.
OUTAGE_BUDGET_S = 300.0


def retry_until(what: str, step: Callable[[], T], retriable: tuple[type[BaseException], ...], budget: float,
                reset: Callable[[], None] = lambda: None, first_delay: float = 0.5, max_delay: float = 10.0,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> T:
    """``step()``, retried on ``retriable`` errors for up to ``budget`` seconds (``budget`` 0: once).

    Logs the first failure and every tenth retry (not each one: an outage is one event)."""
    started: float | None = None
    delay = first_delay
    tries = 0
    while True:
        try:
            result = step()
        except retriable as exc:
            now = clock()
            if started is None:
                started = now
            tries += 1
            if now - started >= budget:
                raise
            if tries == 1 or tries % 10 == 0:
                log.warning("%s failed (%s: %s); retrying for up to %.0f s more (try %d)", what,
                            type(exc).__name__, exc, budget - (now - started), tries)
            reset()
            sleep(min(delay, max(0.0, budget - (now - started))))
            delay = min(max_delay, delay * 2)
            continue
        if tries:
            assert started is not None  # set at the first failure
            log.warning("%s succeeded after %d failed tries (%.1f s)", what, tries, clock() - started)
        return result
