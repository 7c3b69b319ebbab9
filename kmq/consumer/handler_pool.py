"""The worker pool behind :meth:`KmqConsumer.run <kmq.consumer.consumer.KmqConsumer.run>`.

A message is taken from the consumer only when one of the ``workers``
threads is free to start it: a message in a pool queue would have its lease
running while nothing works on it (with a backlog, that is how leases ran
out in the worker's own queue and copies piled up). With tracing on, the
message's delivery span is current while its handler runs.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Protocol

from kmq.core.message import KmqMessage
from kmq.core.outcome import HandlerOutcome, OutcomeRule, RejectOn, settle
from kmq.telemetry.tracing import current

__all__ = ["run_handlers", "MessageSource"]

log = logging.getLogger(__name__)


class MessageSource(Protocol):
    """What the pool needs of a consumer (:class:`~kmq.consumer.consumer.KmqConsumer` is one)."""

    queue: Any
    batch_size: int

    @property
    def stopping(self) -> bool: ...

    def raise_error(self) -> None: ...

    def poll(self, timeout: float = ..., max_records: int | None = ...) -> list[KmqMessage]: ...


def run_handlers(consumer: MessageSource, handler: Callable[[KmqMessage], Any], workers: int,
                 poll_timeout: float, reject_on: RejectOn = ()) -> None:
    """Call ``handler(msg)`` on ``workers`` threads until ``consumer`` is stopped or closed.

    The end of a handler settles its message by :class:`~kmq.core.outcome.OutcomeRule`:
    return acks (unless the handler settled it), an exception of ``reject_on`` rejects
    (DLQ), any other exception nacks with the queue's backoff for the delivery count.
    Running handlers finish on stop; the fetcher's error is raised once ready messages
    are used up."""
    rule = OutcomeRule(consumer.queue.backoff.delay, reject_on)
    slots = threading.Semaphore(max(1, workers))

    def call(msg: KmqMessage) -> None:
        try:
            try:
                if msg._span is None:
                    handler(msg)
                else:  # tracing on: the handler's own spans are children of the delivery's
                    with current(msg._span):
                        handler(msg)
            except Exception as exc:
                outcome: HandlerOutcome | None = rule.failed(exc, msg.delivery_count)
            else:
                outcome = rule.returned(msg.outcome is not None)
            settle(msg, outcome)
        finally:
            slots.release()

    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=f"kmq-worker-{consumer.queue.name}")
    try:
        while not consumer.stopping:
            if not slots.acquire(timeout=poll_timeout):
                consumer.raise_error()  # every worker busy: still surface a failed fetcher
                continue
            if consumer.stopping:  # stopped while waiting for a worker
                slots.release()
                break
            free = 1
            while free < consumer.batch_size and slots.acquire(blocking=False):
                free += 1
            try:
                msgs = consumer.poll(timeout=poll_timeout, max_records=free)
            except BaseException:
                for _ in range(free):
                    slots.release()
                raise
            for _ in range(free - len(msgs)):
                slots.release()
            for msg in msgs:
                pool.submit(call, msg)
    finally:
        pool.shutdown(wait=True)
