"""asyncio API (public module): :class:`AsyncKmqConsumer`, :class:`AsyncKmqMessage` and
:class:`AsyncIdempotencyGuard`.

The implementation lives in :mod:`kmq.consumer.aio`; this module is the stable
import path for users (``from kmq.aio import AsyncKmqConsumer``).
"""

from __future__ import annotations

from kmq.consumer.aio import AsyncKmqConsumer, AsyncKmqMessage
from kmq.consumer.guard import AsyncIdempotencyGuard

__all__ = ["AsyncKmqConsumer", "AsyncKmqMessage", "AsyncIdempotencyGuard"]
