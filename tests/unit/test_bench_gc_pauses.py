"""kmq.bench.gc_pauses: the full collections a benchmark's process made, and how they are summed up."""

from __future__ import annotations

import gc

from kmq.bench.gc_pauses import FullCollections, merge, said, summary


def test_only_full_collections_between_start_and_stop_are_counted():
    full = FullCollections()
    gc.collect(2)  # before start: not counted
    full.start()
    gc.collect(0)
    gc.collect(1)
    gc.collect(2)
    gc.collect(2)
    figures = full.stop()
    gc.collect(2)  # after stop: not counted, and the hook is gone
    assert figures["count"] == 2 and len(figures["durations_ms"]) == 2
    assert figures["max_ms"] >= figures["p99_ms"] >= 0 and figures["cpu_max_ms"] >= 0
    assert figures["threshold"] == list(gc.get_threshold()) and figures["tuned"] is False
    assert figures["tracked_objects"] > 0
    assert full._hook not in gc.callbacks


def test_p99_is_the_nearest_rank_and_no_collection_is_zero():
    assert summary([]) == {"count": 0, "max_ms": 0.0, "p99_ms": 0.0, "durations_ms": []}
    figures = summary([float(x) for x in range(1, 201)])
    assert figures["count"] == 200 and figures["max_ms"] == 200.0 and figures["p99_ms"] == 198.0
    assert summary([3.0, 1.0])["p99_ms"] == 3.0


def test_rounds_are_merged_and_a_tuned_round_marks_the_variant_tuned():
    one = {**summary([1.0, 4.0]), "cpu_max_ms": 3.5, "tracked_objects": 40_000, "tuned": False, "frozen": 0}
    two = {**summary([2.0]), "cpu_max_ms": 1.5, "tracked_objects": 41_000, "tuned": False, "frozen": 0}
    merged = merge([one, two])
    assert merged == {"count": 3, "max_ms": 4.0, "p99_ms": 4.0, "cpu_max_ms": 3.5, "count_per_round": [2, 1],
                      "tracked_objects": 41_000, "default_collector": True}
    assert said(merged) == ("3 full, max 4.0 ms (3.5 ms of CPU), p99 4.0 ms, 41,000 objects tracked at the "
                            "last message")
    assert merge([one, {**two, "tuned": True}])["default_collector"] is False
    assert merge([one, {**two, "frozen": 12}])["default_collector"] is False
    assert "(collector tuned)" in said(merge([{**one, "tuned": True}]))
    assert said(None) == "no figures"
