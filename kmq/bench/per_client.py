"""One benchmark run per Kafka client (``kafka.client``), for the benches that compare both."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from kmq.client.api import require_client
from kmq.core.errors import ClientNotInstalled

__all__ = ["per_client"]


def per_client(clients: Iterable[str], run_one: Callable[[str], dict]) -> dict[str, Any]:
    """``{client: run_one(client)}`` for each of ``clients``, one after the other. A client that is
    not installed is reported as ``{"skipped": <how to install it>}`` and the others still run."""
    out: dict[str, Any] = {}
    for client in clients:
        try:
            require_client(client)
        except ClientNotInstalled as exc:
            out[client] = {"skipped": str(exc)}
            continue
        out[client] = run_one(client)
    return out
