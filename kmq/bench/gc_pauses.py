"""How long the full garbage collections of a benchmark's process took.

A full (generation-2) collection visits every object the collector tracks and stops every
thread of the process meanwhile, so its length grows with what a consumer keeps alive. The
benchmarks time each one with a ``gc.callbacks`` hook in the process of each variant (kmq's
and the plain loop's, for comparison), with the collector as the process found it: the
figures are only the library's when nothing tuned it (``threshold`` and ``frozen`` say).
"""

from __future__ import annotations

import gc
import math
import time
from typing import Any

__all__ = ["FullCollections", "summary", "merge", "said"]


class FullCollections:
    """Times every generation-2 collection between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self.cpu_ms: list[float] = []
        self._began: float | None = None
        self._cpu_began = 0.0
        self._on = False

    def start(self) -> None:
        if not self._on:
            self._on = True
            gc.callbacks.append(self._hook)

    def _hook(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._began, self._cpu_began = time.perf_counter(), time.thread_time()
        elif self._began is not None:
            self.ms.append((time.perf_counter() - self._began) * 1000)
            self.cpu_ms.append((time.thread_time() - self._cpu_began) * 1000)
            self._began = None

    def stop(self, tuned: bool = False) -> dict[str, Any]:
        """Stop timing; the figures of :func:`summary`, the collector's settings (``tuned``: the
        process tuned it, as ``kmq work`` does) and the objects it tracks now."""
        if self._on:
            self._on = False
            gc.callbacks.remove(self._hook)
        return {**summary(self.ms), "cpu_max_ms": round(max(self.cpu_ms, default=0.0), 2),
                "threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count(), "tuned": tuned,
                "tracked_objects": len(gc.get_objects())}


def summary(ms: list[float]) -> dict[str, Any]:
    """``count``, ``max_ms`` and ``p99_ms`` (nearest rank; 0 with no collection) of durations in ms."""
    ordered = sorted(ms)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else 0.0
    return {"count": len(ordered), "max_ms": round(ordered[-1], 2) if ordered else 0.0, "p99_ms": round(p99, 2),
            "durations_ms": [round(x, 2) for x in ms]}


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of several runs (rounds) of one variant as one: every collection of them."""
    figures = summary([x for run in runs for x in run.get("durations_ms", ())])
    figures["cpu_max_ms"] = max((run.get("cpu_max_ms", 0.0) for run in runs), default=0.0)
    figures["count_per_round"] = [run.get("count", 0) for run in runs]
    tracked = [run["tracked_objects"] for run in runs if isinstance(run.get("tracked_objects"), int)]
    if tracked:
        figures["tracked_objects"] = max(tracked)
    figures["default_collector"] = not any(run.get("tuned") or run.get("frozen") for run in runs)
    del figures["durations_ms"]
    return figures


def said(figures: dict[str, Any] | None) -> str:
    """``"12 full, max 3.1 ms, p99 3.0 ms"`` (``"no figures"`` when absent)."""
    if not isinstance(figures, dict):
        return "no figures"
    tuned = "" if figures.get("default_collector", not figures.get("tuned")) else " (collector tuned)"
    tracked = (f", {figures['tracked_objects']:,} objects tracked at the last message"
               if isinstance(figures.get("tracked_objects"), int) else "")
    cpu = f" ({figures['cpu_max_ms']:.1f} ms of CPU)" if "cpu_max_ms" in figures else ""
    return f"{figures['count']} full, max {figures['max_ms']:.1f} ms{cpu}, p99 {figures['p99_ms']:.1f} ms{tuned}{tracked}"
