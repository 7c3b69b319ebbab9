"""The console's web application (Starlette + Jinja2, htmx shipped in ``static/``).

Pages: ``/`` queues overview (the figures of ``kmq status`` plus the
tracker's readiness and redelivery / DLQ rates when ``tracker_url`` is set),
``/dlq`` the DLQ browser, ``/dlq/preview`` and ``/dlq/redrive`` the redrive
with its dry-run count and confirmation, ``/trace`` the trace view.
``/healthz`` answers probes without credentials and without touching Kafka.

Every page reads Kafka on request through the same functions as the CLI
(``kmq.ops.status.collect``, ``kmq.ops.dlq``, ``kmq.ops.trace_reader``);
handlers are plain functions, so Starlette runs them in its thread pool and
the event loop never blocks on Kafka. Templates autoescape everything,
and a Content-Security-Policy allows only this server's own scripts and
styles, so a payload can never run as code in the browser.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from kmq.config import Config, QueueConfig, parse_duration
from kmq.core.errors import ConfigError, KmqError
from kmq.core.trace import STATES, clock, describe_event
from kmq.ops.dlq import REASONS, list_dead_letters
from kmq.ops.status import age_text, collect, tracker_metrics
from kmq.ops.trace_reader import trace as read_trace
from kmq.ui.auth import LOCAL_HOSTS, authorized, needs_token
from kmq.ui.redrive import Selection, preview, redrive

__all__ = ["UiSettings", "create_app"]

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
PREVIEW_CHARS = 300
MAX_ROWS = 500
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


@dataclass(frozen=True)
class UiSettings:
    host: str = "127.0.0.1"
    port: int = 8089
    token: str | None = None
    tracker_url: str | None = None
    workers_group: str | None = None
    tracker_group: str | None = None
    refresh_s: int = 10  # overview auto-refresh


def create_app(cfg: Config, settings: UiSettings) -> Starlette:
    """The ASGI application; :class:`~kmq.core.errors.UiConfigError` is the caller's job (``kmq ui``)."""
    console = _Console(cfg, settings)
    routes = [
        Route("/", console.overview),
        Route("/overview/table", console.overview_table),
        Route("/dlq", console.dlq),
        Route("/dlq/preview", console.redrive_preview, methods=["POST"]),
        Route("/dlq/redrive", console.redrive_confirm, methods=["POST"]),
        Route("/trace", console.trace),
        Route("/healthz", lambda request: PlainTextResponse("ok")),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={KmqError: console.failure})
    token = settings.token if settings.token else None
    hosts = None if needs_token(settings.host) else LOCAL_HOSTS | {"[::1]"}
    return _Guard(app, token, hosts)  # type: ignore[return-value]


class _Guard:
    """ASGI wrapper: Host check on loopback (DNS rebinding), token check elsewhere, security headers."""

    def __init__(self, app: Any, token: str | None, hosts: frozenset[str] | None) -> None:
        self.app, self.token, self.hosts = app, token, hosts

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.hosts is not None:
            host = headers.get("host", "")
            host = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host not in self.hosts:
                return await PlainTextResponse("unexpected Host header", 421)(scope, receive, send)
        if self.token and scope["path"] != "/healthz" and not authorized(headers.get("authorization"), self.token):
            resp = PlainTextResponse("a token is required: Authorization: Bearer TOKEN, or any user name "
                                     "with the token as basic-auth password", 401,
                                     headers={"WWW-Authenticate": 'Basic realm="kmq", charset="UTF-8"'})
            return await resp(scope, receive, send)

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] += [(b"content-security-policy", CSP.encode()),
                                       (b"x-content-type-options", b"nosniff"),
                                       (b"referrer-policy", b"no-referrer"),
                                       (b"cache-control", b"no-store")]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _BadRequest(KmqError):
    """A request the user can fix (shown with status 400)."""


def _text(b: bytes | None, limit: int = PREVIEW_CHARS) -> str:
    if b is None:
        return "(null)"
    s = b.decode("utf-8", "replace")
    return s if len(s) <= limit else s[:limit] + f"… ({len(b)} bytes)"


def _age(seconds: float) -> str:
    return age_text(seconds)  # the very same rendering as `kmq status`


def _int(v: str | None, name: str) -> int | None:
    if v in (None, ""):
        return None
    try:
        return int(v)
    except ValueError:
        raise _BadRequest(f"{name} must be a whole number, got {v!r}") from None


def _since_ms(v: str | None, now_ms: int) -> int | None:
    if not v:
        return None
    try:
        return now_ms - int(parse_duration(v, "since") * 1000)
    except ConfigError as exc:
        raise _BadRequest(f"{exc} (e.g. 30m, 1h)") from None


class _Console:
    def __init__(self, cfg: Config, settings: UiSettings) -> None:
        self.cfg, self.settings = cfg, settings
        self.csrf = secrets.token_urlsafe(24)  # per process: a form from another site cannot know it
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.globals.update(clock=clock, describe_event=describe_event, states=STATES)
        self._samples: dict[str, tuple[float, float, float]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ helpers
    def _queue(self, request: Request, label: str | None = None) -> QueueConfig:
        """The queue the page is about: ``?queue=`` names an entry by its label (``orders``, or
        ``orders__billing`` for a consumer group of the queue)."""
        label = label or request.query_params.get("queue") or (self.cfg.queues[0].label if self.cfg.queues else "")
        if not label:
            raise KmqError("no queue configured: pass ?queue=NAME or add queues to kmq.yaml")
        return self.cfg.queue_labelled(label)

    def _page(self, request: Request, template: str, status: int = 200, **ctx: Any) -> Response:
        ctx.setdefault("queues", [q.label for q in self.cfg.queues])
        q = ctx.get("q")
        if isinstance(q, QueueConfig):  # the queue's topic and group, for the text of the page
            ctx.update(queue=q.label, topic=q.name, group=q.group)
        return self.templates.TemplateResponse(request, template, {"csrf": self.csrf, **ctx}, status_code=status)

    def failure(self, request: Request, exc: Exception) -> Response:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return self._page(request, "error.html", status=400 if isinstance(exc, (ConfigError, _BadRequest)) else 502,
                          error=str(exc), queue=request.query_params.get("queue"))

    # ------------------------------------------------------------ overview
    def _overview(self, q: QueueConfig) -> dict[str, Any]:

        rows = collect(self.cfg, q.name, self.settings.workers_group, self.settings.tracker_group, group=q.group_name)
        totals = {
            "in_flight": sum(r.in_flight for r in rows),
            "oldest": _age(max((r.oldest_age_s for r in rows), default=0)),
            "queue_lag": sum(r.queue_lag or 0 for r in rows),
            "marker_lag": sum(r.marker_lag or 0 for r in rows),
            "dlq": sum(r.dlq_size or 0 for r in rows),
            "bad": sum(r.bad_markers for r in rows),
        }
        return {"q": q, "rows": rows, "totals": totals, "age": _age, "tracker": self._tracker(q.label),
                "refresh_s": self.settings.refresh_s,
                "now": datetime.now(timezone.utc).strftime("%H:%M:%S UTC")}

    def _tracker(self, queue: str) -> dict[str, Any] | None:
        url = self.settings.tracker_url
        if not url:
            return None

        base = url.rstrip("/").removesuffix("/metrics")
        try:
            ready = urllib.request.urlopen(f"{base}/readyz", timeout=5).status == 200
        except urllib.error.HTTPError:
            ready = False
        except (urllib.error.URLError, OSError) as exc:
            return {"url": base, "ready": None, "error": f"unreachable: {exc}"}
        sums = {"redelivered": 0.0, "dead": 0.0}
        for line in tracker_metrics(base, queue):
            name, _, value = line.rpartition(" ")
            if name.startswith("kmq_tracker_redelivered_total{"):
                sums["redelivered"] += float(value)
            elif name.startswith("kmq_tracker_dead_lettered_total{"):
                sums["dead"] += float(value)
        now = time.monotonic()
        with self._lock:
            prev = self._samples.get(queue)
            self._samples[queue] = (now, sums["redelivered"], sums["dead"])
        rates = None
        if prev is not None and now - prev[0] >= 1.0:
            per_min = 60.0 / (now - prev[0])
            rates = ((sums["redelivered"] - prev[1]) * per_min, (sums["dead"] - prev[2]) * per_min)
        return {"url": base, "ready": ready, "redelivered": int(sums["redelivered"]),
                "dead_lettered": int(sums["dead"]), "rates": rates}

    def overview(self, request: Request) -> Response:
        return self._page(request, "overview.html", **self._overview(self._queue(request)))

    def overview_table(self, request: Request) -> Response:
        return self._page(request, "_overview_table.html", **self._overview(self._queue(request)))

    # ------------------------------------------------------------ DLQ
    def _filter(self, form: Any, now_ms: int) -> Selection:
        reason = form.get("reason") or None
        key = form.get("key") or None
        after = _int(form.get("after_ms"), "after_ms")
        if after is None:
            after = _since_ms(form.get("since"), now_ms)
        before = _int(form.get("before_ms"), "before_ms")
        return Selection(reason=reason, key=key, after_ms=after, before_ms=before)

    def dlq(self, request: Request) -> Response:

        q = self._queue(request)
        now_ms = int(time.time() * 1000)
        qp = request.query_params
        sel = self._filter(qp, now_ms)
        rows: list[dict[str, Any]] = []
        total, shown = 0, 0
        for dl in list_dead_letters(self.cfg, q.name, group=q.group_name):
            total += 1
            if not sel.matches(dl):
                continue
            shown += 1
            if len(rows) < MAX_ROWS:
                rows.append({
                    "partition": dl.partition, "offset": dl.offset, "time": clock(dl.timestamp),
                    "key": _text(dl.key, 80), "value": _text(dl.value), "reason": dl.reason or "unknown",
                    "origin": dl.header("kmq-origin"), "error": dl.header("kmq-dlq-error"),
                    "headers": [(k, _text(v, 200)) for k, v in dl.headers],
                })
        return self._page(request, "dlq.html", q=q, rows=rows, total=total, shown=shown, reasons=REASONS,
                          reason=qp.get("reason", ""), key=qp.get("key", ""), since=qp.get("since", ""),
                          max_rows=MAX_ROWS)

    async def _form(self, request: Request) -> Any:
        form = await request.form()
        if not secrets.compare_digest(str(form.get("csrf", "")), self.csrf):
            raise _BadRequest("this form is stale or came from another site: reload the page and try again")
        return form

    def _selection(self, form: Any) -> Selection:
        if form.get("mode") == "selected":
            positions = set()
            for v in form.getlist("pos"):
                p, _, o = str(v).partition(":")
                positions.add((int(p), int(o)))
            if not positions:
                raise _BadRequest("no dead letter ticked: tick some rows, or redrive everything the filter shows")
            return Selection(positions=frozenset(positions))
        sel = self._filter(form, int(time.time() * 1000))
        # Freeze the window now so the confirmation means what the dry run counted.
        return Selection(reason=sel.reason, key=sel.key, after_ms=sel.after_ms,
                         before_ms=sel.before_ms if sel.before_ms is not None else int(time.time() * 1000))

    async def redrive_preview(self, request: Request) -> Response:
        form = await self._form(request)
        q = self._queue(request, str(form.get("queue", "")))
        sel = self._selection(form)
        from starlette.concurrency import run_in_threadpool

        count, moved = await run_in_threadpool(preview, self.cfg, q, sel)
        return self._page(request, "confirm.html", q=q, sel=sel, count=count, moved=moved,
                          positions=sorted(sel.positions), replay_group=sel.group(self.cfg, q.label))

    async def redrive_confirm(self, request: Request) -> Response:
        form = await self._form(request)
        q = self._queue(request, str(form.get("queue", "")))
        sel = self._selection(form)
        from starlette.concurrency import run_in_threadpool

        log.info("redriving %s from the DLQ of %s", sel.canonical(), q.label)
        result = await run_in_threadpool(redrive, self.cfg, q, sel)
        return self._page(request, "done.html", q=q, result=result)

    # ------------------------------------------------------------ trace
    def trace(self, request: Request) -> Response:

        q = self._queue(request)
        qp = request.query_params
        form = {k: qp.get(k, "") for k in ("origin", "key", "partition", "offset", "since")}
        traces, error = None, None
        if form["origin"] or form["key"] or form["offset"]:
            try:
                since = parse_duration(form["since"], "since") if form["since"] else None
                traces = read_trace(self.cfg, q.name, group=q.group_name, origin=form["origin"] or None,
                                    key=form["key"] or None,
                                    partition=_int(form["partition"], "partition") if form["offset"] else None,
                                    offset=_int(form["offset"], "offset"), since_s=since,
                                    tracker_group=self.settings.tracker_group,
                                    workers_group=self.settings.workers_group)
            except KmqError as exc:
                error = str(exc)
        return self._page(request, "trace.html", q=q, form=form, traces=traces, error=error)
