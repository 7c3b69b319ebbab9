"""Retention-loss classification (pure)."""

from __future__ import annotations

from kmq.core.ranges import OffsetRange
from kmq.core.retention import BELOW_LOG_START, BEYOND_LOG_END, resume_gap, retention_used


def test_resume_gap_classifies_a_forward_jump_as_lost_markers_and_a_backward_one_as_a_reset():
    assert resume_gap(None, 5) is None and resume_gap(7, 7) is None
    gap = resume_gap(100, 250)
    assert gap.kind == BELOW_LOG_START and gap.lost == OffsetRange(100, 150)
    back = resume_gap(500, 0)
    assert back.kind == BEYOND_LOG_END and back.lost is None


def test_retention_used_is_the_oldest_open_start_age_over_the_retention():
    assert retention_used(None, 10, 100) == 0.0
    assert retention_used(0, 50, 100) == 0.5 and retention_used(0, 150, 100) == 1.5
