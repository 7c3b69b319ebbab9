"""A simulated process's downtime after a crash: down until a time, then restarted once."""

from __future__ import annotations

from typing import Callable

__all__ = ["Downtime"]


class Downtime:
    """When a crashed actor comes back: :meth:`up` once per actor step."""

    def __init__(self) -> None:
        self.until: float | None = None

    @property
    def down(self) -> bool:
        return self.until is not None

    def crashed(self, now: float, down_for: float) -> None:
        self.until = now + down_for

    def up(self, now: float, restart: Callable[[], None]) -> bool:
        """Whether the actor runs this step; ``restart`` (rebuild from the commits) is called first
        when its downtime just ended."""
        if self.until is None:
            return True
        if now < self.until:
            return False
        self.until = None
        restart()
        return True
