"""Options and helpers shared by the CLI commands."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable

import click

from kmq.config import Config

__all__ = ["config_options", "load_config", "fail"]


def config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--config`` and ``--bootstrap`` and pass a loaded :class:`Config` as ``cfg``."""

    @click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), envvar="KMQ_CONFIG",
        help="kmq.yaml to read (default: ./kmq.yaml when present; env KMQ_CONFIG).",
    )
    @click.option("--bootstrap", help="Kafka bootstrap servers; overrides kafka.bootstrap_servers.")
    @functools.wraps(fn)
    def wrapper(*args: Any, config_path: str | None, bootstrap: str | None, **kwargs: Any) -> Any:
        kwargs["cfg"] = load_config(config_path, bootstrap)
        return fn(*args, **kwargs)

    return wrapper


def load_config(path: str | None, bootstrap: str | None = None) -> Config:
    if path is None and Path("kmq.yaml").exists():
        path = "kmq.yaml"
    cfg = Config.load(path, os.environ)
    if bootstrap:
        import dataclasses

        cfg = cfg.replace(kafka=dataclasses.replace(cfg.kafka, bootstrap_servers=bootstrap))
    return cfg


def fail(message: str) -> click.ClickException:
    """A runtime failure (exit 1) with one clear line."""
    exc = click.ClickException(message)
    exc.exit_code = 1
    return exc
