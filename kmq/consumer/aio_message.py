"""The message a coroutine is handed: :class:`AsyncKmqMessage`, awaitable settlements over a
:class:`~kmq.core.message.KmqMessage` (:mod:`kmq.consumer.aio` hands them out)."""

from __future__ import annotations

import asyncio

from kmq.core.message import KmqMessage

__all__ = ["AsyncKmqMessage", "wrap"]


class AsyncKmqMessage:
    """A queue message for coroutines: the attributes of :class:`~kmq.core.message.KmqMessage`
    and awaitable settlements (same rules: one terminal settlement, any order).

    The settlements only record the outcome in memory (the marker is written by
    the consumer's flusher thread), so awaiting them never waits for Kafka."""

    __slots__ = ("message",)

    def __init__(self, message: KmqMessage) -> None:
        #: The underlying :class:`~kmq.core.message.KmqMessage` (for code written against the threaded API).
        #: Its one slot: :func:`wrap` sets it without calling the class.
        self.message = message

    # The attributes users read, without a per-access __getattr__ indirection.
    topic = property(lambda self: self.message.topic)
    partition = property(lambda self: self.message.partition)
    offset = property(lambda self: self.message.offset)
    key = property(lambda self: self.message.key)
    value = property(lambda self: self.message.value)
    headers = property(lambda self: self.message.headers)
    timestamp = property(lambda self: self.message.timestamp)
    delivery_count = property(lambda self: self.message.delivery_count)
    origin = property(lambda self: self.message.origin)
    #: The delivery's OpenTelemetry span, None when tracing is off (``kmq.tracing.use_span``).
    span = property(lambda self: self.message.span)
    outcome = property(lambda self: self.message.outcome)
    settled = property(lambda self: self.message.settled)

    def __repr__(self) -> str:
        return f"Async{self.message!r}"

    async def ack(self) -> None:
        """Processing is complete: an END marker is written with the next flush."""
        self.message.ack()

    async def ack_with_response(self) -> None:
        """Ack, and return once Kafka acknowledged the END marker covering it (batched with the other
        acks as usual); raises :class:`~kmq.core.errors.MarkerWriteError` when the writer gives it up
        or closes first (the tracker then redelivers the message when its lease ends). Cancelling
        the wait does not undo the ack."""
        await asyncio.shield(asyncio.wrap_future(self.message.ack_with_response()))

    async def nack(self, delay: float = 0.0) -> None:
        """Processing failed: the tracker redelivers the message after ``delay`` seconds
        (:class:`~kmq.core.errors.InvalidSettlement` for a delay the wire cannot carry)."""
        self.message.nack(delay)

    async def reject(self, reason: str = "") -> None:
        """The message can never be processed: the tracker sends it to the DLQ with ``reason``."""
        self.message.reject(reason)

    async def renew(self, lease: float | None = None) -> None:
        """Extend the lease: new deadline = now + ``lease`` seconds (default: the queue's lease)."""
        self.message.renew(lease)

    async def abandon(self) -> None:
        """Give the message up without a marker: the tracker redelivers it when its lease ends."""
        self.message.abandon()


def wrap(message: KmqMessage) -> AsyncKmqMessage:
    """``AsyncKmqMessage(message)`` without the class call (``__new__`` and ``__init__`` cost twice
    this, once per message handed to a coroutine)."""
    w = _new_wrapper(AsyncKmqMessage)
    w.message = message
    return w


_new_wrapper = object.__new__
