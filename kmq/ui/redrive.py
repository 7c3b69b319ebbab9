"""Redrive from the console: which dead letters, how many, and moving them back.

A :class:`Selection` is either a set of DLQ positions (ticked rows) or a
filter (reason, key, time window with absolute bounds, so it means the same
thing when confirmed a minute later). The move itself is
:func:`kmq.ops.dlq.replay` (the code of ``kmq dlq replay``) with the
selection as its ``select`` and a replay group named after the selection:
confirming twice, or again after a crash mid-redrive, continues from the
committed DLQ position instead of copying anything a second time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from kmq.client import open_log_reader
from kmq.config import Config, QueueConfig
from kmq.ops.dlq import DeadLetter, ReplayResult, list_dead_letters, replay

__all__ = ["Selection", "preview", "redrive", "matching"]


@dataclass(frozen=True)
class Selection:
    positions: frozenset[tuple[int, int]] = field(default_factory=frozenset)  # (DLQ partition, offset)
    reason: str | None = None
    key: str | None = None
    after_ms: int | None = None
    before_ms: int | None = None

    @property
    def empty(self) -> bool:
        return not self.positions and self.reason is None and self.key is None and self.after_ms is None \
            and self.before_ms is None

    def matches(self, dl: DeadLetter) -> bool:
        if self.positions:
            return (dl.partition, dl.offset) in self.positions
        if self.reason is not None and dl.reason != self.reason:
            return False
        if self.key is not None and (dl.key or b"").decode("utf-8", "replace") != self.key:
            return False
        if self.after_ms is not None and dl.timestamp < self.after_ms:
            return False
        return self.before_ms is None or dl.timestamp <= self.before_ms

    def canonical(self) -> str:
        return json.dumps({"positions": sorted(self.positions), "reason": self.reason, "key": self.key,
                           "after_ms": self.after_ms, "before_ms": self.before_ms}, sort_keys=True)

    def group(self, cfg: Config, queue: str) -> str:
        """The replay group of this selection: the same selection always gets the same group."""
        digest = hashlib.sha256(self.canonical().encode()).hexdigest()[:16]
        return f"{cfg.tracker.group_id}-ui-redrive-{queue}-{digest}"


def matching(cfg: Config, q: QueueConfig, sel: Selection) -> list[DeadLetter]:
    """The dead letters of ``q`` (a queue's consumer group) the selection names (whether or not
    already redriven)."""
    return [dl for dl in list_dead_letters(cfg, q.name, group=q.group_name) if sel.matches(dl)]


def preview(cfg: Config, q: QueueConfig, sel: Selection) -> tuple[int, int]:
    """Dry run: (dead letters a redrive would move now, ones this selection already moved)."""
    found = matching(cfg, q, sel)
    reader = open_log_reader(cfg.kafka)
    try:
        committed = reader.committed(sel.group(cfg, q.label), {(q.dlq_topic, dl.partition) for dl in found})
    finally:
        reader.close()
    done = {p: offset for (_, p), offset in committed.items()}
    moved = sum(1 for dl in found if done[dl.partition] is not None and dl.offset < done[dl.partition])
    return len(found) - moved, moved


def redrive(cfg: Config, q: QueueConfig, sel: Selection) -> ReplayResult:
    """Move the selected dead letters back to the queue, exactly as ``kmq dlq replay`` does (to
    ``q``'s consumer group only)."""
    return replay(cfg, q.name, select=sel.matches, group=sel.group(cfg, q.label), queue_group=q.group_name)
