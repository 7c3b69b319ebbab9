"""``kmq bench tracker --idle-partitions N --idle-process CLIENT`` on a real broker: a whole tracker
process and, in the same run, the plain consumer under it."""

from __future__ import annotations

import pytest

from kmq.bench.tracker_idle import process_idle_cost

pytestmark = pytest.mark.integration


def test_the_idle_process_run_measures_the_tracker_and_the_client_floor_under_it(bootstrap, kafka_client):
    figures = process_idle_cost(4, kafka_client, tick_s=0.1, seconds=1.0, bootstrap=bootstrap, ready_timeout_s=60,
                                settle_s=1.5)
    assert figures["partitions"] == 4 and figures["client"] == kafka_client
    assert figures["ready_s"] > 0 and figures["rss_mb"] > 0 and figures["client_floor"]["rss_mb"] > 0
    for start in (figures["start"], figures["client_floor"]["start"]):  # the start, reported apart
        assert start["seconds"] == 1.5 and len(start["pct_of_core_per_window"]) == 1 and start["cpu_s"] >= 0
    assert figures["kmq_over_floor_pct_of_core"] == pytest.approx(
        figures["cpu_pct_of_core"] - figures["client_floor"]["cpu_pct_of_core"], abs=0.011)
