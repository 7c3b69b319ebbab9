"""``kmq topics create|describe``."""

from __future__ import annotations

import click

from kmq.cli.common import config_options, echo_json, fail, group_option, output_option, reaches_kafka_at_once
from kmq.config import Config
from kmq.client.topics import TopicLayout, describe as describe_layout, ensure_topics


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


def _layout_doc(layout: TopicLayout) -> dict:
    q = layout.queue
    return {
        "queue": q.name,
        **({} if q.group is None else {"group": q.group}),
        "topics": [
            {"role": "queue", "name": q.name, "partitions": layout.queue_partitions},
            {"role": "markers", "name": q.markers_topic, "partitions": layout.markers_partitions},
            {"role": "dlq", "name": q.dlq_topic, "partitions": layout.dlq_partitions},
        ],
        "aligned": layout.aligned,
        "problems": layout.problems(),
    }


@topics.command()
@click.argument("queue")
@click.option("--partitions", type=click.IntRange(min=1), help="Partitions of a new queue topic (default 1).")
@click.option("--replication-factor", type=click.IntRange(min=1),
              help="Replication factor of new topics (default: topics.replication_factor, else 3 when the "
                   "cluster has at least 3 brokers, else the broker count).")
@group_option
@config_options
@reaches_kafka_at_once
def create(queue: str, partitions: int | None, replication_factor: int | None, group: str | None,
           cfg: Config) -> None:
    """Create QUEUE, its markers and DLQ topics (idempotent; grows markers to match).

    With --group, the markers and DLQ topics of that consumer group of QUEUE
    (QUEUE__GROUP__markers, QUEUE__GROUP__dlq), beside the other groups'.
    New topics get the ``topics:`` settings of kmq.yaml (min.insync.replicas,
    markers and DLQ retention); existing topics are left as they are.
    """
    layout = ensure_topics(cfg.kafka, cfg.queue(queue, group), partitions, replication_factor, settings=cfg.topics)
    _print_layout(layout)
    if not layout.aligned:
        raise fail("; ".join(layout.problems()))


@topics.command()
@click.argument("queue")
@output_option
@group_option
@config_options
@reaches_kafka_at_once
def describe(queue: str, output: str, group: str | None, cfg: Config) -> None:
    """Show the partitions of QUEUE's topics and whether they are aligned (exit 1 when not)."""
    layout = describe_layout(cfg.kafka, cfg.queue(queue, group))
    if output == "json":
        echo_json(_layout_doc(layout))
    else:
        _print_layout(layout)
    if not layout.aligned:
        raise fail("; ".join(layout.problems()))
