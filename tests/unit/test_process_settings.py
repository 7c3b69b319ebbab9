"""kmq's own processes tune the cyclic garbage collector; the rule is kept in one place."""

from __future__ import annotations

import gc

import pytest

from kmq.config.process import GEN0_THRESHOLD, tune_collector


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_the_youngest_generation_waits_longer_and_the_older_ones_keep_their_thresholds(thresholds):
    gc.set_threshold(700, 10, 10)
    tune_collector()
    assert gc.get_threshold() == (GEN0_THRESHOLD, 10, 10)


def test_a_higher_threshold_the_application_chose_is_kept(thresholds):
    gc.set_threshold(GEN0_THRESHOLD * 2, 5, 7)
    tune_collector()
    assert gc.get_threshold() == (GEN0_THRESHOLD * 2, 5, 7)


def test_an_impossible_threshold_is_refused_with_its_value(thresholds):
    with pytest.raises(ValueError, match="gen0 must be at least 1, got 0"):
        tune_collector(0)
    assert gc.get_threshold() == thresholds


def test_a_collector_switched_off_by_threshold_stays_off(thresholds):
    gc.set_threshold(0, 10, 10)
    tune_collector()
    assert gc.get_threshold() == (0, 10, 10)


def test_an_application_at_the_default_threshold_is_told_what_to_call(thresholds):
    from kmq.config.process import untuned_collector_hint

    gc.set_threshold(700, 10, 10)
    hint = untuned_collector_hint()
    assert hint is not None and "tune_collector()" in hint and "docs/capacity.md" in hint
    assert gc.get_threshold() == (700, 10, 10)  # only read
    tune_collector()
    assert untuned_collector_hint() is None
    gc.set_threshold(0, 10, 10)
    assert untuned_collector_hint() is None
    gc.set_threshold(700, 10, 10)
    gc.disable()
    try:
        assert untuned_collector_hint() is None
    finally:
        gc.enable()
