"""The tracker's HTTP endpoints (stdlib http.server in a daemon thread).

* ``/metrics``: Prometheus text format of the tracker's registry
* ``/healthz``: 200 while the main loop completes steps (``liveness()``), 503
  with the reason when it has not for longer than its bound: a hung loop
  redelivers nothing, so the liveness probe should restart the pod
* ``/readyz``: 200 when every assigned markers partition has caught up to the
  high-water mark seen at assignment, 503 otherwise (with the reason)

Port 0 picks a free port; the bound port is :attr:`HealthServer.port`.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kmq.core.errors import CannotListen

__all__ = ["HealthServer"]

log = logging.getLogger(__name__)


class HealthServer:
    """Serve /metrics, /healthz and /readyz. ``readiness()`` and ``liveness()`` return (ok, detail);
    without ``liveness`` /healthz answers 200 while the process serves HTTP."""

    def __init__(self, registry: CollectorRegistry, readiness: Callable[[], tuple[bool, str]],
                 host: str = "0.0.0.0", port: int = 9108,
                 liveness: Callable[[], tuple[bool, str]] | None = None) -> None:
        self._registry = registry
        self._readiness = readiness
        self._liveness = liveness or (lambda: (True, "ok"))
        self._host = host
        self._requested_port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self) -> int:
        """Bind and serve in a daemon thread; return the bound port."""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(owner._registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    self._check(owner._liveness, "alive", "not alive")
                elif path == "/readyz":
                    self._check(owner._readiness, "ready", "not ready")
                else:
                    self._send(404, b"not found: try /metrics, /healthz or /readyz\n")

            def _check(self, probe: Callable[[], tuple[bool, str]], yes: str, no: str) -> None:
                ok, detail = probe()
                self._send(200 if ok else 503, (detail or (yes if ok else no)).encode() + b"\n")

            def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    # The prober gave up before the answer (its timeout): not the service's failure.
                    log.debug("http client left before the answer to %s", self.path)

            def log_message(self, fmt: str, *args) -> None:  # probes every few seconds: keep them out of the log
                log.debug("http %s", fmt % args)

        try:
            self._server = ThreadingHTTPServer((self._host, self._requested_port), Handler)
        except OSError as exc:
            raise CannotListen("the tracker's HTTP server", self._host, self._requested_port, exc,
                               "set another tracker.http_port (KMQ_TRACKER__HTTP_PORT; 0 = any free port) or "
                               "--http-host, or stop what holds it") from exc
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="kmq-tracker-http", daemon=True)
        self._thread.start()
        log.info("tracker HTTP listening on %s:%d (/metrics /healthz /readyz)", self._host, self.port)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
