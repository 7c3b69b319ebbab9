"""The simulator's per-key ordering check: with ``consumer.ordering: key`` the simulated workers hand
messages over through the consumer's real ``KeyedReadyQueue``, and the search must notice when the
key order (``kmq.core.key_order.KeyOrder``) is broken on purpose."""

from __future__ import annotations


import pytest

from kmq.core.key_order import KeyOrder
from kmq.dev.sim import SimCluster
from kmq.dev.sim.search import SEARCH_WORKLOAD, quiet_actors, run_seed, search
from kmq.dev.sim.world import World

# Seeds within which each planted defect is found (the first at seed 7 for both).
BUDGET = range(0, 40)


@pytest.fixture(autouse=True)
def _quiet_tracker():
    with quiet_actors():
        yield


def test_about_a_third_of_the_seeds_run_with_ordering_key_and_find_nothing_wrong():
    ordered = [seed for seed in range(40) if World(SimCluster(seed), SEARCH_WORKLOAD, seed).ordered]
    assert 5 <= len(ordered) <= 20
    for seed in ordered[:3]:
        r = run_seed(seed, SEARCH_WORKLOAD)
        assert r.ok, r.describe()


def test_a_failed_message_that_releases_its_key_at_once_is_caught(monkeypatch):
    real = KeyOrder.settled
    # The planted defect: every settlement counts as final, so a nacked message's later messages go
    # ahead of its copy.
    monkeypatch.setattr(KeyOrder, "settled", lambda self, p, off, final, deadline=0.0: real(self, p, off, True, deadline))
    report = search(BUDGET, SEARCH_WORKLOAD, stop_at_first=True)
    assert report.failures, f"the broken key order went unnoticed over seeds {BUDGET}"
    failed = report.failures[0]
    v = next(v for v in failed.violations if v.invariant == "key-order")
    assert "(origin @" in v.detail and f"history of {v.message}:" in failed.describe()


def test_a_key_order_that_ignores_keys_is_caught(monkeypatch):
    real = KeyOrder.add
    monkeypatch.setattr(KeyOrder, "add", lambda self, item, p, off, key, origin=None: real(self, item, p, off, None, origin))
    report = search(BUDGET, SEARCH_WORKLOAD, stop_at_first=True)
    assert report.failures and any(v.invariant == "key-order" for v in report.failures[0].violations)
