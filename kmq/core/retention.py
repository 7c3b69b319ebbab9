"""Where the markers log and the tracker's committed offset disagree: retention losses, pure.

No Kafka. The committed marker offset of a partition is the oldest START that
still has open offsets, so it must still be in the markers log when the
partition is next assigned. Two ways it is not:

* **below the log start**: retention (or DeleteRecords) removed markers the
  tracker had not closed. The consumer's offset reset jumps forward to the log
  start; STARTs in the deleted range are gone and their messages will never be
  redelivered. That is a loss: log the range, count it, alert.
* **beyond the log end**: the markers topic was deleted and created again (or
  truncated). The reset goes back to the log start and the tracker replays
  what is there: no loss from the tracker's side, but worth a warning.

:func:`retention_used` is the early warning: how much of the markers retention
the oldest open START has used up.
"""

from __future__ import annotations

from dataclasses import dataclass

from kmq.core.ranges import OffsetRange

__all__ = ["ResumeGap", "resume_gap", "retention_used", "BELOW_LOG_START", "BEYOND_LOG_END"]

BELOW_LOG_START = "below_log_start"
BEYOND_LOG_END = "beyond_log_end"


@dataclass(frozen=True, slots=True)
class ResumeGap:
    """The committed offset was not where reading resumed."""

    kind: str  # BELOW_LOG_START or BEYOND_LOG_END
    committed: int
    resumed_at: int
    lost: OffsetRange | None  # marker offsets deleted before they were read (BELOW_LOG_START)


def resume_gap(committed: int | None, resumed_at: int) -> ResumeGap | None:
    """Compare the committed marker offset with the first offset actually read after it
    (or the position the consumer's offset reset moved to). None when they agree."""
    if committed is None or resumed_at == committed:
        return None
    if resumed_at > committed:
        return ResumeGap(BELOW_LOG_START, committed, resumed_at, OffsetRange(committed, resumed_at - committed))
    return ResumeGap(BEYOND_LOG_END, committed, resumed_at, None)


def retention_used(oldest_start_ms: int | None, now_ms: int, retention_ms: int) -> float:
    """Age of the oldest open START as a fraction of the markers retention (0 when nothing is open)."""
    if oldest_start_ms is None or retention_ms <= 0:
        return 0.0
    return max(0.0, (now_ms - oldest_start_ms) / retention_ms)
