"""Calling into an event loop's clients from the loop itself or from another thread.

aiokafka's clients belong to one event loop and are not thread-safe; kmq's marker writer and
the consumer's close work from threads of their own. :class:`LoopBridge` runs a call on the loop:
directly when already there, else through the loop, waiting for its answer.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, TypeVar

from kmq.core.errors import BrokerUnavailable, KmqError

__all__ = ["LoopBridge"]

T = TypeVar("T")


class LoopBridge:
    """The event loop ``loop`` (running on another thread than most callers)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def on_loop(self) -> bool:
        """Whether the caller runs on the loop's thread."""
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the loop (at once when called there), its result or exception."""
        if self.on_loop():
            return fn(*args)

        async def run() -> T:
            return fn(*args)

        return self.wait(run(), None)

    def wait(self, coro: Awaitable[T], timeout: float | None, what: str = "a Kafka call") -> T:
        """Run ``coro`` on the loop and wait for it from this (other) thread, at most ``timeout`` seconds."""
        if self.on_loop():
            close = getattr(coro, "close", None)
            if close is not None:
                close()
            raise KmqError(f"{what} would wait on the event loop's own thread; it must be awaited there")
        if self.loop.is_closed():
            close = getattr(coro, "close", None)
            if close is not None:
                close()
            raise KmqError(f"{what}: the event loop of the aiokafka clients is closed")
        fut = asyncio.run_coroutine_threadsafe(_as_coro(coro), self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise BrokerUnavailable(f"{what}: no answer within {timeout:g}s") from None


async def _as_coro(aw: Awaitable[T]) -> T:
    return await aw

