"""Stopping the child processes kmq's dev tools start (broker, S3 server, Redis, demo
workers): by PID, SIGTERM first, SIGKILL after a grace period."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable

__all__ = ["log_tail", "set_pdeathsig", "stop_processes"]


def set_pdeathsig() -> None:  # pragma: no cover - runs in the child
    """``preexec_fn`` of a child: Linux SIGTERMs it when its parent dies, so a killed test run
    or CLI leaves no stray broker behind."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def log_tail(path: Path, lines: int = 3) -> str:
    """The last ``lines`` of a child's log on one line, for an error message ("" if unreadable)."""
    with contextlib.suppress(OSError):
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    return ""


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
