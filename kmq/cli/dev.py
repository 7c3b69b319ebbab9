"""``kmq dev broker``: the embedded local broker."""

from __future__ import annotations

import signal
import threading

import click

from kmq.dev.broker import DevBroker


@click.group()
def dev() -> None:
    """Development helpers."""


@dev.command()
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="Port on 127.0.0.1 (default: a free one).")
@click.option("--storage", type=click.Choice(["memory", "s3"]), default="memory", show_default=True,
              help="memory: lost on exit; s3: kept in a local moto S3 server across broker restarts.")
def broker(port: int, storage: str) -> None:
    """Run an embedded Kafka-protocol broker (tansu) on loopback until Ctrl-C or SIGTERM."""
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with DevBroker(port=port or None, storage=storage) as b:
        click.echo(f"kmq dev broker ready: bootstrap {b.bootstrap} (storage {storage}, pid {b.pid})", err=False)
        click.echo(f"  export KMQ_KAFKA__BOOTSTRAP_SERVERS={b.bootstrap}")
        click.echo("  Ctrl-C stops it.")
        while not stop.wait(0.5):
            if b.pid is None or not b.pids:
                raise click.ClickException("the embedded broker exited unexpectedly")
    click.echo("broker stopped")
