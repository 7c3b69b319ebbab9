"""asyncio API (public module): :class:`AsyncKmqConsumer` and :class:`AsyncKmqMessage`.

The implementation lives in :mod:`kmq.consumer.aio`; this module is the stable
import path for users (``from kmq.aio import AsyncKmqConsumer``).
"""

from __future__ import annotations

from kmq.consumer.aio import AsyncKmqConsumer, AsyncKmqMessage

__all__ = ["AsyncKmqConsumer", "AsyncKmqMessage"]
