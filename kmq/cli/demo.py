"""``kmq demo``: the product on an embedded local broker."""

from __future__ import annotations

import click

from kmq.config import Config
from kmq.devbroker import DevBroker
from kmq.topics import ensure_topics


@click.command()
@click.option("--queue", default="orders", show_default=True)
@click.option("--partitions", type=click.IntRange(min=1), default=3, show_default=True)
def demo(queue: str, partitions: int) -> None:
    """Start an embedded broker, create a queue's topics and show them."""
    with DevBroker() as broker:
        click.echo(f"embedded broker at {broker.bootstrap}")
        cfg = Config.from_dict({"kafka": {"bootstrap_servers": broker.bootstrap}})
        layout = ensure_topics(cfg.kafka, cfg.queue(queue), partitions)
        click.echo(f"created {layout.queue.name} ({layout.queue_partitions} partitions), "
                   f"{layout.queue.markers_topic} ({layout.markers_partitions}), {layout.queue.dlq_topic} ({layout.dlq_partitions})")
    click.echo("broker stopped")
