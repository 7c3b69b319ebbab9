"""Shrinking a failing schedule: the fewest faults, each as short as it can be, that still fail.

A failing seed's fault plan holds faults that have nothing to do with the
failure. :func:`shrink` replays the seed (same workload, same handler fates,
same planted reader) with parts of the plan, by delta debugging over the
fault list (Zeller's ddmin: drop halves, then quarters, ... of the faults,
keeping any smaller plan that still fails), then halves the window of each
fault that lasts while the run still fails. "Still fails" means the
original's first broken invariant (the gravest: ``lost`` comes first) is
broken again, for whichever message.

::

    r = run_seed(seed, workload)
    if not r.ok:
        print(shrink(r, workload).describe())
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

from kmq.dev.sim.cluster import SimCluster
from kmq.dev.sim.faults import Fault, FaultPlan
from kmq.dev.sim.search import SEARCH_WORKLOAD, SeedResult, run_seed
from kmq.dev.sim.workload import Workload

__all__ = ["Shrunk", "shrink", "ddmin"]

#: Replays one shrink may run (each is one schedule: a tenth of a second to a second).
MAX_RUNS = 120
#: Times a fault's window is halved at most.
HALVINGS = 4
#: Shortest window tried (seconds).
MIN_SPAN_S = 0.05


@dataclass
class Shrunk:
    """The smallest failing plan found, the run that shows it, and what it took."""

    result: SeedResult
    invariant: str  # the one kept broken
    original: int  # faults in the seed's plan
    runs: int
    seconds: float

    def describe(self) -> str:
        head = (f"shrunk: {len(self.result.faults)} of {self.original} fault(s) still break {self.invariant} "
                f"({self.runs} replays, {self.seconds:.1f}s); replay with the plan below:")
        return head + "\n" + self.result.describe()


def ddmin(items: list, fails: Callable[[list], bool]) -> list:
    """A 1-minimal sublist of ``items`` for which ``fails`` holds (``fails(items)`` is assumed): no
    single item can be removed from the answer with ``fails`` still true, if the budget of ``fails``
    allows; ``fails`` is called on sublists in order, never on ``items`` itself."""
    n = 2
    while len(items) >= 2:
        size = len(items) // n
        chunks = [items[i:i + size] for i in range(0, len(items), size)] if size else [[x] for x in items]
        reduced = False
        for i, chunk in enumerate(chunks):
            complement = [x for j, c in enumerate(chunks) if j != i for x in c]
            if fails(chunk):
                items, n, reduced = chunk, 2, True
                break
            if len(chunks) > 2 and fails(complement):
                items, n, reduced = complement, max(n - 1, 2), True
                break
        if not reduced:
            if n >= len(items):
                break
            n = min(len(items), n * 2)
    if len(items) == 1 and fails([]):
        return []
    return items


def _shorter(f: Fault) -> Fault | None:
    until = getattr(f, "until", None)
    if until is None or until - f.at <= MIN_SPAN_S:
        return None
    return dataclasses.replace(f, until=round(f.at + max(MIN_SPAN_S, (until - f.at) / 2), 3))


def shrink(failed: SeedResult, workload: Workload = SEARCH_WORKLOAD, *,
           reader: Callable[[SimCluster], Any] | None = None, max_runs: int = MAX_RUNS) -> Shrunk:
    """Shrink ``failed``'s plan (see the module docstring); ``reader`` as the failing run had it."""
    began = time.perf_counter()
    wanted = failed.violations[0].invariant
    best = failed
    runs = 0

    def fails(faults: list) -> bool:
        nonlocal best, runs
        if runs >= max_runs:
            return False
        runs += 1
        r = run_seed(failed.seed, workload, reader=reader, faults=FaultPlan(faults))
        if any(v.invariant == wanted for v in r.violations):
            if (len(faults), _total_span(faults)) < (len(best.faults), _total_span(best.faults.faults)):
                best = r
            return True
        return False

    faults = ddmin(list(failed.faults.faults), fails)
    for i in range(len(faults)):
        for _ in range(HALVINGS):
            shorter = _shorter(faults[i])
            if shorter is None or not fails(faults[:i] + [shorter] + faults[i + 1:]):
                break
            faults[i] = shorter
    return Shrunk(best, wanted, len(failed.faults), runs, time.perf_counter() - began)


def _total_span(faults) -> float:
    return sum(getattr(f, "until", f.at) - f.at for f in faults)
