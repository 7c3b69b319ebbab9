"""``kmq tracker run``: the redelivery tracker service."""

from __future__ import annotations

import logging

import click

from kmq.cli.common import config_options
from kmq.config import Config


@click.group()
def tracker() -> None:
    """The redelivery tracker (timeouts, NACK, REJECT, DLQ)."""


@tracker.command()
@click.option("--http-host", default="0.0.0.0", show_default=True, envvar="KMQ_TRACKER_HTTP_HOST",
              help="Address for /metrics, /healthz and /readyz (port: tracker.http_port, 0 = any free port).")
@config_options
def run(http_host: str, cfg: Config) -> None:
    """Join the tracker group and redeliver until SIGTERM (drains, commits, leaves the group)."""
    # The service reports its port, assignments and catch-up at INFO: show them even without -v.
    logging.getLogger("tracker").setLevel(min(logging.getLogger("tracker").getEffectiveLevel(), logging.INFO))
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for h in logging.getLogger().handlers:
        h.setLevel(logging.NOTSET)
    from kmq.client import broker_errors
    from kmq.config.process import tune_collector
    from kmq.telemetry.otel_sdk import process_tracing
    from tracker import Tracker

    tune_collector()
    # Before the tracker is built: its redelivery spans use the provider installed here (OTEL_* env).
    with process_tracing("kmq-tracker", logging.getLogger("tracker").info), broker_errors(cfg.kafka, "running the tracker"):
        Tracker(cfg, http_host=http_host).run()
