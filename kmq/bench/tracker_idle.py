"""``kmq bench tracker --idle-partitions N``: what an idle tracker costs per partition.

The real :class:`~tracker.service.Tracker` and its real main loop
(:meth:`~tracker.service.Tracker.step`, metrics and commits included) over
``N`` markers partitions with no traffic, at a given tick. Only the edges are
stand-ins: a markers consumer whose fetch waits out its timeout and returns
nothing (what a poll of an idle topic does), log readers that report every
partition at its committed offset, and a producer that is never used, handed
to the tracker's constructor as :class:`IdleClients` (a
:class:`~kmq.client.parts.ClientFactory`) and opened by its
:meth:`~tracker.service.Tracker.open` as the service opens them. So the
figure is the tracker's own cost; the Kafka client's cost of fetching ``N``
idle partitions comes on top (librdkafka's threads are cheap at idle,
kafka-python's fetch loop is not).

Printed: CPU time of the process as a share of one core over the measured
wall time, CPU time per step, and the RSS the partitions add (per partition).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from kmq.client import LogEnds
from kmq.client.parts import ClientFactory
from kmq.dev.broker import broker_unless

__all__ = ["idle_cost", "process_idle_cost", "plain_markers_consumer", "IdleClients", "IdleConsumer", "IdleReader"]

#: What a broker reports as ``max.message.bytes`` by default.
_KAFKA_MAX_MESSAGE_BYTES = 1_048_588


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0  # pragma: no cover - no /proc


class IdleConsumer:
    """A markers consumer of idle partitions: ``fetch`` waits out its timeout and returns nothing."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._wake = threading.Event()
        self._positions: dict[tuple[str, int], int] = {}
        self.commits = 0

    def subscribe(self, topics: list, on_assigned: Callable[[set], None], on_revoked: Callable[[set], None],
                  commit_on_revoke: Any = None, on_commit_failed: Any = None) -> None:
        """Every one of ``partitions`` partitions of each topic is assigned at once (no group)."""
        on_assigned({(topic, p) for topic in topics for p in range(self.partitions)})

    def fetch(self, timeout: float, max_records: int) -> list:
        self._wake.wait(timeout)
        return []

    def committed(self, tps: list) -> dict:
        return {tp: 0 for tp in tps}

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._positions[(topic, partition)] = offset

    def seek_to_beginning(self, tps: list) -> None:
        for tp in tps:
            self._positions[tp] = 0

    def position(self, topic: str, partition: int) -> int | None:
        return self._positions.get((topic, partition), 0)

    def highwater(self, topic: str, partition: int) -> int | None:
        return 0

    def commit(self, offsets: dict) -> None:
        self.commits += 1

    def close(self) -> None:
        self._wake.set()


class IdleReader:
    """A log reader of idle partitions: every log ends at offset 0."""

    def high_waters(self, starts: dict) -> dict:
        return {k: 0 for k in starts}

    def log_ends(self, starts: dict) -> LogEnds:
        return LogEnds(self.high_waters(starts), {})

    def partition_count(self, topic: str) -> int:
        return 1

    def close(self) -> None:
        pass


class _NoProducer:
    def send(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - idle: nothing is due
        raise AssertionError("an idle tracker produced something")

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float = 0.0) -> None:
        pass


class IdleClients(ClientFactory):
    """The :class:`~kmq.client.parts.ClientFactory` of the idle stand-ins: an :class:`IdleConsumer`
    assigned ``partitions`` partitions of every markers topic, :class:`IdleReader` s, a producer
    never used; the topics aligned, with Kafka's default ``max.message.bytes``."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def group_consumer(self, kafka: Any, group_id: str, assignor: str, max_records: int, **overrides: Any) -> Any:
        return IdleConsumer(self.partitions)

    def producer(self, kafka: Any, timeout_s: float | None = None, settle_on_flush: bool = False,
                 **overrides: Any) -> Any:
        return _NoProducer()

    def open_log_reader(self, kafka: Any, timeout_s: float = 10.0, fetch_wait_ms: int = 50, **overrides: Any) -> Any:
        return IdleReader()

    def require_aligned(self, kafka: Any, queue: Any) -> Any:
        return None

    def max_message_bytes(self, kafka: Any, names: list[str]) -> dict[str, int | None]:
        return dict.fromkeys(names, _KAFKA_MAX_MESSAGE_BYTES)


def _tracker(partitions: int, tick_s: float) -> Any:
    """A real Tracker on idle edges (:class:`IdleClients`), not opened yet: its open assigns it
    ``partitions`` markers partitions."""
    from kmq.config import Config
    from tracker.service import Tracker

    cfg = Config.from_dict({
        "kafka": {"bootstrap_servers": "127.0.0.1:9"},
        "queues": [{"name": "idle"}],
        "tracker": {"group_id": "idle-tracker", "tick": f"{tick_s}s", "http_port": 0},
    })
    return Tracker(cfg, clients=IdleClients(partitions))


def idle_cost(partitions: int = 10_000, tick_s: float = 0.1, seconds: float = 5.0) -> dict:
    """CPU share of one core and RSS per partition of an idle tracker over ``partitions``."""
    import tracker.service  # noqa: F401 - imported before the baseline: RSS per partition, not per import

    base = _rss_mb()
    t = _tracker(partitions, tick_s)
    t.open(serve_http=False)  # as the service opens it: the pause watch runs, the partitions are assigned
    try:
        deadline = time.monotonic() + 60
        delay = 0.0
        while not t.ready()[0]:  # positioning and catch-up are not idle cost
            if time.monotonic() > deadline:
                raise RuntimeError(f"idle tracker not ready: {t.ready()[1]}")
            delay = t.step(0.0)
        delay = t.step(0.0)  # the first metrics pass creates every label child: not idle either
        held = _rss_mb()
        steps = 0
        cpu0, wall0 = time.process_time(), time.monotonic()
        end = wall0 + seconds
        while time.monotonic() < end:
            delay = t.step(min(delay, max(0.0, end - time.monotonic())))
            steps += 1
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    finally:
        t.close()
    rss = _rss_mb()
    return {"partitions": partitions, "tick_ms": round(tick_s * 1000), "seconds": round(wall, 2), "steps": steps,
            "cpu_pct_of_core": round(100 * cpu / wall, 2), "cpu_ms_per_step": round(1000 * cpu / max(1, steps), 3),
            "rss_mb": round(rss, 1), "rss_kb_per_partition": round(1024 * (max(held, rss) - base) / partitions, 2)}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (its threads included)."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of process ``pid`` (librdkafka names its threads: rdk:broker...)."""
    import os

    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _rss_mb_of(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0  # pragma: no cover - no /proc


def _measure_process(cmd: list[str], ready: Callable[[Any], bool], seconds: float, ready_timeout_s: float,
                     what: str, stdout: Any = None, settle_s: float = 2.0) -> dict:
    """Start ``cmd``, wait until ``ready(proc)``, let it settle ``settle_s`` (its CPU in that start
    period reported per window of up to 5 s), then measure its CPU over ``seconds``; SIGTERM it after.
    ``what`` names it in errors (with the end of its stderr); ``stdout``: where its standard output
    goes (default: nowhere; ``subprocess.PIPE`` when ``ready`` reads it).

    Why a settle period: librdkafka keeps its broker thread busy for a while after an assignment
    (20-25 s of a whole core at 10,000 partitions on this machine) before it settles to what
    fetching the idle partitions costs. That is a cost of every start and every rebalance, reported
    as such, not the idle cost."""
    import signal
    import subprocess
    import tempfile

    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL if stdout is None else stdout, stderr=err, text=True)
        try:
            def died(why: str = "") -> RuntimeError:
                err.seek(0)
                return RuntimeError(f"{why or f'{what} exited with {proc.returncode}'}; its log ends: "
                                    f"{err.read()[-2000:]}")

            t0 = time.monotonic()
            while not ready(proc):
                if proc.poll() is not None:
                    raise died()
                if time.monotonic() - t0 > ready_timeout_s:
                    raise died(f"{what} was not ready within {ready_timeout_s:g}s")
                time.sleep(0.5)
            ready_s = time.monotonic() - t0
            # The first metrics pass, commits after catch-up and the client's start are not idle cost.
            start_cpu0, windows, left = _cpu_s(proc.pid), [], settle_s
            while left > 0:
                window = min(5.0, left)
                c0, w0 = _cpu_s(proc.pid), time.monotonic()
                time.sleep(window)
                windows.append(round(100 * (_cpu_s(proc.pid) - c0) / (time.monotonic() - w0), 1))
                left -= window
            start_cpu = _cpu_s(proc.pid) - start_cpu0
            cpu0, wall0, threads0 = _cpu_s(proc.pid), time.monotonic(), _thread_cpu_s(proc.pid)
            time.sleep(seconds)
            cpu, wall = _cpu_s(proc.pid) - cpu0, time.monotonic() - wall0
            threads = {k: v - threads0.get(k, 0.0) for k, v in _thread_cpu_s(proc.pid).items()}
            rss = _rss_mb_of(proc.pid)
            if proc.poll() is not None:
                raise died()
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return {"seconds": round(wall, 2), "cpu_pct_of_core": round(100 * cpu / wall, 2), "rss_mb": round(rss, 1),
            "ready_s": round(ready_s, 1),
            "start": {"seconds": settle_s, "cpu_s": round(start_cpu, 2), "pct_of_core_per_window": windows},
            "threads_pct_of_core": {k: round(100 * v / wall, 2) for k, v in sorted(threads.items(), key=lambda kv: -kv[1])
                                    if v > 0}}


def process_idle_cost(partitions: int, client: str, tick_s: float = 0.1, seconds: float = 10.0,
                      bootstrap: str | None = None, ready_timeout_s: float = 240.0, settle_s: float = 60.0,
                      fetch_wait_s: float | None = None) -> dict:
    """CPU share of one core of a whole ``kmq tracker run`` process (the Kafka client's threads
    included) owning ``partitions`` idle markers partitions on a real broker (the embedded one when
    ``bootstrap`` is None), measured for ``seconds`` once it has been ready for ``settle_s`` (the
    CPU of that start period reported apart, as ``start``), with ``tracker.fetch_wait`` set to
    ``fetch_wait_s`` (None: its default); then, in the same run, the
    floor under it: a plain consumer of the same client in the same group settings fetching the same
    idle partitions with the same fetch wait and nothing else (``client_floor``)."""
    import os
    import socket
    import subprocess
    import sys
    import tempfile
    import urllib.error
    import urllib.request
    import uuid

    import yaml

    from kmq.config import Config
    from kmq.client.topics import ensure_topics

    bootstrap, dev = broker_unless(bootstrap)
    try:
        name = f"idle-{uuid.uuid4().hex[:8]}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        doc = {"kafka": {"bootstrap_servers": bootstrap, "client": client},
               "queues": [{"name": name}],
               "tracker": {"group_id": f"{name}-tracker", "tick": f"{tick_s}s", "http_port": port,
                           "fetch_wait": None if fetch_wait_s is None else f"{fetch_wait_s}s"}}
        cfg = Config.from_dict(doc)
        ensure_topics(cfg.kafka, cfg.queues[0], partitions)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "kmq.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(doc, f)

            def tracker_ready(_proc: Any) -> bool:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                        return r.status == 200
                except (urllib.error.URLError, OSError):
                    return False

            tracker = _measure_process([sys.executable, "-m", "kmq", "tracker", "run", "--config", path,
                                        "--http-host", "127.0.0.1"], tracker_ready, seconds, ready_timeout_s,
                                       "the tracker", settle_s=settle_s)

            def floor_ready(proc: Any) -> bool:
                import select

                return bool(select.select([proc.stdout], [], [], 0.5)[0]) and proc.stdout.readline().strip() == "ready"

            floor = _measure_process([sys.executable, "-m", "kmq.bench.tracker_idle", path, f"{tick_s}",
                                      str(partitions)],
                                     floor_ready, seconds, ready_timeout_s, "the plain consumer", subprocess.PIPE,
                                     settle_s=settle_s)
    finally:
        if dev is not None:
            dev.stop()
    return {"partitions": partitions, "client": client, "tick_ms": round(tick_s * 1000),
            "fetch_wait_ms": cfg.tracker.markers_fetch_wait_ms(), **tracker,
            "client_floor": {k: floor[k] for k in ("cpu_pct_of_core", "rss_mb", "start", "threads_pct_of_core")},
            "kmq_over_floor_pct_of_core": round(tracker["cpu_pct_of_core"] - floor["cpu_pct_of_core"], 2)}


def plain_markers_consumer(config_path: str, tick_s: float, partitions: int) -> None:
    """The floor under an idle tracker: the tracker's markers consumer without the tracker (same client,
    same group settings, same fetch wait), fetching until SIGTERM. Prints ``ready`` once it holds all
    ``partitions`` markers partitions."""
    import signal

    from kmq import client as client_api
    from kmq.config import Config

    cfg = Config.load(config_path)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = client_api.group_consumer(cfg.kafka, group_id=f"{cfg.tracker.group_id}-floor", assignor="RANGE",
                                         max_records=10_000,
                                         fetch_wait=cfg.tracker.markers_fetch_wait_ms() / 1000)
    held: set = set()
    consumer.subscribe([cfg.queues[0].markers_topic], on_assigned=held.update, on_revoked=held.difference_update)
    told = False
    try:
        while not stop.is_set():
            consumer.fetch(timeout=tick_s, max_records=10_000)
            if not told and len(held) >= partitions:
                print("ready", flush=True)
                told = True
    finally:
        consumer.close()


if __name__ == "__main__":
    import sys

    plain_markers_consumer(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
