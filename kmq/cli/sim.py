"""``kmq sim``: search seeded schedules of the simulated cluster for lost messages."""

from __future__ import annotations

import contextlib

import click

from kmq.cli.common import fail
from kmq.dev.mutants import MutantError, MutantResult, markdown, repo_root, run_all, select
from kmq.dev.sim.search import READ_COMMITTED_SHARE, ORDERED_SHARE, STARTED_SHARE, SeedResult, quiet_actors, search
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
@click.option("--slow-markers", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True,
              help="Of the seeds that stall one partition's reads, the share where it is a markers partition's "
                   "(the tracker's look-ups of its end get no answer).")
@click.option("--shrink/--no-shrink", default=True, show_default=True,
              help="Replay a failing seed with fewer and shorter faults and print the smallest plan that still fails.")
@click.option("--quiet", "-q", is_flag=True, help="Print only failing seeds and the summary.")
@click.option("--fail-fast", is_flag=True, help="Stop at the first seed with a violation.")
@click.option("--mutants", is_flag=True,
              help="Mutation testing: for each mutant of kmq/dev/mutants.py, run the search (--seeds, up to the first "
                   "failing seed) and its unit tests on a copy of the source tree; print a markdown table.")
@click.option("--mutant", "only", multiple=True, metavar="NAME", help="With --mutants: only this one (repeatable).")
@click.option("--mutant-tests/--no-mutant-tests", default=True, show_default=True,
              help="With --mutants: run each mutant's unit tests too.")
@click.option("--mutant-timeout", type=click.FloatRange(1), default=300.0, show_default=True,
              help="With --mutants: seconds for each run (the search, the unit tests).")
def sim(seeds: int, start: int, partitions: int, messages: int, tracker_loop: str, slow_markers: float,
        shrink: bool, quiet: bool,
        fail_fast: bool, mutants: bool, only: tuple[str, ...], mutant_tests: bool, mutant_timeout: float) -> None:
    """Run one simulated schedule per seed (producer, kmq workers, the tracker, faults drawn from
    the seed) and check that no message is lost and nothing waits too long. Exit 1 on a violation;
    a failing seed prints its fault plan, the history of the messages concerned (the timeline
    ``kmq trace`` shows) and, shrunk, the fewest and shortest faults that still fail.

    With ``--mutants``: how strong that check is. Each mutant (a small named defect of product
    code) is applied to a copy of the source tree, the search and the unit tests of the touched
    code run there, one mutant at a time, and a markdown table says what caught each."""
    if mutants or only:
        _mutants(seeds, start, ["--partitions", str(partitions), "--messages", str(messages), "--tracker-loop",
                                tracker_loop, "--slow-markers", str(slow_markers)], only, mutant_tests, mutant_timeout)
        return
    workload = Workload(partitions=partitions, messages=messages, tracker_loop=tracker_loop,
                        slow_markers_share=slow_markers, ordering_share=ORDERED_SHARE,
                        hand_over_started_share=STARTED_SHARE, read_committed_share=READ_COMMITTED_SHARE)
    root = click.get_current_context().find_root()
    def show(r: SeedResult) -> None:
        if not r.ok:
            click.echo(r.describe())
            if shrink:
                click.echo(shrink_plan(r, workload).describe())
        elif not quiet:
            click.echo(r.summary())

    with contextlib.nullcontext() if root.params.get("verbose") else quiet_actors():  # -v shows them
        report = search(range(start, start + seeds), workload, on_result=show, stop_at_first=fail_fast)
    failed = report.failures
    last = start + len(report.results) - 1
    click.echo(f"{len(report.results)} seed(s) [{start}..{last}], {len(failed)} with violations "
               f"({sum(len(r.violations) for r in failed)} in all), {report.rate:.1f} schedules/s")
    if failed:
        raise fail(f"violations in seed(s) {', '.join(str(r.seed) for r in failed[:20])}"
                   f"{' ...' if len(failed) > 20 else ''}: replay one with --start SEED --seeds 1")


def _mutants(seeds: int, start: int, sim_args: list[str], only: tuple[str, ...], tests: bool, timeout: float) -> None:
    try:
        chosen = select(only)
        root = repo_root()
    except MutantError as exc:
        raise fail(str(exc)) from None

    def progress(r: MutantResult) -> None:
        where = f"{', '.join(r.invariants)} (seed {r.seed})" if r.sim == "caught" else r.sim
        click.echo(f"{r.mutant.name}: sim {where}; unit tests {r.tests or 'not run'}; {r.seconds:.0f}s", err=True)

    try:
        results = run_all(chosen, root, seeds, start=start, sim_args=sim_args, tests=tests, timeout=timeout,
                          on_result=progress)
    except MutantError as exc:
        raise fail(str(exc)) from None
    click.echo(markdown(results, seeds))
