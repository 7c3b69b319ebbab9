"""``kmq dlq list|replay QUEUE``: inspect dead letters and move them back."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import click

from kmq.cli.common import (
    bytes_field, config_options, echo_json, output_option, queue_group_option, reaches_kafka_at_once,
)
from kmq.config import Config


@click.group()
def dlq() -> None:
    """Dead letters of a queue: list them or replay them to the queue."""


def _text(b: bytes | None, width: int = 40) -> str:
    if b is None:
        return "-"
    s = b.decode("utf-8", "replace")
    return s if len(s) <= width else s[: width - 1] + "…"


@dlq.command("list")
@click.argument("queue")
@click.option("--limit", type=click.IntRange(min=1), help="Show at most N dead letters.")
@click.option("--reason", type=click.Choice(["timeout", "nack-limit", "rejected", "undeliverable"]), help="Only this kmq-dlq-reason.")
@output_option
@queue_group_option
@config_options
@reaches_kafka_at_once
def list_(queue: str, limit: int | None, reason: str | None, output: str, queue_group: str | None,
          cfg: Config) -> None:
    """Show QUEUE's dead letters with their headers (of one consumer group's DLQ: --queue-group)."""
    from kmq.ops.dlq import list_dead_letters

    n = 0
    docs = []
    for dl in list_dead_letters(cfg, queue, group=queue_group):
        if reason is not None and dl.reason != reason:
            continue
        when = datetime.fromtimestamp(dl.timestamp / 1000, timezone.utc)
        ts = when.isoformat(timespec="seconds")
        if output == "json":
            docs.append(_dead_letter_doc(dl, when.isoformat(timespec="milliseconds")))
            n += 1
            if limit is not None and n >= limit:
                break
            continue
        click.echo(f"{dl.partition}:{dl.offset}  {ts}  key={_text(dl.key, 24)}  value={_text(dl.value)}")
        for k, v in dl.headers:
            click.echo(f"    {k}: {_text(v, 200)}")
        if dl.reference_note():
            click.echo(f"    {dl.reference_note()}")
        n += 1
        if limit is not None and n >= limit:
            break
    if output == "json":
        echo_json({"queue": queue, "count": n, "dead_letters": docs})
        return
    click.echo(f"{n} dead letter(s)", err=True)


def _dead_letter_doc(dl, ts: str) -> dict:
    """One dead letter for ``-o json``: text where the bytes are UTF-8, base64 otherwise."""
    return {
        "partition": dl.partition, "offset": dl.offset, "timestamp_ms": dl.timestamp, "timestamp": ts,
        "reason": dl.reason, "reference": dl.reference,
        **bytes_field("key", dl.key), **bytes_field("value", dl.value),
        "headers": [{"name": k, **bytes_field("value", v)} for k, v in dl.headers],
    }


@dlq.command()
@click.argument("queue")
@click.option("--limit", type=click.IntRange(min=1), help="Replay at most N messages.")
@click.option("--rate", type=click.FloatRange(min=0.001), help="At most R messages per second.")
@click.option("--reason", type=click.Choice(["timeout", "nack-limit", "rejected", "undeliverable"]), help="Only this kmq-dlq-reason.")
@click.option("--group", help="Replay consumer group that remembers the DLQ position "
                              "(default: <tracker.group_id>-dlq-replay-QUEUE[__QUEUE_GROUP][-REASON]).")
@click.option("--dry-run", is_flag=True, default=False,
              help="Show what would be replayed (and to which partition); produce and commit nothing.")
@queue_group_option
@output_option
@config_options
@reaches_kafka_at_once
def replay(queue: str, limit: int | None, rate: float | None, reason: str | None, group: str | None,
           dry_run: bool, queue_group: str | None, output: str, cfg: Config) -> None:
    """Move QUEUE's dead letters back to the queue with the delivery count reset.

    With --queue-group, that consumer group's dead letters, back to that group only
    (the other groups of QUEUE skip them: kmq-group)."""
    from kmq.ops.dlq import replay as do_replay

    bar = None
    total = {"n": 0}

    def size_hint(n: int) -> None:
        total["n"] = min(n, limit) if limit else n

    try:
        def progress(k: int) -> None:
            nonlocal bar
            if bar is None:
                bar = click.progressbar(length=max(1, total["n"]), label="replaying", file=sys.stderr)
                bar.__enter__()
            bar.update(k)

        result = do_replay(cfg, queue, limit=limit, rate=rate, reason=reason, group=group,
                           progress=progress, size_hint=size_hint, dry_run=dry_run, queue_group=queue_group)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if output == "json":
        echo_json(_replay_doc(queue, result))
        return
    for c in result.planned:  # a dry run's list
        to = f"partition {c.target_partition}" if c.target_partition is not None else "the partitioner's choice"
        click.echo(f"{c.partition}:{c.offset}  reason={c.reason or '-'}  key={_text(c.key, 24)}  -> {to}")
    dry = result.dry_run
    click.echo(("dry run: would replay" if dry else "replayed") + f" {result.replayed} message(s) to {queue}"
               + (f", {'skip' if dry else 'skipped'} {result.skipped} with another reason" if result.skipped else "")
               + (f", {result.already} already copied by an interrupted run" if result.already else "")
               + (f" (from the position kept in group {result.group}); nothing was written" if dry
                  else f" (position kept in group {result.group})"))
    for where in result.unreplayable:
        click.echo(f"not replayable, {'would stay' if dry else 'left'} in the DLQ: {where}", err=True)


def _replay_doc(queue: str, result) -> dict:
    """``kmq dlq replay -o json``: the counts; with ``--dry-run`` also each dead letter it would copy."""
    doc = {"queue": queue, "dry_run": result.dry_run, "group": result.group, "replayed": result.replayed,
           "skipped": result.skipped, "already_copied": result.already,
           "unreplayable": [{"position": where.split(" ", 1)[0], "cause": where.split(" ", 1)[1]}
                            for where in result.unreplayable]}
    if result.dry_run:
        doc["would_replay"] = [{"partition": c.partition, "offset": c.offset, "reason": c.reason,
                                "target_partition": c.target_partition, **bytes_field("key", c.key)}
                               for c in result.planned]
    return doc
