"""``kmq status QUEUE``: one screen per partition, read from Kafka directly."""

from __future__ import annotations

import click

from kmq.cli.common import config_options, echo_json, group_option, output_option, reaches_kafka_at_once
from kmq.config import Config
from kmq.ops.status import age_text


def _n(v: int | None) -> str:
    return "-" if v is None else str(v)


@click.command()
@click.argument("queue")
@click.option("--tracker-url", help="Also show this tracker's metrics (e.g. http://tracker:9108).")
@click.option("--workers-group", help="Workers consumer group (default: the queue's workers_group, else "
                                     "consumer.group_id).")
@click.option("--tracker-group", help="Tracker consumer group (default: tracker.group_id).")
@output_option
@group_option
@config_options
@reaches_kafka_at_once
def status(queue: str, tracker_url: str | None, workers_group: str | None, tracker_group: str | None,
           output: str, group: str | None, cfg: Config) -> None:
    """In-flight, oldest in-flight age, queue lag, marker lag and DLQ size per partition of QUEUE.

    Works while the tracker is down: it replays the markers from the tracker's
    committed offset, as a new tracker would.
    """
    from kmq.ops.status import collect, tracker_metrics

    q = cfg.queue(queue, group)
    rows = collect(cfg, queue, workers_group, tracker_group, group=group)
    workers_group = workers_group or cfg.workers_group(q)
    if output == "json":
        doc = _status_doc(queue, workers_group, tracker_group or cfg.tracker.group_id, rows,
                          tracker_metrics(tracker_url, q.label) if tracker_url else None)
        echo_json(doc if q.group is None else {"queue": queue, "group": q.group, **doc})
        return
    click.echo(f"queue {queue}{'' if q.group is None else f'  group {q.group}'}  workers group {workers_group}  "
               f"tracker group {tracker_group or cfg.tracker.group_id}")
    _status_table(rows)
    _status_notes(q, queue, rows)
    if tracker_url:
        click.echo(f"tracker {tracker_url}:")
        for line in tracker_metrics(tracker_url, q.label):
            click.echo(f"  {line}")


def _status_table(rows) -> None:
    """The table of ``kmq status``: a line per partition and the totals."""
    header = f"{'partition':>9}  {'in-flight':>9}  {'oldest':>8}  {'queue-lag':>9}  {'marker-lag':>10}  {'dlq':>6}"
    click.echo(header)
    for r in rows:
        click.echo(f"{r.partition:>9}  {r.in_flight:>9}  {age_text(r.oldest_age_s):>8}  {_n(r.queue_lag):>9}  "
                   f"{_n(r.marker_lag):>10}  {_n(r.dlq_size):>6}")
    click.echo(f"{'total':>9}  {sum(r.in_flight for r in rows):>9}  {age_text(max((r.oldest_age_s for r in rows), default=0)):>8}  "
               f"{sum(r.queue_lag or 0 for r in rows):>9}  {sum(r.marker_lag or 0 for r in rows):>10}  "
               f"{sum(r.dlq_size or 0 for r in rows):>6}")


def _status_notes(q, queue: str, rows) -> None:
    """What the table does not show: scheduled messages, skipped or lost markers, a missing DLQ."""
    scheduled = sum(r.scheduled for r in rows)
    if scheduled:
        click.echo(f"{scheduled} of the in-flight message(s) are scheduled (kmq-not-before): held until their time")
    bad = sum(r.bad_markers for r in rows)
    if bad:
        click.echo(f"{bad} undecodable marker record(s) skipped while replaying")
    if any(r.dlq_missing for r in rows):
        click.echo(f"DLQ topic {q.dlq_topic} does not exist: dead letters wait (their messages stay "
                   f"in flight); run `kmq topics create {queue}{'' if q.group is None else f' --group {q.group}'}`")
    for r in rows:
        if r.markers_lost:
            click.echo(f"partition {r.partition}: {r.markers_lost} marker record(s) deleted by retention before the "
                       f"tracker read them; see docs/operations.md (markers lost to retention)")


def _status_doc(queue: str, workers_group: str, tracker_group: str, rows, tracker_lines) -> dict:
    """``kmq status -o json``: the same figures as the table (null where the table shows -)."""
    parts = [{"partition": r.partition, "in_flight": r.in_flight, "oldest_age_seconds": round(r.oldest_age_s, 3),
              "queue_lag": r.queue_lag, "marker_lag": r.marker_lag, "dlq_size": r.dlq_size,
              "bad_markers": r.bad_markers, "scheduled": r.scheduled} for r in rows]
    doc = {
        "queue": queue, "workers_group": workers_group, "tracker_group": tracker_group, "partitions": parts,
        "total": {
            "in_flight": sum(r.in_flight for r in rows),
            "oldest_age_seconds": round(max((r.oldest_age_s for r in rows), default=0.0), 3),
            "queue_lag": sum(r.queue_lag or 0 for r in rows),
            "marker_lag": sum(r.marker_lag or 0 for r in rows),
            "dlq_size": sum(r.dlq_size or 0 for r in rows),
            "bad_markers": sum(r.bad_markers for r in rows),
            "scheduled": sum(r.scheduled for r in rows),
        },
    }
    if tracker_lines is not None:
        doc["tracker_metrics"] = list(tracker_lines)
    return doc
