"""``kmq trace QUEUE (ORIGIN | --key K | --partition P --offset O)``: what happened to one message."""

from __future__ import annotations

import click

from kmq.cli.common import ProgressLine, config_options, echo_json, group_option, output_option, reaches_kafka_at_once
from kmq.config import Config, parse_duration
from kmq.core.errors import ConfigError, TraceError
from kmq.core.trace import Trace, clock, describe_event

__all__ = ["trace", "format_trace"]


def format_trace(t: Trace) -> list[str]:
    lines = [f"message {t.origin}" + (f"  key {t.key}" if t.key is not None else "")
             + f"  deliveries {t.deliveries}"]
    for e in t.events:
        where = f"dlq {e.partition}:{e.offset}" if e.kind == "dead-lettered" else f"copy {e.partition}:{e.offset}"
        lines.append(f"  {clock(e.ts_ms)}  {where:<14}  {describe_event(e)}")
    lines.append(f"  final state: {t.state} ({t.state_text})")
    scan = t.scan
    if scan:
        frm = scan.get("markers_from")
        since = f", records since {clock(scan['since_ms'])}" if scan.get("since_ms") else ""
        lines.append(f"  read: markers from offset {frm if frm is not None else 'log start'} "
                     f"({scan.get('markers_from_source')}){since}, {scan.get('records_read', 0)} records")
    return lines


@click.command()
@click.argument("queue")
@click.argument("origin", required=False)
@click.option("--key", help="Trace the messages with this key (newest 20).")
@click.option("--partition", type=click.IntRange(min=0), help="With --offset: the queue record at P:O (any copy).")
@click.option("--offset", type=click.IntRange(min=0), help="With --partition.")
@click.option("--since", "since", help="Read the last DURATION (e.g. 1h, 30m) instead of from the tracker's "
                                       "committed marker offset.")
@output_option
@click.option("--tracker-group", help="Tracker consumer group (default: tracker.group_id).")
@click.option("--workers-group", help="Workers consumer group (default: the queue's workers_group, else "
                                     "consumer.group_id).")
@group_option
@config_options
@reaches_kafka_at_once
def trace(queue: str, origin: str | None, key: str | None, partition: int | None, offset: int | None,
          since: str | None, output: str, tracker_group: str | None, workers_group: str | None, group: str | None,
          cfg: Config) -> None:
    """The attempt timeline of one message of QUEUE: deliveries, START/RENEW/NACK/END/REJECT,
    lease expiries, CLOSED, the dead letter, and its final state.

    ORIGIN is topic/partition/offset of the first delivery (the kmq-origin
    header). Reads from the tracker's committed marker offset, or the last
    --since; a progress line goes to stderr. Nothing is committed.
    """
    from kmq.ops.trace_reader import trace as read_trace

    try:
        since_s = parse_duration(since, "--since") if since is not None else None
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    if since_s is not None and since_s <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--since")
    if (partition is None) != (offset is None):
        raise click.UsageError("--partition and --offset go together")
    line = ProgressLine()

    def progress(topic: str, p: int, done: int, total: int) -> None:
        line.show(f"scanning {topic}[{p}]: {done}/{total} records", final=done >= total)

    try:
        traces = read_trace(cfg, queue, origin=origin, key=key, partition=partition, offset=offset,
                            since_s=since_s, tracker_group=tracker_group, workers_group=workers_group,
                            progress=progress, group=group)
    finally:
        line.close()
    if output == "json":
        echo_json({"queue": queue, "messages": [t.to_dict() for t in traces]})
        return
    if not traces:
        raise TraceError(f"no message with key {key!r} in the scanned range of {queue}; try a longer --since")
    for i, t in enumerate(traces):
        if i:
            click.echo("")
        for text in format_trace(t):
            click.echo(text)
