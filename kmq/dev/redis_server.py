"""A throwaway local Redis (Debian's ``redis-server``) on loopback, for the demo and tests.

Nothing is persisted; the server is stopped by PID.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kmq.dev.broker import free_port
from kmq.core.errors import KmqError
from kmq.dev.processes import stop_processes

__all__ = ["DevRedis", "DevRedisError"]


class DevRedisError(KmqError):
    pass


class DevRedis:
    """``with DevRedis() as r: r.url`` -> ``redis://127.0.0.1:PORT/0``."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or shutil.which("redis-server")
        self.port = free_port()
        self._proc: subprocess.Popen | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="kmq-redis-"))

    @staticmethod
    def available() -> bool:
        """A redis-server to start, and the redis package (the ``redis`` extra) to talk to it."""
        return shutil.which("redis-server") is not None and importlib.util.find_spec("redis") is not None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout: float = 10.0) -> "DevRedis":
        if not self.binary:
            raise DevRedisError("redis-server not found: apt-get install redis-server (scripts/test.sh does)")
        import redis

        self._proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self._dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if self._proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise DevRedisError(f"redis-server did not start on 127.0.0.1:{self.port}") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        stop_processes([self._proc])
        self._proc = None

    def __enter__(self) -> "DevRedis":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
