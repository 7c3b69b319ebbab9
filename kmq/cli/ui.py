"""``kmq ui``: serve the web console (overview, dead letters, redrive, trace) from one process."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import click

from kmq.cli.common import config_options
from kmq.config import Config
from kmq.core.errors import CannotListen, KmqError, UiConfigError, install_extra

log = logging.getLogger("kmq.ui")


def _token(token_file: str | None) -> str | None:
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UiConfigError(f"cannot read --token-file {token_file}: {exc.strerror}") from exc
        if not token:
            raise UiConfigError(f"--token-file {token_file} is empty: put the token in it")
        return token
    return os.environ.get("KMQ_UI_TOKEN") or None


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CannotListen("kmq ui", host, port, exc, "pick another --port/--host") from exc
    sock.listen(128)
    return sock


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, envvar="KMQ_UI_HOST",
              help="Address to listen on. Anything but 127.0.0.1, ::1 or localhost needs a token.")
@click.option("--port", default=8089, show_default=True, type=click.IntRange(0, 65535), envvar="KMQ_UI_PORT",
              help="Port (0 = any free port; the log line says which).")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="File holding the access token (default: env KMQ_UI_TOKEN).")
@click.option("--tracker-url", envvar="KMQ_UI_TRACKER_URL",
              help="A tracker's HTTP address (e.g. http://tracker:9108) for readiness and rates.")
@click.option("--workers-group", help="Workers consumer group (default: consumer.group_id).")
@click.option("--tracker-group", help="Tracker consumer group (default: tracker.group_id).")
@config_options
def ui(host: str, port: int, token_file: str | None, tracker_url: str | None, workers_group: str | None,
       tracker_group: str | None, cfg: Config) -> None:
    """Serve the kmq console: queues overview, DLQ browser with redrive, and message traces.

    Bound to loopback by default. On any other address a token is required
    (env KMQ_UI_TOKEN or --token-file): requests carry it as
    "Authorization: Bearer TOKEN" or as the basic-auth password.
    """
    try:
        import uvicorn

        from kmq.ui.app import UiSettings, create_app
        from kmq.ui.auth import needs_token
    except ImportError as exc:
        raise KmqError(f"kmq ui needs the ui extra ({exc.name} is missing): {install_extra('ui')}") from exc
    token = _token(token_file)
    if needs_token(host) and not token:
        raise UiConfigError(f"kmq ui would listen on {host}, beyond this machine, without a token: set KMQ_UI_TOKEN "
                            "(or --token-file), or keep the default --host 127.0.0.1")
    settings = UiSettings(host=host, port=port, token=token, tracker_url=tracker_url,
                          workers_group=workers_group, tracker_group=tracker_group)
    app = create_app(cfg, settings)
    sock = _bind(host, port)
    shown = f"[{host}]" if ":" in host else host
    logging.getLogger("kmq").setLevel(logging.INFO)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("kmq ui listening on http://%s:%d/ (%s)", shown, sock.getsockname()[1],
             "token required" if token else "no token: loopback only")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
