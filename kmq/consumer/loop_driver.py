"""The consumer on the event loop: the fetcher step driven by an asyncio task, no fetcher thread.

``kafka.client: aiokafka`` (:mod:`kmq.client.loop`): :class:`LoopConsumer` is a
:class:`~kmq.consumer.consumer.KmqConsumer` whose fetcher step
(:class:`~kmq.consumer.fetcher.Fetcher`, the pure :class:`~kmq.consumer.fetch_pipeline.FetchPipeline`'s
I/O shell) runs on the application's event loop, on a group member whose fetch is awaited there
(aiokafka's). Each turn is the fetcher thread's turn, in the same order: the STARTs and the commit
Kafka answered and the time (:meth:`Fetcher.answers <kmq.consumer.fetcher.Fetcher.answers>`),
the leases (renewals of held messages, ends of handed ones), then one poll within the room flow
control gives, the rebalance callbacks that ran during it, then its records. Awaiting the poll
is where the loop runs everything else; while no poll is due (no room, batches waiting for an
answer) the task sleeps a moment instead.

Ready messages, settlements, leases, the marker writer (its flusher thread sends through the
loop's producer) and closing are the threaded consumer's. Closing runs on a worker thread
(:meth:`~kmq.consumer.consumer.KmqConsumer.close`): the driver ends its loop, gives the
never-handed messages back there (the commit back goes through the loop), then leaves the group.
Not applied here: ``consumer.max_poll_interval`` (the member stays in the group while the
application takes nothing; its messages wait ready, their leases held).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import replace
from typing import Any

from kmq.consumer.consumer import KmqConsumer
from kmq.consumer.fetch_pipeline import HandOver
from kmq.consumer.fetcher import Fetcher, FetcherParts
from kmq.core.errors import KmqError

__all__ = ["LoopConsumer", "LoopFetcher"]

log = logging.getLogger(__name__)


class LoopFetcher(Fetcher):
    """The fetcher step with its poll awaited (the group member's ``afetch``). The rest after a seek
    back (a broker outage) is not waited here, on the loop: it is noted (:attr:`rest_due`) and the
    driver awaits it."""

    def __init__(self, parts: FetcherParts, consumer: Any) -> None:
        super().__init__(replace(parts, rest=self._rest_later), consumer)
        #: Seconds the driver rests before its next turn (a seek back asked for it), 0: none.
        self.rest_due = 0.0

    def _rest_later(self, seconds: float) -> None:
        self.rest_due = max(self.rest_due, seconds)

    async def apoll(self, room: int, held: int = 0) -> float:
        """:meth:`Fetcher.poll <kmq.consumer.fetcher.Fetcher.poll>` on the loop: one poll as the
        pipeline decides, the rebalance callbacks that ran meanwhile, then its records. Returns the
        seconds to wait for settlements instead (nothing polled), else 0."""
        kc, pipeline = self.consumer, self.pipeline
        step = pipeline.next_poll(room, time.monotonic(), held)
        if step.wait:
            return step.wait
        self._apply_pauses(kc, all_paused=step.pause_all)
        records = await kc.afetch(min(step.timeout, self.parts.max_poll_wait), step.max_records, self.parts.build)
        self.feed_rebalances()  # they ran during that poll: its records belong to the assignment after them
        self.run(pipeline.polled(records, time.monotonic()))
        return 0.0


class _Ended:
    """What :meth:`KmqConsumer.close <kmq.consumer.consumer.KmqConsumer.close>` joins in place of the
    fetcher thread: the driver task's end, waited for from the closing thread."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def is_alive(self) -> bool:
        return not self.done.is_set()

    def join(self, timeout: float | None = None) -> None:
        self.done.wait(timeout)


class LoopConsumer(KmqConsumer):
    """A :class:`~kmq.consumer.consumer.KmqConsumer` on the event loop (see the module docstring):
    built off the loop (``clients`` from :func:`kmq.client.loop.loop_clients`), then :meth:`drive`
    starts it on the loop. ``handed`` is set (on the loop) whenever messages became ready, the
    fetcher failed or the consumer stops: an asyncio taker waits on it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._step = LoopFetcher(self._step.parts, self._kc)
        self.handed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def _ensure_started(self) -> None:
        if self._closed:
            raise KmqError(f"the consumer of {self.queue.name} is closed")
        if self._fetcher is None:
            raise KmqError(f"the consumer of {self.queue.name} runs on an event loop: drive() it there first")

    def drive(self) -> None:
        """Start the driver task on the running loop (once)."""
        if self._task is not None:
            return
        self.handed = asyncio.Event()
        ended = _Ended()
        self._fetcher = ended  # type: ignore[assignment]  # joined by close() like the thread
        self._task = asyncio.get_running_loop().create_task(self._drive(ended), name=f"kmq-driver-{self.queue.name}")
        if self._keeper is not None:
            self._keeper.start()
        log.info("%s: fetching on the event loop (kafka.client: aiokafka), no fetcher thread", self.queue.name)

    def _hand_over(self, action: HandOver) -> None:
        super()._hand_over(action)
        if self.handed is not None:
            self.handed.set()

    def stop(self) -> None:
        super().stop()
        self._signal()

    def _fail(self, exc: BaseException) -> None:
        super()._fail(exc)
        self._signal()

    def _signal(self) -> None:
        """Wake an asyncio taker (from any thread)."""
        handed, task = self.handed, self._task
        if handed is None or task is None or task.done():
            return
        loop = task.get_loop()
        try:
            if _running_loop() is loop:
                handed.set()
            else:
                loop.call_soon_threadsafe(handed.set)
        except RuntimeError:  # the loop is closed: no taker left to wake
            pass

    async def _drive(self, ended: _Ended) -> None:
        """The fetcher thread's loop (:meth:`KmqConsumer._fetch_loop
        <kmq.consumer.consumer.KmqConsumer._fetch_loop>`) as a task; closing in its ``finally``."""
        step, stop = self._step, self._stop
        assert isinstance(step, LoopFetcher)
        kc = self._kc
        loop = asyncio.get_running_loop()
        try:
            await kc.start()
            step.subscribe()
            while not stop.is_set():
                self._wake.clear()
                now = time.monotonic()
                step.answers(now)
                self._held.renew_due(self._pipeline.pending, self._ready, now)
                self._expire_leases(now)
                if step.rest_due:  # a seek back after a failed START: do not spin through an outage
                    rest, step.rest_due = step.rest_due, 0.0
                    await asyncio.sleep(rest)
                    continue
                wait = await step.apoll(*self._room(time.monotonic()))
                if wait:
                    await asyncio.sleep(wait)
        except Exception as exc:
            self._fetch_failed(exc)
        finally:
            try:
                # On a worker thread: the commit back waits for its answer, which comes on this loop.
                await loop.run_in_executor(None, self._give_back_unhanded)
            except Exception as exc:  # noqa: BLE001 - leave the group whatever happened
                log.warning("%s: giving never-handed messages back failed: %s", self.queue.name, exc)
            finally:
                try:
                    await kc.aclose()
                except Exception as exc:  # noqa: BLE001 - closing is best effort
                    log.warning("closing the Kafka consumer of %s failed: %s", self.queue.name, exc)
                ended.done.set()
                if self.handed is not None:
                    self.handed.set()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
