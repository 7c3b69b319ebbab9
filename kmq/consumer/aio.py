"""asyncio API: :class:`AsyncKmqConsumer`, the threaded consumer bridged to an event loop.

::

    async with AsyncKmqConsumer(cfg, queue="orders") as consumer:
        async for msg in consumer:
            await handle(msg.value)
            await msg.ack()

    # or coroutine handlers, N at a time (return = ack, exception = nack with backoff):
    async with AsyncKmqConsumer(cfg, queue="orders") as consumer:
        await consumer.run(handle, concurrency=16)

Design (docs/protocol.md, "asyncio"): this is :class:`~kmq.consumer.consumer.KmqConsumer`
driven from the loop through its public API. With ``kafka.client: aiokafka`` it is a
:class:`~kmq.consumer.loop_driver.LoopConsumer` instead, whose fetcher step runs on the loop
itself (no fetcher thread; waiting takes await the driver's hand-overs); the rest below holds
for both, but for the fetching that is said to stay on the consumer's threads.
Fetching, START markers, commits, flow control, cooperative rebalances, lease
keeping and outage ride-through all stay on the consumer's own threads, so they
behave exactly as for the threaded API and on every ``kafka.client``. What the
loop calls:

* ``poll(timeout=0)`` inline: it only takes what the fetcher already made
  ready (a short ``threading.Condition`` section, never Kafka I/O);
* ``poll(timeout=...)`` when nothing is ready, on a dedicated thread
  (``run_in_executor``), so waiting for the broker never blocks the loop;
* settlements (``ack``/``nack``/``reject``/``renew``/``abandon``) inline: they
  append to the ack buffer under the writer's lock, which every holder keeps
  for memory operations only (the flusher drains under it, the marker write
  happens after releasing it);
* construction and :meth:`~kmq.consumer.consumer.KmqConsumer.close` (topic check,
  connections, the commit-back of never-handed messages) on a thread.

Messages are taken when a coroutine is waiting for one (``async for``) or a
handler slot is free (:meth:`AsyncKmqConsumer.run`); while the coroutines keep
up with a backlog, a few at a time, as the threaded iteration does
(:mod:`kmq.consumer.take_ahead`: one lock per message cost the loop more than
the rest of its per-message work), so messages never wait behind slow handlers
for long. Whatever no coroutine took is given back to the group by ``close``
with the same delivery count, like every message the consumer made ready.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from typing import Any, Awaitable, Callable

from kmq.client.loop import loop_clients, on_loop
from kmq.config import Config
from kmq.core.errors import KmqError
from kmq.consumer.consumer import KmqConsumer
from kmq.consumer.aio_message import AsyncKmqMessage, wrap
from kmq.consumer.loop_driver import LoopConsumer
from kmq.consumer.take_ahead import HOLD, MOST
from kmq.core.errors import MessageAlreadySettled
from kmq.core.message import KmqMessage
from kmq.core.outcome import OutcomeRule, RejectOn, settle
from kmq.telemetry.metrics import ConsumerMetrics
from kmq.telemetry.tracing import current

__all__ = ["AsyncKmqConsumer", "AsyncKmqMessage"]

log = logging.getLogger(__name__)

AsyncHandler = Callable[["AsyncKmqMessage"], Awaitable[Any]]
# A wrapper made without the class call where one is made per message (as aio_message.wrap does).
_new_wrapper = object.__new__


class AsyncKmqConsumer:
    """Consume a queue with individual acknowledgements from asyncio code.

    :param cfg: the kmq configuration (group from ``consumer.group_id``).
    :param queue: queue name (default: the only configured queue).
    :param batch_size: most messages :meth:`run` takes at once (``KmqConsumer``'s ``batch_size``).
    :param metrics: :class:`~kmq.telemetry.metrics.ConsumerMetrics` to record into.
    :param poll_timeout: seconds a waiting poll blocks its thread before looking at
        stop/cancel again (it never blocks the loop).
    :param consumer: the threaded consumer to drive, already built (default: none, a
        :class:`~kmq.consumer.consumer.KmqConsumer` is built at :meth:`start`). Given, this one is
        started already and closes it with itself; it needs what this class calls of a
        ``KmqConsumer``: ``poll``, ``take_chunk``, ``ahead``, ``stop``, ``stopping``, ``close``.
    :param consumer_kwargs: further keyword arguments for :class:`~kmq.consumer.consumer.KmqConsumer`.

    Nothing connects until ``async with`` (or :meth:`start`); the Kafka work
    happens on the consumer's threads. Works with every ``kafka.client``.
    """

    #: Seconds an ``async for`` over ready messages (or ``run()``'s workers together) may go without
    #: letting other tasks run. Measured side by side (docs/benchmarks.md, asyncio): 1 ms instead
    #: of 5 ms shortened ``async for``'s largest loop gap (median 29.5 -> 21.9 ms), at the same
    #: throughput; ``run()``'s largest gap is set by something else.
    YIELD_EVERY = 0.001

    def __init__(self, cfg: Config, queue: str | None = None, *, batch_size: int = 500,
                 metrics: ConsumerMetrics | None = None, poll_timeout: float = 0.5, consumer: Any = None,
                 **consumer_kwargs: Any) -> None:
        self.cfg = cfg
        self._queue_name = queue
        self._kwargs = dict(consumer_kwargs, batch_size=batch_size, metrics=metrics)
        self.poll_timeout = poll_timeout
        self._consumer: KmqConsumer | None = consumer  # once started
        # The construction under way (on a thread), shared by concurrent start() and close() calls.
        self._starting: asyncio.Future[Any] | None = None
        # Orders _closed against the construction thread's hand-over of the consumer it built.
        self._state_lock = threading.Lock()
        # One thread for waiting polls: the consumer hands batches to one taker at a time anyway.
        self._poller = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kmq-aio-poll")
        self._closed = False
        self._yielded_at = 0.0
        # Ready messages taken for the loop a few at a time (one ready batch's), handed out one by one
        # with a popleft: on the loop alone, so no lock per message (kmq.consumer.take_ahead's rule
        # for how many); their batch's lease start and generation, for giving them back on close.
        self._taken: deque[KmqMessage] = deque()
        self._taken_batch: tuple[float, int] = (0.0, 0)
        self._take_size = 1
        self._took_at = -HOLD - 1.0
        # run() calls under way (their end, the task running them): close() lets them drain first.
        self._runs: dict[asyncio.Future[Any], asyncio.Task[Any] | None] = {}

    # ------------------------------------------------------------ lifecycle
    @property
    def consumer(self) -> KmqConsumer:
        """The underlying :class:`~kmq.consumer.consumer.KmqConsumer` (after :meth:`start`)."""
        if self._consumer is None:
            raise KmqError("the AsyncKmqConsumer is not started: use 'async with' or 'await consumer.start()'")
        return self._consumer

    async def start(self) -> "AsyncKmqConsumer":
        """Create the threaded consumer off the loop (it checks the topics and connects).

        Concurrent calls share one construction. :meth:`close` during it closes the consumer
        as soon as it is built (this call then raises :class:`~kmq.core.errors.KmqError`);
        cancelling this call closes the AsyncKmqConsumer the same way, so a cancelled
        ``async with`` leaves no consumer in the group."""
        with self._state_lock:
            if self._closed:
                raise KmqError("the AsyncKmqConsumer is closed")
            if self._consumer is not None:
                return self
            if self._starting is None or self._starting.done():  # none yet, or the last one failed: try again
                loop = asyncio.get_running_loop()
                self._starting = loop.run_in_executor(None, self._build, loop)
                # Its error reaches the start() calls awaiting it; retrieved here for when none is left.
                self._starting.add_done_callback(lambda f: f.cancelled() or f.exception())
            starting = self._starting
        try:
            # Shielded: a cancelled start() must not cancel a construction another caller awaits.
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            self._close_when_built()
            raise
        if isinstance(self._consumer, LoopConsumer):
            self._consumer.drive()  # its fetcher step runs on this loop from now on (once)
        return self

    def _build(self, loop: asyncio.AbstractEventLoop) -> Any:
        """Construct the consumer (on a thread) and hand it over, unless this was closed meanwhile:
        then close it here, so no consumer outlives the AsyncKmqConsumer. ``kafka.client:
        aiokafka``: a :class:`~kmq.consumer.loop_driver.LoopConsumer` whose clients live on ``loop``."""
        if on_loop(self.cfg):
            cfg, clients = loop_clients(self.cfg, loop)
            consumer: KmqConsumer = LoopConsumer(cfg, self._queue_name, clients=clients, **self._kwargs)
        else:
            consumer = KmqConsumer(self.cfg, self._queue_name, **self._kwargs)
        with self._state_lock:
            if not self._closed:
                self._consumer = consumer
                return consumer
        consumer.close()
        raise KmqError("the AsyncKmqConsumer was closed while it was starting; its consumer is closed")

    def _close_when_built(self) -> None:
        """A cancelled start(): close now; the consumer under construction is closed once built."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            consumer = self._consumer
        if consumer is not None:  # built just before the cancellation arrived
            consumer.stop()
            closing = asyncio.get_running_loop().run_in_executor(None, consumer.close)
            closing.add_done_callback(_log_close_failure)
        self._poller.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncKmqConsumer":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stop(self) -> None:
        """Make ``async for`` and :meth:`run` end (running handlers finish); safe from signal handlers."""
        if self._consumer is not None:
            self._consumer.stop()

    async def close(self, timeout: float | None = None) -> None:
        """Stop, give never-handed messages back to the group (same delivery count), leave the
        group and flush pending settlements; the blocking part runs off the loop. Unsettled
        handed-over messages stay in flight: the tracker redelivers them when their leases end."""
        with self._state_lock:
            already, self._closed = self._closed, True
            consumer, starting = self._consumer, self._starting
        if consumer is None:
            self._poller.shutdown(wait=False)
            if starting is not None and not starting.done():
                # Being built: the construction thread sees _closed and closes it; wait for that
                # (also after a cancelled start), so nothing is left running when close() returns.
                await asyncio.wait([starting])
            return
        if already:
            return
        consumer.stop()  # a waiting poll returns at once
        self._keep_taken(consumer)  # _closed is set: nothing takes from them any more
        me = asyncio.current_task()
        others = [end for end, task in self._runs.items() if task is not me]
        loop = asyncio.get_running_loop()

        def close_all() -> None:
            # Its waiting polls done (what one returned to a cancelled waiter is kept by the consumer),
            # the consumer's close gives back whatever was taken ahead and never handed out.
            self._poller.shutdown(wait=True)
            consumer.close(timeout)

        try:
            if others:
                # close() from another task while run() drains: settlements of its handlers must
                # still reach the writer before it closes.
                await asyncio.wait(others)
        finally:
            # Also when cancelled while waiting; shielded: a second cancellation must not leave
            # the close half done (it goes on in its thread).
            await asyncio.shield(loop.run_in_executor(None, close_all))

    @property
    def stopping(self) -> bool:
        """:meth:`stop` or :meth:`close` was called."""
        return self._closed or (self._consumer is not None and self._consumer.stopping)

    # ------------------------------------------------------------ taking messages
    async def _take(self, max_records: int) -> list[KmqMessage]:
        """Up to ``max_records`` messages, waiting (off the loop) at most ``poll_timeout``; [] if none."""
        consumer = self.consumer
        handed = getattr(consumer, "handed", None)  # on the loop: the driver sets it (kmq.consumer.loop_driver)
        if handed is not None:
            handed.clear()
        # Memory only: what an iteration took ahead, else what the fetcher made ready.
        ready = consumer.poll(timeout=0, max_records=max_records)
        if ready or consumer.stopping:
            return ready
        if handed is not None:  # no thread: wait on the loop for the driver's next hand-over
            try:
                await asyncio.wait_for(handed.wait(), self.poll_timeout)
            except TimeoutError:
                return []
            return consumer.poll(timeout=0, max_records=max_records)
        fut = self._poller.submit(consumer.take_chunk, self.poll_timeout, max_records)
        try:
            return (await asyncio.wrap_future(fut))[0]
        except asyncio.CancelledError:
            # The poll thread cannot be interrupted: keep what it returns for the next taker (or close).
            fut.add_done_callback(self._keep_late)
            raise

    def _ready_one(self) -> KmqMessage | None:
        """A message ready now (memory only, no wait), None when none is or once stopping."""
        # Once per message: :attr:`stopping` and :attr:`consumer` spelled out (each property a call).
        c = self._consumer
        if c is None or self._closed or c.stopping:
            return None
        if self._taken:
            c.ahead.takes += 1  # the taker is alive (consumer.max_poll_interval), as TakeAhead.next counts
            return self._taken.popleft()
        if c.ahead:  # what a cancelled waiting poll brought (_keep_late) or an earlier iteration held
            return c.ahead.next(0)
        # Twice the last take if it was used up within HOLD (the loop keeps up), else one message.
        now = time.monotonic()
        n = self._take_size = min(2 * self._take_size, MOST) if now - self._took_at <= HOLD else 1
        msgs, leased_at, gen = c.take_chunk(0, n)
        self._took_at = time.monotonic()
        if len(msgs) > 1:
            self._taken.extend(msgs[1:])  # used up before the next take: one batch at a time
            self._taken_batch = (leased_at, gen)
        return msgs[0] if msgs else None

    def _keep_taken(self, consumer: Any) -> None:
        """Closing (on the loop): the messages taken and never handed out go to the consumer's
        take-ahead, whose close gives them back to the group with the rest (same delivery count)."""
        if self._taken:
            msgs = list(self._taken)
            self._taken.clear()
            consumer.ahead.keep(msgs, *self._taken_batch)

    def _keep_late(self, fut: concurrent.futures.Future[Any]) -> None:
        # On the poll thread: what it returned after its waiter was cancelled, for the next taker (or close).
        if not fut.cancelled() and fut.exception() is None:
            self.consumer.ahead.keep(*fut.result())

    def __aiter__(self) -> "AsyncKmqConsumer":
        return self

    async def __anext__(self) -> AsyncKmqMessage:
        """The next message (START written, offsets committed) until :meth:`stop` or :meth:`close`.
        Raises the fetcher's error (e.g. :class:`~kmq.core.errors.MarkerWriteError`) when it fails."""
        # With a backlog every message is ready at once and this never suspends: give other
        # tasks a turn every YIELD_EVERY seconds, or an `async for` over a backlog starves them.
        if time.monotonic() - self._yielded_at >= self.YIELD_EVERY:
            await asyncio.sleep(0)
            self._yielded_at = time.monotonic()
        taken = self._taken
        if taken and not self._closed and not self._consumer.stopping:  # type: ignore[union-attr]  # taken: started
            self._consumer.ahead.takes += 1  # type: ignore[union-attr]  # as in _ready_one, spelled out (per message)
            m: KmqMessage | None = taken.popleft()
        else:
            m = self._ready_one()  # a backlog: no coroutine of _take's per message
        if m is not None:
            w = _new_wrapper(AsyncKmqMessage)  # _wrap inlined: once per message
            w.message = m
            return w
        while not self.stopping:
            got = await self._take(1)
            if got:
                return wrap(got[0])
            self._yielded_at = time.monotonic()  # _take waited off the loop: others had their turn
        raise StopAsyncIteration

    # ------------------------------------------------------------ handler pool
    async def run(self, handler: AsyncHandler, concurrency: int = 1, *,
                  reject_on: RejectOn = (),
                  drain_timeout: float | None = None) -> None:
        """Await ``handler(msg)`` for up to ``concurrency`` messages at once until :meth:`stop`.

        The same semantics as :meth:`KmqConsumer.run <kmq.consumer.consumer.KmqConsumer.run>`: a
        message is taken when a handler slot is free (a few at a time while the handlers keep
        up with a backlog, :mod:`kmq.consumer.take_ahead`); return acks (unless the handler
        settled it), an exception nacks with the queue's backoff for the delivery count, one
        of ``reject_on`` rejects (DLQ) as ``@kmq.marked`` does. Automatic lease renewal
        (``consumer.auto_renew``) keeps running handlers' leases; a handler that never
        returns is bounded by its lease. When the loop ends (stop, cancellation or an error),
        running handlers are awaited up to ``drain_timeout`` seconds (default: the queue's
        lease, after which the tracker redelivers them anyway), then cancelled and their
        messages left to their leases (no marker). Cancelling ``run()`` does the same and
        re-raises; messages not taken yet are given back to the group by :meth:`close`.
        """
        consumer = self.consumer
        pool = _HandlerPool(handler, OutcomeRule(consumer.queue.backoff.delay, reject_on), max(1, concurrency),
                            self._ready_one, self.stop)
        ended = asyncio.get_running_loop().create_future()
        self._runs[ended] = asyncio.current_task()
        try:
            # Workers take ready messages themselves; this loop waits (off the loop) for the
            # messages that were not ready when workers went idle, and hands them over.
            while not self.stopping:
                if not pool.idle:
                    if not await pool.until_idle(self.poll_timeout):
                        consumer.raise_error()  # every slot busy: still surface a failed fetcher
                    continue
                pool.hand(await self._take(min(pool.idle, consumer.batch_size)))
        finally:
            try:
                pool.close()
                await _drain(pool.workers, consumer.queue.lease if drain_timeout is None else drain_timeout,
                             consumer.queue.name)
            finally:
                del self._runs[ended]
                ended.set_result(None)
        if pool.fatal:
            raise pool.fatal[0]


class _HandlerPool:
    """``size`` worker coroutines, each awaiting the handler for one message at a time.

    Long-lived workers rather than a task per message (creating, registering and finishing a
    task cost about as much loop time as a light handler itself). A worker that is free takes
    the next ready message itself, without suspending; when none is ready it goes idle and
    :meth:`hand` gives it one that :meth:`AsyncKmqConsumer.run` waited for. Either way a message
    is taken by a free worker (with a few more while workers keep up, :mod:`kmq.consumer.take_ahead`):
    it never waits for one behind slow handlers."""

    def __init__(self, handler: AsyncHandler, rule: OutcomeRule, size: int,
                 ready_one: Callable[[], KmqMessage | None], stop: Callable[[], None]) -> None:
        self._handler = handler
        self._rule = rule
        self._ready_one = ready_one
        self._stop = stop
        #: Idle workers, each waiting on its future for a message (None: end).
        self._idle: deque[asyncio.Future[KmqMessage | None]] = deque()
        self._idle_waiter: asyncio.Future[bool] | None = None
        self._closing = False
        # The workers' shared turn on the loop: they run ready messages back to back for at most
        # YIELD_EVERY, then all of them yield until the loop has run everything else once.
        self._turn_began = time.monotonic()
        self._turn_over = False
        #: SystemExit, KeyboardInterrupt and the like raised by a handler, or the fetcher's error
        #: met by a worker taking a message (they end run()).
        self.fatal: list[BaseException] = []
        self.workers: set[asyncio.Task[None]] = {asyncio.create_task(self._work(), name=f"kmq-handler-{i}")
                                           for i in range(size)}
        for task in self.workers:
            task.add_done_callback(self._ended)

    @property
    def idle(self) -> int:
        """Workers waiting for :meth:`hand`."""
        return len(self._idle)

    def hand(self, msgs: list[KmqMessage]) -> None:
        """Give each message to an idle worker (at most :attr:`idle` of them)."""
        for m in msgs:
            self._idle.popleft().set_result(m)

    async def until_idle(self, timeout: float) -> bool:
        """Wait until a worker is idle (True) or ``timeout`` seconds passed (False)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._idle_waiter = waiter
        timer = loop.call_later(timeout, _resolve, waiter, False)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._idle_waiter = None

    def close(self) -> None:
        """Take nothing more: idle workers end now, busy ones after their handler."""
        self._closing = True
        while self._idle:
            self._idle.popleft().set_result(None)

    def _turn_spent(self) -> bool:
        """Whether the workers' turn is over (or just ended): they yield before the next message."""
        if not self._turn_over and time.monotonic() - self._turn_began >= AsyncKmqConsumer.YIELD_EVERY:
            # Handlers that never suspend over a backlog would starve every other task. One budget
            # for all workers: a worker each would give the loop's other tasks a turn only after
            # every worker had used its own (16 workers: 80 ms).
            self._turn_over = True
            # Queued behind the workers' wake-ups: runs once the loop has had its round.
            asyncio.get_running_loop().call_soon(self._new_turn)
        return self._turn_over

    async def _next(self) -> KmqMessage | None:
        """This worker's next message: a ready one taken now, else one handed to it; None: end."""
        if self._turn_spent():
            while self._turn_over:  # a worker woken before the next turn began waits for it
                await asyncio.sleep(0)
        if self._closing:
            return None
        m = self._ready_one()
        if m is not None:
            return m
        return await self._handed()

    async def _handed(self) -> KmqMessage | None:
        """Idle until :meth:`hand` gives this worker a message (None: end)."""
        fut: asyncio.Future[KmqMessage | None] = asyncio.get_running_loop().create_future()
        self._idle.append(fut)
        if self._idle_waiter is not None:
            _resolve(self._idle_waiter, True)
        return await fut

    def _new_turn(self) -> None:
        self._turn_over = False
        self._turn_began = time.monotonic()

    async def _work(self) -> None:
        handler, rule, ready_one = self._handler, self._rule, self._ready_one
        new = _new_wrapper
        while True:
            # _next's common case inlined (no coroutine per message): the turn goes on, a message is ready.
            m = None if self._turn_spent() or self._closing else ready_one()
            if m is None:
                m = await self._next()
                if m is None:
                    return
            w = new(AsyncKmqMessage)
            w.message = m
            try:
                if m._span is None:
                    await handler(w)
                else:  # tracing on: current in this task (a context variable) while the handler runs
                    with current(m._span):
                        await handler(w)
            except Exception as exc:  # CancelledError is not: a cancelled handler leaves its message to the lease
                settle(m, rule.failed(exc, m.delivery_count))
            else:
                if m._outcome is None:  # rule.returned and settle's ack, inlined: once per message
                    try:
                        m.ack()
                    except MessageAlreadySettled:  # settled by another task meanwhile: that one stands
                        pass

    def _ended(self, task: asyncio.Task[Any]) -> None:
        # A handler's BaseException (or the fetcher's error) ends its worker and run() (after the
        # drain), as it would end a plain loop; a handler's ordinary exceptions were settled by _work.
        if not task.cancelled() and task.exception() is not None:
            self.fatal.append(task.exception())  # type: ignore[arg-type]  # not None: checked above
            self._stop()
            if self._idle_waiter is not None:
                _resolve(self._idle_waiter, True)


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


def _log_close_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("closing the consumer of a cancelled start failed: %s", fut.exception())


async def _drain(tasks: set[asyncio.Task[Any]], timeout: float, queue: str) -> None:
    """Await running handlers up to ``timeout`` seconds, then cancel the rest (their messages
    stay unsettled: the tracker redelivers them when their leases end)."""
    if not tasks:
        return
    pending = set(tasks)
    try:
        _, pending = await asyncio.wait(pending, timeout=timeout)
    finally:
        # Also reached when the drain itself is cancelled (a second cancel): never orphan handlers.
        if pending:
            log.warning("%s: %d handler(s) still running after %gs; cancelled, their messages are left to their "
                        "leases (the tracker redelivers them)", queue, len(pending), timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
