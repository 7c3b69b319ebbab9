"""Helpers shared by the tracker's integration tests: write markers with the
codec, tail a topic, read tracker metrics. No sleeps: everything waits on
real conditions."""

from __future__ import annotations

import contextlib
import time
import urllib.request

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from kmq.core.markers import decode, encode, encode_key
from tests.helpers.kafka import read_all, wait_until

#: The queue of the tracker's tests: a short lease, backoff and delivery limit.
QUEUE = {"lease": "1s", "max_deliveries": 3, "backoff": {"initial": "200ms", "max": "2s", "multiplier": 2.0}}


class Tail:
    """Accumulates every record of some partitions of a topic as they arrive."""

    def __init__(self, bootstrap: str, topic: str, partitions=(0,)) -> None:
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                      auto_offset_reset="earliest", fetch_max_wait_ms=50)
        self.tps = [TopicPartition(topic, p) for p in partitions]
        self.consumer.assign(self.tps)
        self.consumer.seek_to_beginning(*self.tps)
        self.records: list = []

    def poll(self) -> list:
        for recs in self.consumer.poll(timeout_ms=100).values():
            self.records.extend(recs)
        return self.records

    def wait_for(self, n: int, timeout: float = 30.0, what: str = "records") -> list:
        deadline = time.monotonic() + timeout
        while len(self.poll()) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {n} {what}; have {len(self.records)}")
        return self.records

    def close(self) -> None:
        self.consumer.close()


class MarkerProducer:
    """Writes markers to a markers topic the way a consumer would (acks=all, flushed)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)

    def send(self, partition: int, marker, ts_ms: int | None = None, flush: bool = True):
        fut = self.producer.send(self.topic, key=encode_key(partition), value=encode(marker),
                                 partition=partition, timestamp_ms=ts_ms)
        if flush:
            return fut.get(timeout=10)
        return fut

    def close(self) -> None:
        self.producer.close()


def headers(rec) -> dict[str, str]:
    return {k: v.decode() for k, v in (rec.headers or [])}


def metric(port: int, name: str, **labels) -> float:
    """Sum of a Prometheus sample from the tracker's /metrics (0 when absent)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric_name, _, label_text = head.partition("{")
        if metric_name != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


def http_status(port: int, path: str) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code


class TrackerProcess:
    """``kmq tracker run`` as a real process (for SIGKILL / SIGTERM tests)."""

    def __init__(self, cfg, workdir, env: dict[str, str] | None = None) -> None:
        import os
        import subprocess
        import sys

        import yaml

        self.path = workdir / f"tracker-{time.monotonic_ns()}.yaml"
        self.path.write_text(yaml.safe_dump(cfg.to_dict(redact=False)))
        self.log_path = workdir / f"{self.path.stem}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kmq", "tracker", "run", "--config", str(self.path), "--http-host", "127.0.0.1"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=None if env is None else {**os.environ, **env},
        )
        self.port: int | None = None

    def wait_port(self, timeout: float = 30.0) -> int:
        import re

        deadline = time.monotonic() + timeout
        while self.port is None:
            m = re.search(rb"tracker HTTP listening on [^:]+:(\d+)", self.log_path.read_bytes())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                raise AssertionError(f"tracker exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            elif time.monotonic() > deadline:
                raise AssertionError("tracker did not report its HTTP port")
            else:
                time.sleep(0.05)
        return self.port

    def wait_ready(self, timeout: float = 40.0) -> int:
        port = self.wait_port(timeout)
        deadline = time.monotonic() + timeout
        while http_status(port, "/readyz") != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"tracker not ready: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        return port

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except Exception:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def close(self) -> None:
        self.kill()
        self._log.close()


def committed(bootstrap: str, group: str, topic: str, partition: int = 0):
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return c.committed(TopicPartition(topic, partition))
    finally:
        c.close()


@contextlib.contextmanager
def running_tracker(cfg):
    """An in-process tracker, ready (its /readyz answers 200), stopped on exit."""
    from tracker.service import Tracker

    t = Tracker(cfg, http_host="127.0.0.1").start()
    try:
        wait_until(lambda: http_status(t.http_port, "/readyz") == 200, 30, what="tracker ready")
        yield t
    finally:
        t.stop()


def markers_covering(bootstrap: str, topic: str, origin: str) -> list:
    """(marker offset, type, owner, timestamp ms) of every marker covering ``origin``'s offset."""
    partition, offset = (int(x) for x in origin.split("/")[-2:])
    out = []
    for r in read_all(bootstrap, topic, timeout=30):
        if int.from_bytes(r.key, "big") != partition:
            continue
        try:
            m = decode(r.value)
        except Exception:  # noqa: BLE001 - a diagnostic: hostile markers are not ours to judge here
            continue
        if any(offset in rg for rg in m.ranges):
            out.append((r.offset, m.TYPE.name, getattr(m, "owner", ""), r.timestamp))
    return out
