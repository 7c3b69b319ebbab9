"""When the tracker's step commits its positions and publishes its gauges, decided without I/O.

The service asks :meth:`StepTimers.due` at the end of each step with the monotonic time and
carries out what it answers:

* the commit of the markers positions, every ``commit_s``;
* the gauges (leases open, lag, ...), every ``metrics_s``, and at once after a partition caught
  up (:meth:`StepTimers.caught_up`): the replayed state is shown without waiting for the interval.

Both are due at the first step.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Due", "StepTimers"]


@dataclass(frozen=True, slots=True)
class Due:
    """What a step carries out now."""

    commit: bool
    metrics: bool


class StepTimers:
    """The commit's and the gauges' next times (monotonic seconds)."""

    def __init__(self, commit_s: float, metrics_s: float) -> None:
        self.commit_s = commit_s
        self.metrics_s = metrics_s
        self._next_commit = self._next_metrics = float("-inf")  # both due at the first step

    def caught_up(self) -> None:
        """A partition caught up in this step: its replayed state is published at once."""
        self._next_metrics = float("-inf")

    def due(self, mono: float) -> Due:
        """What is due at ``mono``; each one due is next due an interval later."""
        commit, metrics = mono >= self._next_commit, mono >= self._next_metrics
        if commit:
            self._next_commit = mono + self.commit_s
        if metrics:
            self._next_metrics = mono + self.metrics_s
        return Due(commit, metrics)
