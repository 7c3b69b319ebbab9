"""``kmq_tracker_clock_skew_seconds``: how far each owner's clock is from the tracker's.

Fed by the service with the STARTs it reads at the log end (read time minus
record timestamp, :class:`~kmq.core.marker_clock.SkewWindow`), published once
per metrics interval as the least value of the interval. An owner (a
consumer's member id) not seen for :data:`FORGET_S` loses its series, so
restarting workers do not grow the metric without bound.
"""

from __future__ import annotations

from prometheus_client import Gauge

from kmq.core.marker_clock import SkewWindow

__all__ = ["SkewGauge", "FORGET_S"]

#: Seconds after which an owner's series is removed when no START of it was read at the log end.
FORGET_S = 600.0


class SkewGauge:
    """The per-owner skew series of one tracker; ``observe`` on the main loop, ``publish`` per interval."""

    def __init__(self, gauge: Gauge) -> None:
        self._gauge = gauge
        self.window = SkewWindow()
        self._seen: dict[tuple[str, str], float] = {}  # (queue, owner) -> last published at (monotonic s)

    def observe(self, queue: str, owner: str, read_ms: int, ts_ms: int) -> None:
        self.window.observe((queue, owner), read_ms, ts_ms)

    def publish(self, mono: float) -> None:
        for key, skew_ms in self.window.take().items():
            self._gauge.labels(*key).set(skew_ms / 1000.0)
            self._seen[key] = mono
        for key in [k for k, at in self._seen.items() if mono - at > FORGET_S]:
            del self._seen[key]
            try:
                self._gauge.remove(*key)
            except KeyError:
                pass
