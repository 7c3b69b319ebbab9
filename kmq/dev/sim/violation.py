"""One broken invariant of a simulated schedule (what the safety and liveness checks report)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Violation"]


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant; ``message`` names the message concerned, when there is one."""

    invariant: str
    detail: str
    message: str | None = None
