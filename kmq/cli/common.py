"""Options and helpers shared by the CLI commands."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click

from kmq.config import Config

__all__ = ["config_options", "load_config", "fail", "output_option", "echo_json", "bytes_field", "ProgressLine"]


def config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--config`` and ``--bootstrap`` and pass a loaded :class:`Config` as ``cfg``."""

    @click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), envvar="KMQ_CONFIG",
        help="kmq.yaml to read (default: ./kmq.yaml when present; env KMQ_CONFIG).",
    )
    @click.option("--bootstrap", help="Kafka bootstrap servers; overrides kafka.bootstrap_servers.")
    @functools.wraps(fn)
    def wrapper(*args: Any, config_path: str | None, bootstrap: str | None, **kwargs: Any) -> Any:
        cfg = load_config(config_path, bootstrap)
        _apply_logging(cfg)
        kwargs["cfg"] = cfg
        return fn(*args, **kwargs)

    return wrapper


def reaches_kafka_at_once(fn: Callable[..., Any]) -> Callable[..., Any]:
    """For a one-shot command (below :func:`config_options`): when every bootstrap server refuses
    the connection or does not resolve, fail at once with that, instead of after the clients'
    ``kafka.connect_timeout`` of retries. The services (``kmq work``, ``kmq tracker run``) keep
    waiting: a broker that is starting may still answer within it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, cfg: Config, **kwargs: Any) -> Any:
        from kmq.client.diagnose import refused_everywhere

        refused = refused_everywhere(cfg.kafka)
        if refused is not None:
            raise refused
        return fn(*args, cfg=cfg, **kwargs)

    return wrapper


def load_config(path: str | None, bootstrap: str | None = None) -> Config:
    if path is None and Path("kmq.yaml").exists():
        path = "kmq.yaml"
    cfg = Config.load(path, os.environ)
    if bootstrap:
        import dataclasses

        cfg = cfg.replace(kafka=dataclasses.replace(cfg.kafka, bootstrap_servers=bootstrap))
    return cfg


def _apply_logging(cfg: Config) -> None:
    """``logging:`` from kmq.yaml/env, raised by the root command's ``-v``/``-vv``."""
    from kmq.telemetry.logs import configure_logging

    ctx = click.get_current_context(silent=True)
    verbose = (ctx.find_root().params.get("verbose") or 0) if ctx is not None else 0
    configure_logging(cfg.logging, verbose)


def fail(message: str) -> click.ClickException:
    """A runtime failure (exit 1) with one clear line."""
    exc = click.ClickException(message)
    exc.exit_code = 1  # type: ignore[misc]  # click's stubs say ClassVar; click reads the instance's
    return exc


def output_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--output text|json`` (``output``): json prints one JSON document on stdout for scripts."""
    return click.option("--output", "-o", "output", type=click.Choice(["text", "json"]), default="text",
                        show_default=True, help="text for people, json for scripts (one document on stdout).")(fn)


_GROUP_HELP = ("The queue's consumer group (queues[].group; 'default' for the default group); needed when "
               "QUEUE is configured for several.")


def group_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--group G`` (``group``): which consumer group of the queue (fan-out)."""
    return click.option("--group", "group", default=None, help=_GROUP_HELP)(fn)


def queue_group_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--queue-group G`` (``queue_group``): :func:`group_option` where ``--group`` means something else."""
    return click.option("--queue-group", "queue_group", default=None, help=_GROUP_HELP)(fn)


def echo_json(doc: Any) -> None:
    import json

    click.echo(json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False))


def bytes_field(name: str, data: bytes | None) -> dict[str, Any]:
    """``{name: text}`` when ``data`` is UTF-8 (or null), else ``{name: None, name_base64: ...}``."""
    if data is None:
        return {name: None}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        import base64

        return {name: None, f"{name}_base64": base64.b64encode(data).decode("ascii")}


class ProgressLine:
    """A progress line on stderr. On a terminal one line rewritten in place (``\\r``) at most 5 times
    a second; anywhere else (a pipe, a log file, CI) plain lines, at most one a second, so the
    output stays readable line by line. The last state (``final``) is always shown."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        isatty = getattr(sys.stderr, "isatty", None)
        self._tty = bool(isatty and isatty())
        self._interval = 0.2 if self._tty else 1.0
        self._clock = clock
        self._last: float | None = None
        self._open = False  # a terminal line without its newline yet

    def show(self, text: str, final: bool = False) -> None:
        now = self._clock()
        if not final and self._last is not None and now - self._last < self._interval:
            return
        self._last = now
        if self._tty:
            click.echo(f"\r{text}", err=True, nl=False)
            self._open = True
        else:
            click.echo(text, err=True)

    def close(self) -> None:
        """End the terminal line (nothing to do for plain lines)."""
        if self._open:
            click.echo("", err=True)
            self._open = False
