"""The marker producer on aiokafka: sends from the loop or from any thread, answered on the loop.

kmq's marker writer sends STARTs from the consumer's driver (on the loop) and settlement markers
from its flusher thread; :class:`AioProducer` takes both. A send is queued on the loop in call
order (one task per send, so per partition the order of the calls is the order on the wire, as
the idempotent producer keeps it) and answered through a :class:`~kmq.client.api.Delivery`, the
future the writer reads on every client. ``flush`` and ``close`` wait from another thread; on the
loop's own thread they do not wait (the loop would stop).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaProducer

from kmq.client.aiokafka.bridge import LoopBridge
from kmq.client.aiokafka.errors import produce_error, started
from kmq.client.api import Delivery
from kmq.client.errors import ProduceFailed

__all__ = ["AioProducer"]

log = logging.getLogger(__name__)


class AioProducer:
    """An idempotent acks=all aiokafka producer of ``settings`` on ``bridge``'s loop. Made off the
    loop it connects before returning (within ``timeout`` seconds); made on it, in the background
    (sends wait for that)."""

    is_aiokafka = True

    def __init__(self, settings: dict[str, Any], bridge: LoopBridge, timeout: float) -> None:
        self._bridge = bridge
        self._loop = bridge.loop
        self._timeout = timeout
        self._raw: AIOKafkaProducer | None = None
        self._pending: set[asyncio.Task[Any]] = set()  # sends not handed to aiokafka yet
        self._closed = False
        if bridge.on_loop():
            self._started: asyncio.Future[Any] = self._loop.create_task(self._start(settings))
        else:
            self._started = bridge.wait(self._start_now(settings), timeout, "connecting the aiokafka producer")

    async def _start(self, settings: dict[str, Any]) -> None:
        self._raw = await started(AIOKafkaProducer(**settings), "connecting the aiokafka producer")

    async def _start_now(self, settings: dict[str, Any]) -> "asyncio.Future[Any]":
        await self._start(settings)
        done: asyncio.Future[Any] = self._loop.create_future()
        done.set_result(None)
        return done

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
             headers: Any = None) -> Delivery:
        """Queue a record; its :class:`~kmq.client.api.Delivery` is answered with aiokafka's
        ``RecordMetadata`` or kmq's :class:`~kmq.client.errors.ProduceFailed`."""
        answer = Delivery()
        if self._closed:
            answer.failure(ProduceFailed("the aiokafka producer is closed"))
            return answer
        args = (answer, topic, value, key, partition, list(headers) if headers else None)
        if self._bridge.on_loop():
            self._spawn(*args)
        else:
            try:
                self._loop.call_soon_threadsafe(self._spawn, *args)
            except RuntimeError as exc:  # the loop is closed
                answer.failure(ProduceFailed(f"the aiokafka producer's event loop is closed: {exc}"))
        return answer

    def _spawn(self, *args: Any) -> None:
        task = self._loop.create_task(self._send(*args))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, answer: Delivery, topic: str, value: bytes | None, key: bytes | None,
                    partition: int | None, headers: list | None) -> None:
        try:
            if self._raw is None:
                await self._started
            assert self._raw is not None
            fut = await self._raw.send(topic, value=value, key=key, partition=partition, headers=headers)
        except Exception as exc:  # noqa: BLE001 - refused before it left: this record's answer
            answer.failure(produce_error(exc))
            return
        fut.add_done_callback(lambda f: _answer(answer, f))

    async def _flush(self) -> None:
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        if self._raw is not None:
            await self._raw.flush()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent so far is answered (from another thread than the loop's)."""
        if self._bridge.on_loop():
            return  # the answers come on this loop: the caller reads them later
        try:
            self._bridge.wait(self._flush(), timeout, "flushing the aiokafka producer")
        except ProduceFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - a timeout or a closed loop: kmq's class for callers
            raise ProduceFailed(f"flushing the aiokafka producer: {exc}") from exc

    def close(self, timeout: float = 5.0) -> None:
        """Close within about ``timeout`` seconds, pending records or not (on the loop: in the background)."""
        if self._closed:
            return
        self._closed = True

        async def stop() -> None:
            try:
                await asyncio.wait_for(self._flush(), timeout)
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                log.debug("flushing the aiokafka producer before closing: %s", exc)
            if self._raw is None and not self._started.done():
                self._started.cancel()
            raw, self._raw = self._raw, None
            if raw is not None:
                await raw.stop()

        if self._bridge.on_loop():
            self._loop.create_task(stop())
        elif not self._loop.is_closed():
            self._bridge.wait(stop(), timeout + 5.0, "closing the aiokafka producer")


def _answer(answer: Delivery, fut: "asyncio.Future[Any]") -> None:
    if fut.cancelled():
        answer.failure(ProduceFailed("the send was cancelled (the producer closed)"))
    elif fut.exception() is not None:
        answer.failure(produce_error(fut.exception()))  # type: ignore[arg-type]  # not None: checked
    else:
        answer.success(fut.result())
