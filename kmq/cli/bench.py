"""``kmq bench consumer|tracker|spark|share|all``: benchmarks with side-by-side ratios."""

from __future__ import annotations

import importlib
import importlib.util

import click

# name -> module with a click ``command``; a module not there (yet) hides its benchmark.
BENCHMARKS = {
    "consumer": "kmq.bench.consumer",
    "tracker": "kmq.bench.tracker",
    "spark": "kmq.bench.spark",
    "trace": "kmq.bench.trace",
    "overload": "kmq.bench.overload",
    "badday": "kmq.bench.badday",
    "aio": "kmq.bench.aio",
    "capacity": "kmq.bench.capacity",
    "share": "kmq.bench.share",
    "all": "kmq.bench.all",
}


class _Benchmarks(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n, m in BENCHMARKS.items() if importlib.util.find_spec(m) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = BENCHMARKS.get(name)
        if module is None or importlib.util.find_spec(module) is None:
            return None
        return importlib.import_module(module).command


@click.group(cls=_Benchmarks)
def bench() -> None:
    """Benchmarks: run A/B side by side in one run and report ratios."""
