"""``kmq demo``: the whole product on an embedded local broker, with failures."""

from __future__ import annotations

import contextlib
import signal
import sys

import click

from kmq.cli.common import fail
from kmq.config import parse_duration
from kmq.dev.demo import DemoSettings, LiveView, run_demo, summary_text


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM stops the demo like Ctrl-C: every child is stopped on the way out."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@click.command()
@click.option("--duration", type=click.FloatRange(min=5), default=45, show_default=True,
              help="Seconds of the active phase (producing and working); a bounded drain follows.")
@click.option("--messages", type=click.IntRange(min=1), default=3000, show_default=True)
@click.option("--partitions", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--workers", "worker_processes", type=click.IntRange(min=1), default=2, show_default=True,
              help="Worker processes (kmq work), 8 handler threads each.")
@click.option("--fail-rate", type=click.FloatRange(0, 1), default=0.03, show_default=True, help="Deliveries that raise (nack).")
@click.option("--hang-rate", type=click.FloatRange(0, 1), default=0.01, show_default=True, help="Deliveries never settled (lease expires).")
@click.option("--slow-rate", type=click.FloatRange(0, 1), default=0.01, show_default=True,
              help="Deliveries acked after 1.5 x the lease (late: a copy was redelivered meanwhile).")
@click.option("--poison-rate", type=click.FloatRange(0, 1), default=0.005, show_default=True, help="Messages rejected on every delivery (DLQ).")
@click.option("--lease", default="2s", show_default=True, help="Queue lease for the demo.")
@click.option("--keep-running", is_flag=True, help="Keep producing/working until Ctrl-C.")
@click.option("--bootstrap", help="Use this Kafka instead of an embedded broker (topics are left in place).")
@click.option("--no-redis", is_flag=True, help="Do not start a local redis-server for IdempotencyGuard.")
def demo(duration: float, messages: int, partitions: int, worker_processes: int, fail_rate: float, hang_rate: float,
         slow_rate: float, poison_rate: float, lease: str, keep_running: bool, bootstrap: str | None, no_redis: bool) -> None:
    """Run broker, tracker and flaky workers; show progress; prove 0 lost at the end."""
    parse_duration(lease, "--lease")
    if fail_rate + hang_rate + slow_rate > 1:
        raise click.BadParameter("--fail-rate, --hang-rate and --slow-rate must not add up to more than 1")
    settings = DemoSettings(
        messages=messages, duration=duration, partitions=partitions, worker_processes=worker_processes,
        fail_rate=fail_rate, hang_rate=hang_rate, slow_rate=slow_rate, poison_rate=poison_rate, lease=lease,
        keep_running=keep_running, bootstrap=bootstrap, redis=not no_redis,
    )
    click.echo(f"kmq demo: {messages} messages, {worker_processes} flaky workers (fail {fail_rate:.0%}, "
               f"hang {hang_rate:.0%}, slow {slow_rate:.0%}, poison {poison_rate:.1%}), 1 tracker, lease {lease}", err=True)
    try:
        with _sigterm_as_interrupt():
            result = run_demo(settings, LiveView(sys.stdout, messages))
    except KeyboardInterrupt:
        click.echo("\ninterrupted: every demo process was stopped", err=True)
        sys.exit(130)
    click.echo(summary_text(result))
    if not result.guarantee_holds:
        raise fail("the demo did not settle every message in time (see 'not settled yet' above)")
    if result.unexplained_dead:
        raise fail(f"{len(result.unexplained_dead)} message(s) were dead-lettered without an injected cause "
                   f"(see above): leases ran out for work that was not slow")
