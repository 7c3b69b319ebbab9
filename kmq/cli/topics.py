"""``kmq topics create|describe``."""

from __future__ import annotations

import click

from kmq.cli.common import config_options, fail
from kmq.config import Config
from kmq.topics import TopicLayout, describe as describe_layout, ensure_topics


@click.group()
def topics() -> None:
    """Create and check a queue's topics (queue, markers, DLQ)."""


def _print_layout(layout: TopicLayout) -> None:
    q = layout.queue

    def n(v: int | None) -> str:
        return "missing" if v is None else str(v)

    click.echo(f"queue   {q.name:<40} partitions {n(layout.queue_partitions)}")
    click.echo(f"markers {q.markers_topic:<40} partitions {n(layout.markers_partitions)}")
    click.echo(f"dlq     {q.dlq_topic:<40} partitions {n(layout.dlq_partitions)}")
    click.echo("aligned: yes" if layout.aligned else "aligned: NO")


@topics.command()
@click.argument("queue")
@click.option("--partitions", type=click.IntRange(min=1), help="Partitions of a new queue topic (default 1).")
@click.option("--replication-factor", type=click.IntRange(min=1), default=1, show_default=True)
@config_options
def create(queue: str, partitions: int | None, replication_factor: int, cfg: Config) -> None:
    """Create QUEUE, its markers and DLQ topics (idempotent; grows markers to match)."""
    layout = ensure_topics(cfg.kafka, cfg.queue(queue), partitions, replication_factor)
    _print_layout(layout)
    if not layout.aligned:
        raise fail("; ".join(layout.problems()))


@topics.command()
@click.argument("queue")
@config_options
def describe(queue: str, cfg: Config) -> None:
    """Show the partitions of QUEUE's topics and whether they are aligned."""
    layout = describe_layout(cfg.kafka, cfg.queue(queue))
    _print_layout(layout)
    if not layout.aligned:
        raise fail("; ".join(layout.problems()))
