"""``kmq sim``: search seeded schedules of the simulated cluster for lost messages."""

from __future__ import annotations

import contextlib

import click

from kmq.cli.common import fail
from kmq.dev.sim.search import ORDERED_SHARE, STARTED_SHARE, SeedResult, quiet_actors, search
from kmq.dev.sim.shrink import shrink as shrink_plan
from kmq.dev.sim.workload import SERVICE, STEP, Workload

__all__ = ["sim"]


@click.command()
@click.option("--seeds", type=click.IntRange(1), default=100, show_default=True, help="How many seeds to run.")
@click.option("--start", type=click.IntRange(0), default=0, show_default=True, help="The first seed.")
@click.option("--partitions", type=click.IntRange(1, 64), default=2, show_default=True, help="Queue partitions.")
@click.option("--messages", type=click.IntRange(1, 99_999), default=40, show_default=True,
              help="Messages the producer sends per schedule.")
@click.option("--tracker-loop", type=click.Choice([SERVICE, STEP]), default=SERVICE, show_default=True,
              help="service: the tracker service's whole loop; step: its redelivery step alone.")
@click.option("--shrink/--no-shrink", default=True, show_default=True,
              help="Replay a failing seed with fewer and shorter faults and print the smallest plan that still fails.")
@click.option("--quiet", "-q", is_flag=True, help="Print only failing seeds and the summary.")
def sim(seeds: int, start: int, partitions: int, messages: int, tracker_loop: str, shrink: bool, quiet: bool) -> None:
    """Run one simulated schedule per seed (producer, kmq workers, the tracker, faults drawn from
    the seed) and check that no message is lost and nothing waits too long. Exit 1 on a violation;
    a failing seed prints its fault plan, the history of the messages concerned (the timeline
    ``kmq trace`` shows) and, shrunk, the fewest and shortest faults that still fail."""
    workload = Workload(partitions=partitions, messages=messages, tracker_loop=tracker_loop,
                        ordering_share=ORDERED_SHARE, hand_over_started_share=STARTED_SHARE)
    root = click.get_current_context().find_root()
    def show(r: SeedResult) -> None:
        if not r.ok:
            click.echo(r.describe())
            if shrink:
                click.echo(shrink_plan(r, workload).describe())
        elif not quiet:
            click.echo(r.summary())

    with contextlib.nullcontext() if root.params.get("verbose") else quiet_actors():  # -v shows them
        report = search(range(start, start + seeds), workload, on_result=show)
    failed = report.failures
    click.echo(f"{len(report.results)} seed(s) [{start}..{start + seeds - 1}], {len(failed)} with violations "
               f"({sum(len(r.violations) for r in failed)} in all), {report.rate:.1f} schedules/s")
    if failed:
        raise fail(f"violations in seed(s) {', '.join(str(r.seed) for r in failed[:20])}"
                   f"{' ...' if len(failed) > 20 else ''}: replay one with --start SEED --seeds 1")
