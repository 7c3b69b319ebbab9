"""Stopping the child processes kmq's dev tools start (broker, S3 server, Redis, demo
workers): by PID, SIGTERM first, SIGKILL after a grace period."""

from __future__ import annotations

import subprocess
import time
from typing import Iterable

__all__ = ["stop_processes"]


def stop_processes(procs: Iterable[subprocess.Popen | None], timeout: float = 10.0) -> None:
    """SIGTERM every live process, wait up to ``timeout`` in all, then SIGKILL the rest.

    Idempotent: ``None`` entries and processes that already exited are skipped."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + timeout
    for p in live:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
