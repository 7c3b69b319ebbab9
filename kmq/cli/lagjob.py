"""``kmq lag-job``: the Spark Structured Streaming lag job (docs/spark.md)."""

from __future__ import annotations

import importlib.util

import click

from kmq.cli.common import config_options, fail
from kmq.config import parse_duration
from kmq.core.errors import ConfigError, install_extra

__all__ = ["lag_job"]


def _seconds(text: str, what: str) -> float:
    try:
        return parse_duration(text, what)
    except ConfigError as exc:
        raise click.BadParameter(exc.problem, param_hint=what) from None


@click.command("lag-job")
@config_options
@click.option("--source", type=click.Choice(["kafka", "python"]), default=None,
              help="kafka: Spark's own connector (its jars fetched once into spark.jars_cache); python: the "
                   "kmq-kafka data source (no jars). Default: spark.source of the config (kafka).")
@click.option("--sink", "sinks", multiple=True, type=click.Choice(["topic", "prometheus", "parquet"]),
              help="Where window rows go (repeatable; default: topic and prometheus).")
@click.option("--checkpoint", default="kmq-lag-checkpoint", show_default=True,
              help="Checkpoint directory (shared storage on a cluster: hdfs://, s3a://, ...).")
@click.option("--trigger", default="1s", show_default=True, help="Micro-batch interval.")
@click.option("--window", default="10s", show_default=True, help="Tumbling event-time window per partition.")
@click.option("--idle-close", default=None, help="Close a partition's open window after this long without markers "
              "(processing time; default max(window, 2s)).")
@click.option("--parquet-path", default=None, help="Directory of the parquet sink (one batch_id=N folder per batch).")
@click.option("--prometheus-port", default=9109, show_default=True, type=int, help="Port of /metrics on the driver (0 = any).")
@click.option("--starting-offsets", default="earliest", show_default=True, help="earliest, latest or Spark-style JSON.")
@click.option("--max-offsets-per-trigger", default=1_000_000, show_default=True, type=int, help="0 = no cap.")
@click.option("--fail-on-data-loss/--no-fail-on-data-loss", default=True, show_default=True,
              help="Fail (or skip) when markers were deleted by retention before the job read them.")
@click.option("--queue", "queues", multiple=True,
              help="Queue(s) to watch (default: every configured queue); a consumer group of a queue by its "
                   "label, QUEUE__GROUP.")
@click.option("--master", default=None, help="Spark master when not run by spark-submit (default local[2]).")
@click.option("--conf", "confs", multiple=True, help="Extra Spark configuration KEY=VALUE (repeatable).")
def lag_job(cfg, source, sinks, checkpoint, trigger, window, idle_close, parquet_path, prometheus_port,
            starting_offsets, max_offsets_per_trigger, fail_on_data_loss, queues, master, confs) -> None:
    """Run the Spark lag job: per queue partition and window, marker counts, in-flight,
    oldest age, ack latency, redeliveries, dead letters, late acks and marker lag."""
    if importlib.util.find_spec("pyspark") is None:
        raise fail(f"kmq lag-job needs pyspark: {install_extra('spark')}")
    from kmq.spark.job import JobOptions, run

    conf = {}
    for item in confs:
        if "=" not in item:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--conf")
        k, v = item.split("=", 1)
        conf[k.strip()] = v.strip()
    sinks = tuple(sinks) or ("topic", "prometheus")
    if "parquet" in sinks and not parquet_path:
        raise click.BadParameter("the parquet sink needs --parquet-path DIR", param_hint="--sink parquet")
    opts = JobOptions(
        source=source,
        sinks=sinks,
        checkpoint=checkpoint,
        trigger=f"{int(_seconds(trigger, '--trigger') * 1000)} milliseconds",
        window_s=_seconds(window, "--window"),
        idle_close_s=_seconds(idle_close, "--idle-close") if idle_close else None,
        parquet_path=parquet_path,
        prometheus_port=prometheus_port,
        starting_offsets=starting_offsets,
        max_offsets_per_trigger=max_offsets_per_trigger or None,
        fail_on_data_loss=fail_on_data_loss,
        queues=tuple(queues),
        spark_conf=conf,
    )
    if opts.window_s <= 0:
        raise click.BadParameter("must be positive", param_hint="--window")
    run(cfg, opts, master=master)
