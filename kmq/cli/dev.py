"""``kmq dev broker``: the embedded local broker; ``kmq dev kafka``: Apache Kafka from Maven Central."""

from __future__ import annotations

import signal
import threading

import click

from kmq.core.errors import DevBrokerError
from kmq.dev.broker import DevBroker
from kmq.dev.kafka import KAFKA_VERSION, KafkaCluster


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


@dev.command()
@click.option("--brokers", type=click.IntRange(1, 9), default=1, show_default=True,
              help="Brokers (one JVM in combined mode for 1; a dedicated controller beside more).")
@click.option("--version", "version", default=None, help=f"Apache Kafka version (default {KAFKA_VERSION}, or KMQ_KAFKA_VERSION).")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where logs and data go (default: a new temporary directory); reused data survives a restart.")
@click.option("--heap", default="512m", show_default=True, help="Each broker's JVM heap (-Xmx).")
def kafka(brokers: int, version: str | None, workdir: str | None, heap: str) -> None:
    """Run Apache Kafka (KRaft) on loopback until Ctrl-C or SIGTERM.

    The broker's jars are resolved once from Maven Central with Maven into ~/.cache/kmq/kafka
    (KMQ_KAFKA_CACHE); later runs need no network. Needs Java 17+ (and Maven for the first run)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster = KafkaCluster(brokers=brokers, version=version, workdir=workdir, heap=heap)
    try:
        cluster.start()
    except DevBrokerError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        click.echo(f"kmq dev kafka ready: Apache Kafka {cluster.version}, bootstrap {cluster.bootstrap} "
                   f"(pids {' '.join(map(str, cluster.pids))}, logs in {cluster.workdir})")
        click.echo(f"  export KMQ_KAFKA__BOOTSTRAP_SERVERS={cluster.bootstrap}")
        click.echo("  Ctrl-C stops it.")
        while not stop.wait(0.5):
            if len(cluster.pids) < len(cluster.nodes):
                raise click.ClickException(f"a Kafka node exited unexpectedly; see the logs in {cluster.workdir}")
    finally:
        cluster.stop()
    click.echo("kafka stopped")
