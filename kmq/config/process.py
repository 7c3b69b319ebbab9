"""Settings of a kmq process as a whole: the cyclic garbage collector's threshold.

kmq's per-message path makes a few short-lived objects per message (the
message, its record, a START's offsets) and keeps thousands alive while they
are outstanding. With CPython's default first-generation threshold (700) the
collector then runs its full passes over everything alive again and again:
measured on ``kmq bench consumer --client confluent`` it took about a third of
the consumer's CPU (2.4-2.7 s instead of 3.6-3.9 s per 500,000 messages), and
about a third of the tracker's time redelivering a backlog. These objects are
freed by reference counting; the collector only finds reference cycles, so
letting it wait for 50,000 new objects costs a few megabytes at most.

kmq's own processes (``kmq work``, ``kmq tracker run``) call
:func:`tune_collector` at start. A library never changes a process-wide
setting behind its application's back, so an application that embeds
:class:`~kmq.KmqConsumer` decides for itself (calling it, or
``gc.set_threshold`` directly).
"""

from __future__ import annotations

import gc
import logging

__all__ = ["GEN0_THRESHOLD", "CPYTHON_GEN0_DEFAULT", "tune_collector", "untuned_collector_hint"]

log = logging.getLogger(__name__)

#: New objects the collector waits for before its youngest generation (CPython's default: 700).
GEN0_THRESHOLD = 50_000
#: CPython's own youngest-generation threshold: a process still at it (or below) was not tuned.
CPYTHON_GEN0_DEFAULT = 700


def tune_collector(gen0: int = GEN0_THRESHOLD) -> None:
    """Let the cyclic garbage collector's youngest generation wait for ``gen0`` new objects
    (the older generations keep their thresholds). A ``gen0`` at or below the current threshold
    is ignored: an application that set a higher one keeps it, and one that set 0 (no automatic
    collection) keeps that."""
    if gen0 < 1:
        raise ValueError(f"gen0 must be at least 1, got {gen0}")
    current = gc.get_threshold()
    if current[0] == 0 or gen0 <= current[0]:
        return
    gc.set_threshold(gen0, *current[1:])
    log.debug("garbage collector: first-generation threshold %d (was %d)", gen0, current[0])


def untuned_collector_hint() -> str | None:
    """What to tell an application whose collector still runs at CPython's default youngest-generation
    threshold (700) while it consumes; None once it is raised (or automatic collection is off).
    Read-only: the setting stays the application's."""
    gen0 = gc.get_threshold()[0]
    if not gc.isenabled() or gen0 == 0 or gen0 > CPYTHON_GEN0_DEFAULT:
        return None
    return (f"Python's garbage collector runs at its default threshold ({gen0}): with messages in flight it "
            f"takes a sixth to a third of a consumer's CPU. kmq.config.process.tune_collector() at start "
            f"(what kmq work does) avoids most of that; see docs/capacity.md")
