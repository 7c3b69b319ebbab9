"""The demo: the whole product on one machine, with failures, and proof of the guarantee.

Starts (or uses) a broker, creates a queue's topics, starts a tracker and
flaky workers (``kmq work`` with fail / hang / poison injection) as real
processes, produces messages, shows a live one-screen view, then drains and
prints a summary whose numbers come from reading the topics themselves
(:class:`kmq.ops.audit.QueueAudit`), not from the components' own counters.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

import yaml

from kmq.ops.audit import QueueAudit
from kmq.dev.workload import fate
from kmq.config import Config
from kmq.dev.broker import DevBroker, free_port
from kmq.dev.redis_server import DevRedis
from kmq.core.errors import KmqError
from kmq.core.ledger import LedgerSnapshot
from kmq.dev.processes import stop_processes
from kmq.client.topics import ensure_topics

__all__ = ["DemoSettings", "DemoResult", "DemoError", "run_demo"]

log = logging.getLogger(__name__)


class DemoError(KmqError):
    """A demo process died early; the message names its log file."""


@dataclass(frozen=True)
class DemoSettings:
    messages: int = 3000
    duration: float = 45.0  # active phase; the drain that follows is bounded by drain_timeout
    partitions: int = 3
    worker_processes: int = 2
    threads: int = 8
    fail_rate: float = 0.03
    hang_rate: float = 0.01
    slow_rate: float = 0.01
    poison_rate: float = 0.005
    processing_ms: float = 5.0
    lease: str = "2s"
    max_deliveries: int = 3
    drain_timeout: float = 60.0
    keep_running: bool = False
    bootstrap: str | None = None  # use this broker instead of an embedded one
    queue: str | None = None
    redis: bool = True  # start a local redis-server (when installed) for IdempotencyGuard in the workers


@dataclass
class DemoResult:
    queue: str
    bootstrap: str
    snapshot: LedgerSnapshot
    drained: bool
    metrics_url: str
    expected_poison: int
    unsettled: list[str] = field(default_factory=list)
    guard_skipped: int | None = None  # duplicate deliveries acked without effect (None: no Redis)
    injected_dead: int = 0  # good messages dead-lettered because the injected fates failed every delivery
    unexplained_dead: list[str] = field(default_factory=list)  # dead letters no injection accounts for
    max_deliveries: int = 3

    @property
    def guarantee_holds(self) -> bool:
        s = self.snapshot
        # Every message acked or dead-lettered. Not acked + dead_lettered == produced: a message
        # can be both (a slow delivery acked late while its copies ran into the delivery limit).
        return self.drained and s.lost == 0

    def guarantee_line(self) -> str:
        s = self.snapshot
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(s.dlq_reasons.items())) or "none"
        verdict = "0 lost" if self.guarantee_holds else f"{s.lost} NOT SETTLED"
        return (
            f"guarantee: {verdict} | produced {s.produced} | acked {s.acked} | "
            f"dead-lettered {s.dead_lettered} ({reasons}) | redelivered {s.redelivered} | duplicates {s.duplicates}"
        )


class _Procs:
    """Child processes of the demo, stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        out = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "kmq", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
        out.close()
        self.procs[name] = proc
        return proc

    def dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() not in (None, 0) and not n.startswith("produce")]

    def stop(self, timeout: float = 20.0) -> None:
        stop_processes(self.procs.values(), timeout)


def _write_config(path: Path, bootstrap: str, queue: str, s: DemoSettings, http_port: int,
                  redis_url: str | None) -> Config:
    data = {
        "kafka": {"bootstrap_servers": bootstrap, "session_timeout": "6s", "heartbeat_interval": "1s"},
        "queues": [{
            "name": queue, "lease": s.lease, "max_deliveries": s.max_deliveries,
            "backoff": {"initial": "250ms", "max": "2s", "multiplier": 2.0},
        }],
        # Off: the demo's slow deliveries are meant to outlast their lease and be redelivered meanwhile.
        "consumer": {"group_id": f"{queue}-workers", "ack_flush_interval": "100ms", "auto_renew": False},
        "tracker": {"group_id": f"{queue}-tracker", "tick": "50ms", "http_port": http_port},
        "redis": {"url": redis_url},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return Config.load(path, env={})


def run_demo(s: DemoSettings, view: "Callable[[str, LedgerSnapshot, float, bool], None] | None" = None) -> DemoResult:
    """Run the demo; ``view(phase, snapshot, elapsed, final)`` is called about once a second."""
    workdir = Path(tempfile.mkdtemp(prefix="kmq-demo-"))
    broker: DevBroker | None = None
    redis: DevRedis | None = None
    procs = _Procs(workdir)
    queue = s.queue or (f"demo-orders-{uuid.uuid4().hex[:6]}" if s.bootstrap else "demo-orders")
    try:
        if s.bootstrap:
            bootstrap = s.bootstrap
        else:
            broker = DevBroker(workdir=str(workdir)).start()
            bootstrap = broker.bootstrap
        if s.redis and DevRedis.available():
            redis = DevRedis().start()
        http_port = free_port()
        cfg_path = workdir / "kmq.yaml"
        cfg = _write_config(cfg_path, bootstrap, queue, s, http_port, redis.url if redis else None)
        qcfg = cfg.queues[0]
        ensure_topics(cfg.kafka, qcfg, s.partitions)
        common = ["--config", str(cfg_path)]
        procs.start("tracker", ["tracker", "run", "--http-host", "127.0.0.1", *common])
        for i in range(s.worker_processes):
            procs.start(f"worker-{i}", [
                "work", queue, "--workers", str(s.threads), "--fail-rate", str(s.fail_rate),
                "--hang-rate", str(s.hang_rate), "--slow-rate", str(s.slow_rate), "--processing-ms", str(s.processing_ms), *common,
            ])
        rate = s.messages / max(1.0, s.duration * 0.5)
        procs.start("produce", ["produce", queue, "--count", str(s.messages), "--rate", f"{rate:.1f}",
                                "--poison-rate", str(s.poison_rate), *common])
        expected_poison = int(s.messages * s.poison_rate)
        metrics_url = f"http://127.0.0.1:{http_port}/metrics"

        with QueueAudit(cfg.kafka, qcfg) as audit:
            started = time.monotonic()

            def tick(phase: str) -> LedgerSnapshot:
                until = time.monotonic() + 1.0
                while time.monotonic() < until:
                    audit.poll()
                snap = audit.snapshot()
                if view:
                    view(phase, snap, time.monotonic() - started, False)
                dead = procs.dead()
                if dead:
                    raise DemoError(f"demo process {dead[0]} exited early; see {workdir / (dead[0] + '.log')}")
                return snap

            while time.monotonic() - started < s.duration or s.keep_running:
                snap = tick("running")
            drain_until = time.monotonic() + s.drain_timeout
            drained = False
            while time.monotonic() < drain_until:
                snap = tick("draining")
                if snap.produced >= s.messages and snap.open == 0:
                    drained = True
                    break
            procs.stop()
            snap = audit.drain(10.0)
            if view:
                view("done", snap, time.monotonic() - started, True)
            skipped = _guard_skipped(workdir, s.worker_processes) if redis else None
            injected, unexplained = explain_dead_letters(audit.ledger.dead_letters(), audit.ledger.acked_origins(), s)
            return DemoResult(queue, bootstrap, snap, drained and snap.open == 0, metrics_url, expected_poison,
                              audit.ledger.unsettled(), skipped, injected, unexplained, s.max_deliveries)
    finally:
        procs.stop()
        if redis is not None:
            redis.stop()
        if broker is not None:
            broker.stop()


def explain_dead_letters(dead: dict[str, str], acked: set[str], s: DemoSettings) -> tuple[int, list[str]]:
    """Which dead letters the demo's injections account for: ``(good messages dead-lettered by
    injection, ["origin (reason)" of the rest])``.

    Workers reject poison payloads only (``rejected``). A good message reaches the delivery limit
    (``timeout`` / ``nack-limit``) when its last delivery was made to fail, hang or run past the
    lease (``kmq work`` fates are a function of origin and delivery count, so this is exact), or
    while a slow earlier delivery was still running and then acked it. Anything else -- e.g. leases
    running out in a prefetch queue -- is a fault the demo exists to show, so it is listed."""
    injected, unexplained = 0, []
    for origin, reason in sorted(dead.items()):
        if reason == "rejected":
            continue
        last = fate(origin, s.max_deliveries, s.fail_rate, s.hang_rate, s.slow_rate)
        if reason in ("timeout", "nack-limit") and (last != "ok" or origin in acked):
            injected += 1
        else:
            unexplained.append(f"{origin} ({reason})")
    return injected, unexplained


def _guard_skipped(workdir: Path, workers: int) -> int:
    """Sum of ``duplicate=N`` from the workers' closing ``settled:`` lines."""
    total = 0
    for i in range(workers):
        text = (workdir / f"worker-{i}.log").read_text(errors="replace")
        lines = [line for line in text.splitlines() if line.startswith("settled:")]
        if lines:
            fields = dict(f.split("=", 1) for f in lines[-1].split()[1:] if "=" in f)
            total += int(fields.get("duplicate", 0))
    return total


# ---------------------------------------------------------------------- view
class LiveView:
    """A one-screen table, redrawn in place on a terminal; a line every 5 s otherwise."""

    def __init__(self, out: TextIO, messages: int) -> None:
        self.out = out
        self.messages = messages
        self.tty = out.isatty()
        self._last: tuple[float, LedgerSnapshot] | None = None
        self._last_line = -10.0

    def __call__(self, phase: str, s: LedgerSnapshot, elapsed: float, final: bool) -> None:
        rate = 0.0
        if self._last is not None and elapsed > self._last[0]:
            rate = (s.acked - self._last[1].acked) / (elapsed - self._last[0])
        self._last = (elapsed, s)
        if self.tty:
            self.out.write("\x1b[H\x1b[2J" + self.render(phase, s, elapsed, rate))
            self.out.flush()
        elif final or elapsed - self._last_line >= 5:
            self._last_line = elapsed
            self.out.write(
                f"[{elapsed:5.1f}s {phase}] produced {s.produced}/{self.messages} in-flight {s.open} "
                f"acked {s.acked} redelivered {s.redelivered} dead-lettered {s.dead_lettered} ({rate:.0f} acks/s)\n"
            )
            self.out.flush()

    def render(self, phase: str, s: LedgerSnapshot, elapsed: float, rate: float) -> str:
        width = 30
        done = (s.acked + s.dead_lettered) / self.messages if self.messages else 1.0
        bar = "#" * int(done * width) + "." * (width - int(done * width))
        rows = [
            f"kmq demo  [{phase}]  {elapsed:5.1f}s   settled [{bar}] {done:4.0%}",
            "",
            f"  produced        {s.produced:>8} / {self.messages}",
            f"  in flight       {s.open:>8}",
            f"  acked           {s.acked:>8}   ({rate:,.0f}/s)",
            f"  redelivered     {s.redelivered:>8}   (timeouts and nacks re-produced by the tracker)",
            f"  dead-lettered   {s.dead_lettered:>8}   " + ", ".join(f"{k} {v}" for k, v in sorted(s.dlq_reasons.items())),
            f"  duplicates      {s.duplicates:>8}   (acked more than once: at-least-once)",
            "",
            "  Ctrl-C stops everything.",
            "",
        ]
        return "\n".join(rows)


def summary_text(r: DemoResult, workdir_hint: str = "") -> str:
    s = r.snapshot
    lines = [
        "",
        r.guarantee_line(),
        "",
        f"  {s.produced} messages produced to {r.queue}; {s.deliveries - s.produced} redelivered copies",
        f"  {s.acked} acknowledged (END markers), {s.duplicates} of them more than once",
        f"  {s.dead_lettered} dead-lettered: " + (", ".join(f"{v} {k}" for k, v in sorted(s.dlq_reasons.items())) or "none")
        + f" (poison messages produced: {r.expected_poison})",
        f"  counted independently from {r.queue}, {r.queue}__markers and {r.queue}__dlq",
    ]
    if r.injected_dead:
        lines.append(f"  {r.injected_dead} of the dead letters are good messages the demo made fail, hang or run "
                     f"slow on delivery {r.max_deliveries} (the limit): injected, expected")
    if r.unexplained_dead:
        lines.append(f"  dead-lettered with no injected cause: {', '.join(r.unexplained_dead[:10])}")
    if r.guard_skipped is None:
        lines.append("  IdempotencyGuard: off (no redis-server on this machine)")
    else:
        lines.append(f"  IdempotencyGuard (local Redis): {r.guard_skipped} duplicate deliveries acked without a second effect")
    if not r.guarantee_holds:
        lines.append(f"  not settled yet: {', '.join(r.unsettled[:10])}")
    lines += [
        "",
        f"metrics (while it ran): {r.metrics_url}",
        "try next:",
        "  kmq dev broker                                  # a broker of your own",
        "  kmq topics create orders --partitions 6         # then: kmq tracker run, kmq work orders --fail-rate 0.1",
        "  kmq status orders  /  kmq dlq list orders       # what is in flight, what died",
        "  README.md: KmqConsumer in 10 lines, or @kmq.marked on an existing kafka-python loop",
    ]
    return "\n".join(lines)
