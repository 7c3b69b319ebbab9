"""Worker processes of a chaos test's fleet: their kinds, their ack logs, and what ``kmq trace``
tells of the messages a fleet did not ack (for a failure message)."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Iterable

from kmq.config import Config
from kmq.core.trace import describe_event
from kmq.ops.trace_reader import trace

#: ``kmq work`` with four handler threads, as a worker kind's command.
KMQ_WORK = ("-m", "kmq", "work", "--workers", "4")


@dataclasses.dataclass(frozen=True)
class WorkerKind:
    """One kind of worker process: a command taking ``QUEUE --config FILE`` plus `kmq work`'s
    injection options (``--fail-rate --hang-rate --poison-rate --ack-log``), and its environment."""

    name: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def acked_ids(logs: Iterable[Path]) -> collections.Counter[str]:
    """Acks per message id, from ``kmq work --ack-log`` files (``<time> <id>`` lines)."""
    acked: collections.Counter[str] = collections.Counter()
    for path in logs:
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2:
                    acked[parts[1]] += 1
    return acked


def timelines(cfg: Config, queue: str, origins: list[str]) -> str:
    """What ``kmq trace`` shows of each message, for a failure message (the broker is still up)."""
    out = []
    for origin in origins:
        try:
            (t,) = trace(cfg, queue, origin=origin, timeout_s=20)
            out.append(f"\n{origin}: {t.state}\n" + "\n".join(f"  {e.ts_ms} {describe_event(e)}" for e in t.events))
        except Exception as exc:  # noqa: BLE001 - a diagnosis only: the test's assertion is the verdict
            out.append(f"\n{origin}: no timeline ({exc})")
    return "".join(out)
