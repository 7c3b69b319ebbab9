"""``kmq bench all``'s option sets name only parameters the benchmarks take.

``all.run`` passes a bench only the options its ``run`` accepts (so ``bootstrap``
can be offered to all); a misspelt or stale key in QUICK or FULL was dropped
without a word, and ``--quick`` ran the tracker benchmark at full size.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from kmq.bench import all as bench_all


@pytest.mark.parametrize("sizes", ["QUICK", "FULL"])
@pytest.mark.parametrize("name", bench_all.ORDER)
def test_every_option_is_a_parameter_of_the_bench(sizes, name):
    options = getattr(bench_all, sizes).get(name, {})
    params = inspect.signature(importlib.import_module(f"kmq.bench.{name}").run).parameters
    assert set(options) <= set(params), f"{sizes}[{name!r}] names options kmq.bench.{name}.run does not take"


def test_quick_makes_every_bench_smaller():
    assert set(bench_all.QUICK) == set(bench_all.ORDER)


def test_a_client_that_is_not_installed_is_reported_skipped_and_the_others_still_run(monkeypatch):
    import importlib.util

    from kmq.bench.per_client import per_client

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "confluent_kafka" else real(name, *a))
    ran: list[str] = []
    out = per_client(("confluent", "kafka-python"), lambda c: ran.append(c) or {"client": c})
    assert ran == ["kafka-python"] and out["kafka-python"] == {"client": "kafka-python"}
    assert "with its confluent extra" in out["confluent"]["skipped"]
